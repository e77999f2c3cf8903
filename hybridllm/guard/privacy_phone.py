"""Phone numbers in every national format, found by Google's libphonenumber (its Python port
`phonenumbers`, which Presidio's phone recognizer uses too), before the guard's own patterns.

    finder = PhoneFinder(("GB", "FR"))       # regions tried for numbers written without "+"
    finder.find("Call Jane on 07400 123456", [(0, 36)])   # [(13, 25, "phone ***56")]

A number written with "+" or "00" is read in any region. A number written the national way
("07400 123456", "06 12 34 56 78", "030 1234567", "090-1234-5678") is read in each region of
`regions`: the user's locale first (`locale_regions`: $LC_ALL, $LC_TELEPHONE, $LANG), then
`DEFAULT_REGIONS`. A match must be a valid number of that region (the library's number plan,
not only its length) with its digits grouped as that region groups them (`STRICT_GROUPING`), so
that order numbers ("#123-456-7890"), dates and references ("ORD-2024-000123") are left alone;
a run of digits with no grouping at all ("0612345678") counts only in the first region (the
locale's, else the US), since some plan somewhere reads most ten-digit runs. Right after a word
that says a phone number follows ("mobile", "phone", "Handynummer", "téléphone", "móvil":
`PHONE_WORDS`, at most `CUE_CHARS` before it), a valid number counts however its digits are
grouped ("Meine Handynummer ist 0152 3381 9046", which German numbering groups "01523 3819046").
Numbers reserved for fiction (Ofcom's 07700 900xxx drama range, 555-01xx in North America) are
not valid numbers to the library; the guard's own patterns still read the 555 ones. Nor are
numbers with five equal digits in a row ("1000000007", a constant in code).

`phonenumbers` comes with the `hybridllm[privacy]` extra. Without it `PhoneFinder.available` is
False, `find` finds nothing, and the patterns of `privacy_rules` are the only phone rules.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache

from hybridllm.errors import InvalidArgumentError

# tried after the locale's own region: North America, the largest European markets, India,
# Brazil, Japan, Australia (a number is kept once one region reads it). Left to a locale that
# names them: China (its plan reads ten-digit constants such as "1000000007" as numbers) and
# Mexico (its 3-3-4 numbers are North American ones the NANP rules reject: "415-155-2671").
DEFAULT_REGIONS: tuple[str, ...] = tuple("US GB FR DE ES IT NL BE CH IN BR JP AU".split())
LOCALE_VARIABLES = ("LC_ALL", "LC_TELEPHONE", "LANG")
_LOCALE = re.compile(r"^[a-zA-Z]{2,3}[_-](?P<region>[A-Za-z]{2})(?:[.@]|$)")
_REGION = re.compile(r"^[A-Z]{2}$")
_REPEATED = re.compile(r"(\d)\1{4}")  # 5 equal digits in a row: a constant, not a number
_BEFORE = "@.+#/-_"  # a match right after one of these is part of something else
_AFTER = "@-_"


def available() -> bool:
    """Whether `phonenumbers` is installed (imports nothing)."""
    try:
        return importlib.util.find_spec("phonenumbers") is not None
    except (ImportError, ValueError):
        return False


def locale_regions(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The region the environment's locale names ("en_GB.UTF-8" -> ("GB",)), the first of
    $LC_ALL, $LC_TELEPHONE, $LANG that is set; () for "C", "POSIX" or none."""
    env = os.environ if env is None else env
    for name in LOCALE_VARIABLES:
        value = env.get(name, "")
        if value:
            m = _LOCALE.match(value)
            return (m.group("region").upper(),) if m else ()
    return ()


def check_regions(regions: Sequence[str], argument: str = "regions") -> tuple[str, ...]:
    """`regions` as upper-case ISO 3166 codes, each known to the phone metadata when installed;
    else `InvalidArgumentError` naming `argument`."""
    if isinstance(regions, str) or not isinstance(regions, Sequence):
        raise InvalidArgumentError(argument, regions, "a sequence of two-letter region codes")
    out: list[str] = []
    known = _supported()
    for i, region in enumerate(regions):
        code = region.upper() if isinstance(region, str) else region
        if not isinstance(code, str) or not _REGION.match(code) or (known and code not in known):
            raise InvalidArgumentError(f"{argument}[{i}]", region, "a region code such as 'GB'")
        if code not in out:
            out.append(code)
    return tuple(out)


