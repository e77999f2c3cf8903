"""Public figures, so that a question about a public figure's public life is not kept on the
device as if it held a private person's name (issue 31).

    is_public_figure("Abraham Lincoln")        # True
    is_public_figure("President Lincoln's")    # True: title and possessive dropped
    is_public_figure("Hannah Lindqvist")       # False: a name we do not know is private
    names_public_figure(text, start, end)      # the same for an NER span with extra words

The names come from `data/public_figures.txt` (its header names how it was made). A name is
compared without case, accents, dots, hyphens, a possessive "'s" and leading titles. The NER
layer (`privacy_ner`) drops a `person` finding that names a public figure unless a naming cue
stands before it ("my name is", "my neighbour", "Mme"): the person may share the name. Nothing
else is dropped, so a private identifier next to any name keeps the request local.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from importlib import resources

DATA = "public_figures.txt"
_TITLES = frozenset(
    "president presidente président king queen prince princess emperor empress general général "
    "general sir dame lord lady saint st pope pape papa dr doctor professor prof mr mrs ms "
    "chancellor kanzler kanzlerin premier prime minister senator sénateur reine roi empereur "
    "rey reina kaiser könig königin the la le el der die".split()
)
_SPACES = re.compile(r"[\s\-–.]+")
_POSSESSIVE = re.compile(r"['’]s$|['’]$")


def normalise(name: str, titles: bool = False) -> str:
    """Lower case, no accents, no dots or hyphens, no possessive, no leading titles (`titles`:
    kept)."""
    text = unicodedata.normalize("NFKD", name.strip())
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = _POSSESSIVE.sub("", text)
    words = [w for w in _SPACES.split(text) if w]
    while not titles and len(words) > 1 and words[0] in _TITLES:
        words = words[1:]
    return " ".join(words)


def _entry(name: str) -> str:
    """A list entry's key: without its titles, unless that leaves one word of a titled name
    ("Prince Harry" stays "prince harry": "harry" alone is anyone's first name)."""
    bare = normalise(name)
    return normalise(name, titles=True) if " " not in bare else bare


@lru_cache(maxsize=1)
def public_figures() -> frozenset[str]:
    """Every name and alias of the shipped list, normalised."""
    text = resources.files("hybridllm.guard").joinpath("data", DATA).read_text(encoding="utf-8")
    names: set[str] = set()
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            names.update(_entry(n) for n in line.split("|") if n.strip())
    return frozenset(names)


def is_public_figure(span: str) -> bool:
    """Whether `span` (a person entity's text) names a public figure of the list."""
    figures = public_figures()
    return normalise(span) in figures or normalise(span, titles=True) in figures


_WORD = re.compile(r"\S+")
_SENTENCE_END = tuple('.!?:;\n¿¡«"“(')


def names_public_figure(text: str, start: int, end: int, *, nouns: bool = False) -> bool:
    """Whether the entity `text[start:end]` is a public figure's name, give or take words the
    NER model took in with it: two or more of its words name one, and its other words are
    lower case or the sentence's first word ("What did Marie Curie", "Summarise Albert
    Einstein's"), or (`nouns`: German text, every noun capitalised) any words after the name
    ("Albert Einstein im Jahr"). One name word beside another capitalised one before it
    ("Hannah Einstein") is not."""
    words = [m.group(0) for m in _WORD.finditer(text, start, end)]
    if is_public_figure(" ".join(words)):
        return True
    first = not text[:start].rstrip() or text[:start].rstrip().endswith(_SENTENCE_END)
    for i in range(len(words)):
        for j in range(i + 2, len(words) + 1):
            if is_public_figure(" ".join(words[i:j])):
                rest = [(k, w) for k, w in enumerate(words) if k < i or (k >= j and not nouns)]
                if all(not w[:1].isupper() or (k == 0 and first) for k, w in rest):
                    return True
    return False
