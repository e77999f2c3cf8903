"""Email addresses given in pieces with words between them (hybridllm.guard.privacy_split, run by
every `privacy.scan`): the issue-31 leak ("starts with jane.doe", another turn, "and ends with
@example.org") is found at the domain's place with a redacted hint; a domain alone, decorators
and scoped packages, and dotted names in code are not."""

from __future__ import annotations

import pytest

from hybridllm.guard.privacy import kinds, scan
from hybridllm.guard.privacy_split import split_emails, split_numbers
from tests.privacy_corpus import SPLIT


def conversation(*texts: str) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


@pytest.mark.parametrize(("messages", "kind", "secrets"), SPLIT)
def test_the_corpus_splits_are_found(
    messages: list[dict[str, str]], kind: str, secrets: tuple[str, ...]
) -> None:
    found = scan(messages)
    assert kind in kinds(found)
    assert not any(secret in str(f) for f in found for secret in secrets)


def test_the_domain_is_where_the_address_is_completed() -> None:
    texts = [
        ("messages[0].content", "starts with jane.doe"),
        ("messages[2].content", "then @ex.org"),
    ]
    assert split_emails(texts) == [("messages[2].content", 5, 12)]
    (finding,) = scan(conversation("starts with jane.doe", "ok", "then @ex.org"))
    assert finding.hint == "email ***@*** (split)" and finding.location == "messages[2].content"


@pytest.mark.parametrize(
    "messages",
    [
        conversation("my mailbox is pedro1984", "Which provider?", "the domain is @correo.es"),
        conversation("Mon identifiant commence par marie.lefevre et le domaine est @orange.fr"),
        conversation("Mi usuario es lucia_mora", "¿Y el dominio?", "@telefonica.net"),
    ],
)
def test_other_wordings_and_languages(messages: list[dict[str, str]]) -> None:
    assert kinds(scan(messages)) == ("email",)


@pytest.mark.parametrize(
    "messages",
    [
        conversation("Block all mail from @spam-domain.com in the filter."),
        conversation("What does @dataclass do?", "It writes methods.", "And npm i @types/node?"),
        conversation("use os.path.join here", "ok", "emails to @example.com are test only"),
        conversation("Tickets by jsmith42 are closed.", "Fine.", "Tag @release.team on it."),
    ],
)
def test_a_domain_without_a_user_name_for_it_is_left_alone(
    messages: list[dict[str, str]],
) -> None:
    assert scan(messages) == ()


# ---- numbers given in pieces (split_numbers) -------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "kind"),
    [
        (conversation("Save my mobile, it starts 07911", "Go on.", "then 234567, thanks"), "phone"),
        (conversation("Mon portable commence par 06 45", "Oui ?", "puis 78 12 90"), "phone"),
        (conversation("Mi móvil empieza por 612", "¿Y?", "luego 345 678"), "phone"),
        (conversation("the card begins 4539 1488", "and?", "ends 9981 1003"), "card"),
        (conversation("my mobile is 07911", "ok", "234", "ok", "567"), "phone"),
    ],
)
def test_a_number_given_in_pieces_is_found_where_it_is_completed(
    messages: list[dict[str, str]], kind: str
) -> None:
    found = scan(messages)
    assert kind in kinds(found)
    splits = [f for f in found if f.origin == "split"]
    # the whole value is completed at the last piece (two pieces may already be a number)
    assert splits[-1].location == f"messages[{len(messages) - 1}].content"
    assert not any(c.isdigit() for f in splits for c in f.hint)


def test_a_piece_is_the_pattern_layers_reading_of_the_joined_digits() -> None:
    texts = [("a", "my mobile starts 07911"), ("b", "then 234567")]
    seen: list[tuple[str, bool]] = []

    def read(joined: str, about_phones: bool) -> list[tuple[str, int, int]]:
        seen.append((joined, about_phones))
        return [("phone", 0, len(joined))]

    assert split_numbers(texts, read) == [("phone", "b", 5, 11)]
    assert seen == [("07911 234567", True)]  # read as after the phone word "mobile"
    assert split_numbers([("a", "07911 234567 in one text")], read) == []
    assert len(seen) == 1  # one text with pieces: nothing joined, nothing read


@pytest.mark.parametrize(
    "messages",
    [
        # numbers with no cue and no talk of a number are never joined
        conversation("Bake at 180 for 25 minutes", "And then?", "Rest it 10 minutes"),
        conversation("The train leaves at 07 45", "And back?", "at 19 30"),
        # cued, but the joined digits are no valid identifier
        conversation("my number starts 12", "go on", "then 34"),
        conversation("order 2024", "ok", "then 2025"),
        # the pieces of one text are the per-text scan's (nothing split)
        conversation("Reference 07911 and 234567 are two order numbers"),
    ],
)
def test_pieces_that_are_no_identifier_are_left_alone(messages: list[dict[str, str]]) -> None:
    assert not [f for f in scan(messages) if f.origin == "split"]
