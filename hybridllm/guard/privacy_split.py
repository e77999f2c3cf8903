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
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
