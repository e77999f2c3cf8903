"""Identifiers split over a conversation with words between the pieces, which no pattern over the
joined text matches: an email address whose user name is in one turn ("it starts with
jane.doe") and whose "@domain" is in another ("and ends with @example.org").

    split_emails([("messages[0].content", "starts with jane.doe"),
                  ("messages[2].content", "and ends with @example.org")])
    # [("messages[2].content", 14, 26)]: the domain's span, where the address is completed

A dangling domain ("@example.org" with no user name before it) completes an address when a user
name is given elsewhere in the conversation:
- after a cue, in any text before the domain ("starts with", "begins with", "my username is",
  "commence par", "empieza por", "beginnt mit"...), or
- in another text, shaped as a mailbox name usually is ("first.last", "first_last",
  "name1984"), when the conversation speaks of mail ("email", "mailbox", "courriel"...).
A domain alone ("block mail from @example.org") or code ("@dataclass", "npm i @types/node") is
not flagged.

A number given in pieces ("my mobile starts 07911" ... "then 234567"; "the card begins 4539
1488" ... "and ends 0343 6467") is found by `split_numbers`: digit pieces of different texts,
two or three in a row, are joined with a space and read by the whole pattern layer (phone
library, checksums), so a piece counts only when the joined value is a valid identifier of
some kind. A piece counts only after a cue that it is part of something ("starts", "then",
"the rest is", "puis", "luego", "dann") or in a conversation that names a number ("phone",
"mobile", "card", "numéro", "Handy", "teléfono"), so that the numbers of a recipe or a
timetable are never joined.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from hybridllm.guard.privacy_phone import PHONE_WORDS

# "@example.org" not preceded by a user name (the per-text patterns read complete addresses)
DANGLING_DOMAIN = re.compile(
    r"(?<![A-Za-z0-9._%+-])@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})\.)+[A-Za-z]{2,24}(?![\w.-]*\w)"
)
_LOCAL = r"[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}"
_CUES = (
    r"starts? with|begins? with|beginning with|start is|first part(?: is)?|"
    r"user ?name(?: is)?|login(?: is)?|handle(?: is)?|local part(?: is)?|before the @(?: is)?|"
    r"commence par|débute par|identifiant(?: est)?|empieza (?:por|con)|comienza (?:por|con)|"
    r"usuario(?: es)?|beginnt mit|fängt mit|benutzername(?: ist)?"
)
CUED_LOCAL = re.compile(
    rf"(?i:{_CUES})\W{{0,3}}['\"“«]?\s?(?P<v>{_LOCAL})(?![\w@])",
)
# how mailbox names look when given alone: first.last, first_last, letters then 2-4 digits (one
# separator: "os.path.join" is code)
SHAPED_LOCAL = re.compile(
    r"(?<![\w.@/])(?P<v>[A-Za-z]{2,}[._][A-Za-z]{2,}\d{0,4}|[A-Za-z]{3,}\d{2,4})"
    r"(?![\w(@/]|[._][A-Za-z])"
)
# a shaped name counts only in a conversation about mail
MAIL_WORDS = re.compile(r"(?i)e-?mail|mailbox|inbox|courriel|adresse mail|correo|address")


def split_emails(texts: Sequence[tuple[str, str]]) -> list[tuple[str, int, int]]:
    """(location, start, end) of each dangling domain that a user name elsewhere completes."""
    out: list[tuple[str, int, int]] = []
    for i, (location, text) in enumerate(texts):
        for m in DANGLING_DOMAIN.finditer(text):
            if _completed(texts, i, m.start()):
                out.append((location, m.start(), m.end()))
    return out


def _completed(texts: Sequence[tuple[str, str]], at: int, start: int) -> bool:
    """Whether a user name stands in the conversation for the domain at `texts[at]`, `start`:
    after a cue before it (the same text or an earlier one), or shaped like one in another
    (when the conversation speaks of mail)."""
    about_mail = any(MAIL_WORDS.search(text) for _, text in texts)
    for j, (_, text) in enumerate(texts):
        before = text[:start] if j == at else text
        if j <= at and CUED_LOCAL.search(before):
            return True
        if j != at and SHAPED_LOCAL.search(text) and about_mail:
            return True
    return False


# a run of digits given on its own, grouped or not ("07911", "234 567", "+44 7911", "0343-6467")
DIGIT_PIECE = re.compile(r"(?<![\w.,/:@+-])\+?\d(?:[ -]?\d){1,15}(?![\w@]|[.,/:]\d)")
_PIECE_CUES = re.compile(
    r"(?i)(?<![\w])(?:starts?(?: with)?|begins?(?: with)?|beginning|first (?:part|digits|half)|"
    r"then|next|after that|followed by|the rest|rest is|ends?(?: with| in)?|last (?:part|digits|"
    r"half)|second (?:part|half)|commence par|débute par|puis|ensuite|la suite|finit par|"
    r"empieza (?:por|con)|comienza (?:por|con)|luego|después|termina (?:en|con)|beginnt mit|"
    r"fängt mit|dann|danach|endet mit)\W{0,3}$"
)
NUMBER_WORDS = re.compile(
    r"(?i)phone|mobile|cell|number|\bno\.|digits|card|account|iban|sort code|passport|"
    r"licen[cs]e|téléphone|portable|numéro|carte|compte|telefon|handy|nummer|karte|konto|"
    r"teléfono|móvil|número|tarjeta|cuenta|telefono|cellulare|numero"
)
MAX_PIECES = 3  # pieces joined at most ("07911" / "234" / "567")
Piece = tuple[int, int, int, str]  # (text index, start, end, digits as written)


def digit_pieces(texts: Sequence[tuple[str, str]]) -> list[Piece]:
    """Every digit piece of the conversation, in order."""
    return [
        (i, m.start(), m.end(), m.group(0))
        for i, (_, text) in enumerate(texts)
        for m in DIGIT_PIECE.finditer(text)
    ]


def split_numbers(
    texts: Sequence[tuple[str, str]], read: Callable[[str, bool], Sequence[tuple[str, int, int]]]
) -> list[tuple[str, str, int, int]]:
    """(kind, location, start, end) of each number given in pieces over two or three texts:
    `read(joined, about_phones)` is the pattern layer's (kind, start, end) findings on the
    pieces joined with a space (`about_phones`: the conversation has a phone word,
    `privacy_phone.PHONE_WORDS`); one that starts in the first piece and ends in the last is
    kept, located at the last piece (where the value is completed). The conversation's words
    are read only where two texts hold digit pieces (a long prompt alone costs one pass)."""
    if len(texts) < 2:
        return []
    pieces = digit_pieces(texts)
    if len({p[0] for p in pieces}) < 2:
        return []
    about_numbers = any(NUMBER_WORDS.search(text) for _, text in texts)
    phones = any(PHONE_WORDS.search(text) for _, text in texts)
    out: list[tuple[str, str, int, int]] = []
    for a in range(len(pieces)):
        for b in range(a + 1, min(a + MAX_PIECES, len(pieces))):
            run = pieces[a : b + 1]
            if len({p[0] for p in run}) != len(run):
                break  # two pieces of one text: the per-text scan reads them together
            if not _cued(texts, run, about_numbers):
                continue
            found = _read_joined(run, read, phones)
            if found is not None:
                last = run[-1]
                out.append((found, texts[last[0]][0], last[1], last[2]))
    return out


def _cued(texts: Sequence[tuple[str, str]], run: Sequence[Piece], about_numbers: bool) -> bool:
    """Whether the pieces of `run` may be one value: the conversation names a number, or a cue
    ("starts", "then") stands right before one of them."""
    return about_numbers or any(_PIECE_CUES.search(texts[i][1][:start]) for i, start, _, _ in run)


def _read_joined(
    run: Sequence[Piece],
    read: Callable[[str, bool], Sequence[tuple[str, int, int]]],
    about_phones: bool,
) -> str | None:
    """The kind of a finding on the joined pieces that spans them all, else None."""
    joined = " ".join(p[3] for p in run)
    last_start = len(joined) - len(run[-1][3])
    for kind, start, end in read(joined, about_phones):
        if start < len(run[0][3]) and end > last_start:
            return kind
    return None
