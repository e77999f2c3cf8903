"""Street types from postal standards, shipped as data (`hybridllm/guard/data/`), for the address
rule of `privacy_ner_rules`:

- `usps_street_suffixes.tsv`: USPS Publication 28, Appendix C1 (every standard US street suffix,
  its common spellings and its standard abbreviation);
- `uk_thoroughfares.tsv`: UK thoroughfare descriptors as in Royal Mail's address file;
- `fr_types_de_voie.tsv`: French street types and their AFNOR XP Z10-011 abbreviations.

Each file names its source in its header. `street_types` gives a regex alternation of the English
(US and UK) suffixes in the cases an address writes them: the common types ("street", "rd",
"avenue") in any case, the rest capitalised or in capitals ("Trail", "TRL", "Xing"), since many
of them are ordinary words too ("way", "run", "is", "via").
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

# types and abbreviations a prompt writes in lower case too ("42 baker street", "12 main st")
ANY_CASE = frozenset(
    "street st road rd avenue ave lane ln boulevard blvd drive dr court ct terrace crescent "
    "parkway pkwy highway hwy mews gardens grove square sq".split()
)


def _rows(name: str) -> list[list[str]]:
    text = resources.files("hybridllm.guard").joinpath("data", name).read_text(encoding="utf-8")
    return [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]


@lru_cache(maxsize=1)
def english_types() -> frozenset[str]:
    """Every US (USPS C1) and UK street suffix and abbreviation, lower case."""
    words: set[str] = set()
    for row in _rows("usps_street_suffixes.tsv"):
        words.update(w.lower() for cell in row for w in cell.split())
    for row in _rows("uk_thoroughfares.tsv"):
        words.update(w.lower() for cell in row for w in cell.split())
    return frozenset(words)


@lru_cache(maxsize=1)
def french_types() -> tuple[frozenset[str], frozenset[str]]:
    """(French street types as written in prose, their standard abbreviations), lower case."""
    rows = _rows("fr_types_de_voie.tsv")
    return frozenset(r[0] for r in rows), frozenset(r[1].lower() for r in rows if len(r[1]) > 1)


def cased(words: frozenset[str], any_case: frozenset[str] = ANY_CASE) -> str:
    """A regex alternation of `words`: those in `any_case` in any case, the others capitalised
    or in capitals; longest first (so "streets" is tried before "street")."""
    out = []
    for w in sorted(words, key=lambda w: (-len(w), w)):
        if w in any_case:
            out.append("".join(f"[{c}{c.upper()}]" if c.isalpha() else re.escape(c) for c in w))
        else:
            out.append(f"{re.escape(w.capitalize())}|{re.escape(w.upper())}")
    return "|".join(out)


def street_types() -> str:
    """The English street types as a regex alternation (see the module's docstring)."""
    return cased(english_types())


def french_street_types() -> str:
    """The French types in any case, and their abbreviations capitalised or in capitals."""
    names, abbreviations = french_types()
    return cased(names, any_case=names) + "|" + cased(abbreviations, any_case=frozenset({"bd"}))
