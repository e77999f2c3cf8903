"""Public figures (hybridllm.guard.privacy_public): the shipped list and how a name is compared
with it; with the real NER layer, plain questions about public figures are not flagged, while a
private person's name, a public name after a naming cue, and any name beside a private
identifier still are."""

from __future__ import annotations

import importlib.util

import pytest

from hybridllm.guard.privacy import kinds
from hybridllm.guard.privacy_ner import PrivacyScanner
from hybridllm.guard.privacy_public import (
    is_public_figure,
    names_public_figure,
    normalise,
    public_figures,
)
from tests.privacy_corpus import PUBLIC

HAS_NER = PrivacyScanner(ner="auto").deep if importlib.util.find_spec("spacy") else False


def test_names_are_compared_without_case_accents_titles_or_possessive() -> None:
    assert normalise("President Abraham Lincoln's") == "abraham lincoln"
    assert normalise("Napoléon  Bonaparte") == "napoleon bonaparte"
    assert normalise("Franklin D. Roosevelt") == "franklin d roosevelt"
    assert normalise("Jean-Paul Sartre") == "jean paul sartre"
    assert len(public_figures()) > 800
    for name in ("Queen Elizabeth II", "Martin Luther King Jr.", "Johann Wolfgang von Goethe"):
        assert is_public_figure(name), name
    assert not is_public_figure("Hannah Lindqvist")


@pytest.mark.parametrize(
    ("text", "span", "public"),
    [
        ("What did Marie Curie discover?", "What did Marie Curie", True),
        ("Summarise Albert Einstein's work.", "Summarise Albert Einstein's", True),
        ("I met Hannah Einstein yesterday.", "Hannah Einstein", False),  # one name word
        ("Write to Marie Curie Dupont today.", "Marie Curie Dupont", False),
        ("Ask Bob about Abraham Lincoln", "Bob about Abraham Lincoln", False),
    ],
)
def test_an_entity_with_extra_words_names_a_figure_only_when_they_are_not_names(
    text: str, span: str, public: bool
) -> None:
    start = text.index(span)
    assert names_public_figure(text, start, start + len(span)) is public


needs_ner = pytest.mark.skipif(not HAS_NER, reason="the privacy extra is not installed")


@needs_ner
@pytest.mark.parametrize("question", PUBLIC)
def test_questions_about_public_figures_are_not_flagged(question: str) -> None:
    assert PrivacyScanner(ner="on").scan(question) == ()


@needs_ner
@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Write a reference for Hannah Lindqvist, my former intern.", "person"),
        ("My neighbour Tom Hanks keeps parking on my drive.", "person"),  # a cue: a private person
        ("Remind Winston Churchill on 07400 123456 about the rota.", "phone"),  # an identifier
        ("Napoleon Bonaparte, born on 14 March 1987, needs a visa.", "date_of_birth"),
    ],
)
def test_private_names_and_any_name_beside_an_identifier_are_still_flagged(
    text: str, kind: str
) -> None:
    assert kind in kinds(PrivacyScanner(ner="on").scan(text))


def test_a_titled_name_is_not_kept_as_a_bare_first_name() -> None:
    # "Prince Harry" is on the list: the title stays with the name, so "Harry" alone is nobody
    assert is_public_figure("Prince Harry") and is_public_figure("Prince Harry's")
    assert not is_public_figure("Harry") and not is_public_figure("Diana")
    assert is_public_figure("President Lincoln's")  # a one-word entry keeps its bare form