def default_regions(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The locale's region, then `DEFAULT_REGIONS` (a locale region the metadata does not know
    is left out)."""
    known = _supported()
    local = tuple(r for r in locale_regions(env) if not known or r in known)
    return (*local, *(r for r in DEFAULT_REGIONS if r not in local))


@lru_cache(maxsize=1)
def _supported() -> frozenset[str]:
    if not available():
        return frozenset()
    import phonenumbers

    return frozenset(phonenumbers.SUPPORTED_REGIONS)


class PhoneFinder:
    """Valid phone numbers, in the national formats of `regions` and in international form."""

    def __init__(self, regions: Sequence[str] | None = None) -> None:
        self.regions = default_regions() if regions is None else check_regions(regions)
        self.available = available()

    def find(
        self, text: str, windows: Sequence[tuple[int, int]], cued: bool = False
    ) -> list[tuple[int, int, str]]:
        """(start, end, hint) of each number in the `windows` of `text` (the spans around runs
        of digits the pattern layer reads: `privacy._digit_windows`); `cued`: every window is
        read as after a phone word (the digits of a number given in pieces)."""
        if not self.available or not windows:
            return []
        out: list[tuple[int, int, str]] = []
        for start, end in windows:
            out += self._window(text, start, end, cued)
        return out

    def _window(
        self, text: str, start: int, end: int, cued: bool = False
    ) -> list[tuple[int, int, str]]:
        found: list[tuple[int, int, str]] = []
        lenient = cued or PHONE_WORDS.search(text, max(0, start - CUE_CHARS), start) is not None
        for s, e, hint in self._piece(text[start:end], lenient):
            if _edges_ok(text, start + s, start + e):
                found.append((start + s, start + e, hint))
        return found

    def _piece(self, piece: str, lenient: bool = False) -> tuple[tuple[int, int, str], ...]:
        """The numbers in one window's text, placed in it; a window that is a date, or has too
        few digits for a number, is not handed to the library (0.05 ms a region). `lenient`:
        after a phone word, any valid number, however grouped."""
        digits = sum(ch.isdigit() for ch in piece)
        if digits < MIN_DIGITS or _DATE.fullmatch(piece.strip(_NOT_DIGIT)):
            return ()
        return _numbers(piece, self.regions, lenient)


MIN_DIGITS = 7  # the shortest national number (with its area code) of the default regions
PHONE_WORDS = re.compile(
    r"(?i)phone|mobile|\bcell|\btel\b|tél|portable|\bfixe\b|handy|telefon|festnetz|mobil|"
    r"teléfono|telefono|móvil|celular|cellulare|whatsapp"
)
CUE_CHARS = 40  # how far before a number its phone word may stand
_NOT_DIGIT = "".join(chr(c) for c in range(128) if not chr(c).isdigit())
_DATE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}")


@lru_cache(maxsize=1024)
def _numbers(
    piece: str, regions: tuple[str, ...], lenient: bool = False
) -> tuple[tuple[int, int, str], ...]:
    """(start, end, hint) of the valid numbers in `piece` (kept: a conversation's earlier
    turns are scanned again with each new one); `lenient`: grouping not checked."""
    import phonenumbers as pn

    found: list[tuple[int, int, str]] = []
    leniency = pn.Leniency.VALID if lenient else pn.Leniency.STRICT_GROUPING
    for i, region in enumerate(regions):
        for m in pn.PhoneNumberMatcher(piece, region, leniency=leniency):
            if any(m.start < fe and fs < m.end for fs, fe, _ in found):
                continue
            if i > 0 and m.raw_string.isdigit():
                continue  # ungrouped digits: only the first region's plan reads them
            digits = pn.national_significant_number(m.number)
            if not _REPEATED.search(digits):
                found.append((m.start, m.end, f"phone +{m.number.country_code}***{digits[-2:]}"))
    return tuple(found)


def _edges_ok(text: str, start: int, end: int) -> bool:
    """The number stands alone: not after "#", "-", "@", a word character..., nor before one."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not (before.isalnum() or before in _BEFORE or after.isalnum() or after in _AFTER)
