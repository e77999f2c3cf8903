"""Detect personal and secret data in a prompt, without keeping it.

    findings = scan(messages)        # or scan("some text")
    if findings: ...                 # e.g. keep the request on the device

Kinds: `email`, `phone`, `card` (Luhn and issuer prefix), `iban` (country length and mod 97),
`ssn` (US, invalid ranges excluded), `uk_nino` (UK National Insurance number, invalid prefixes
excluded), `es_dni` (Spanish DNI/NIE, check letter), `api_key` (OpenAI, Anthropic, AWS, GitHub,
Slack, Google, Stripe, JWT, and high-entropy `api_key=...` assignments), `private_key` (PEM).

Phone numbers are read first by `phonenumbers` (`privacy_phone.PhoneFinder`: every national
format of the locale's region and a default list, valid numbers only), then by the patterns.
Numbers are validated (checksums, number plans) so that dates, versions, order numbers and
hex digests in ordinary prose and code are not flagged. A `Finding` keeps the kind, where it was
and a redacted hint (at most "card ****1111"): never the matched text, so findings can go into
traces, logs and error messages.

What is scanned is every string a request sends (`message_texts`, `tool_texts`): each message's
content and other fields, the arguments of the tool calls an assistant message carries
("messages[2].tool_calls[0].function.arguments", as the JSON text that is sent), the results in
"tool" messages (their content), and every string of the tool definitions and the response
format ("tools[0].function.description", "tools[0].function.parameters.properties.unit.enum[1]").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Literal

from hybridllm.guard.privacy_phone import PhoneFinder
from hybridllm.guard.privacy_rules import (
    DETECTORS,
    DIGIT_RUN,
    Detector,
    Kind,
    es_dni_ok,
    iban_ok,
    luhn_ok,
    shannon_bits,
    ssn_ok,
)
from hybridllm.guard.privacy_split import split_emails, split_numbers

if TYPE_CHECKING:
    from hybridllm.tools import ToolSpec

__all__ = [
    "Finding",
    "Kind",
    "es_dni_ok",
    "iban_ok",
    "kinds",
    "luhn_ok",
    "message_texts",
    "scan",
    "scan_text",
    "shannon_bits",
    "ssn_ok",
    "strings",
    "tool_texts",
]


# how a finding was found: a pattern in one text, a pattern across the boundary of two texts
# read back to back ("across"), a value given in pieces with words between ("split"), the NER
# layer ("ner")
FindingOrigin = Literal["pattern", "across", "split", "ner"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One match: its kind, where (`location`, e.g. "messages[1].content"), its character span
    in that text, a redacted hint (words for people), and how it was found (`origin`, to branch
    on). The matched text itself is never stored."""

    kind: Kind
    location: str
    start: int
    end: int
    hint: str
    origin: FindingOrigin = "pattern"

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.end)

    def __str__(self) -> str:
        return f"{self.hint} at {self.location}[{self.start}:{self.end}]"


_MARGIN = 4  # characters around a digit run that a number's pattern may also use ("+", "(")


def _digit_windows(text: str) -> list[tuple[int, int]]:
    """Merged (start, end) windows around runs of 7+ digits and separators."""
    windows: list[tuple[int, int]] = []
    for m in DIGIT_RUN.finditer(text):
        start, end = max(0, m.start() - _MARGIN), min(len(text), m.end() + _MARGIN)
        if windows and start <= windows[-1][1]:
            windows[-1] = (windows[-1][0], end)
        else:
            windows.append((start, end))
    return windows


def _matches(
    d: Detector, text: str, lower: str | None, windows: list[tuple[int, int]]
) -> Iterator[re.Match[str]]:
    if d.digits:
        for start, end in windows:
            yield from d.pattern.finditer(text, start, end)
    elif d.anchors and lower is not None:
        for anchor in d.anchors:
            i = lower.find(anchor)
            while i >= 0:
                start = i
                while start > 0 and i - start < 64 and text[start - 1] in d.back:
                    start -= 1
                while start < i and not text[start].isalnum():
                    start += 1
                m = d.pattern.match(text, start)
                if m is not None:
                    yield m
                i = lower.find(anchor, i + 1)
    elif not d.anchors or any(a in text.lower() for a in d.anchors):
        yield from d.pattern.finditer(text)  # (lower-casing changed the length: no anchors)


_phones: PhoneFinder | None = None


def default_phones() -> PhoneFinder:
    """The phone finder `scan` uses when given none: the environment's locale region, then
    `privacy_phone.DEFAULT_REGIONS` (made on first use)."""
    global _phones
    if _phones is None:
        _phones = PhoneFinder()
    return _phones


def scan_text(
    text: str, location: str = "text", phones: PhoneFinder | None = None, cued: bool = False
) -> list[Finding]:
    """Every finding in one text, in order; overlapping matches keep the first detector's
    (`phones`, the phone-number library, reads before the phone patterns; `cued`: as after a
    phone word, `PhoneFinder.find`)."""
    found: list[Finding] = []
    taken: list[tuple[int, int]] = []
    lowered = text.lower()
    # a character that lower-cases to several would shift positions: then no anchors
    lower = lowered if len(lowered) == len(text) else None
    windows = _digit_windows(text)
    library_read = False
    for d in DETECTORS:
        if d.kind == "phone" and not library_read:  # after the checksummed kinds (an SSN)
            library_read = True
            for start, end, number in (phones or default_phones()).find(text, windows, cued):
                if not any(start < e and s < end for s, e in taken):
                    taken.append((start, end))
                    found.append(Finding("phone", location, start, end, number))
        for m in _matches(d, text, lower, windows):
            start, end = m.span()
            if any(start < e and s < end for s, e in taken):
                continue
            hint = d.check(m)
            if hint is not None:
                taken.append((start, end))
                found.append(Finding(d.kind, location, start, end, hint))
    found.sort(key=lambda f: (f.start, f.end))
    return found


Texts = str | Iterable[Mapping[str, object]]


def strings(where: str, value: object) -> Iterator[tuple[str, str]]:
    """(location, text) for every string in a JSON-like value (mapping keys excepted)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from strings(f"{where}.{k}", v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from strings(f"{where}[{i}]", v)


def message_texts(messages: Iterable[Mapping[str, object]]) -> Iterator[tuple[str, str]]:
    """(location, text) for every string chat messages send: contents (a tool result's
    included), names, ids, and the tool calls' names and arguments."""
    for i, message in enumerate(messages):
        for key, value in message.items():
            yield from strings(f"messages[{i}].{key}", value)


def tool_texts(spec: ToolSpec | None) -> Iterator[tuple[str, str]]:
    """(location, text) for every string of a request's tool definitions and response format,
    as sent (`ToolSpec.wire()`: "tools[0].function.description", "tool_choice.function.name",
    "response_format.json_schema.schema...")."""
    if spec is not None:
        for key, value in spec.wire().items():
            yield from strings(key, value)


def scan(
    texts: Texts, *, extra: Iterable[tuple[str, str]] = (), phones: PhoneFinder | None = None
) -> tuple[Finding, ...]:
    """Scan a text, or chat messages (every string of each message: `message_texts`); `extra`
    adds (location, text) pairs such as an assistant prefix or the tools (`tool_texts`). The
    conversation is also scanned as the cloud reads it, the contents back to back
    (`across_messages`), so a value split over two messages (an email's user name in one turn,
    its domain in the next) is found too, and an address given in pieces with words between
    them (`split_across`). `phones`: the phone finder (regions) to use; None:
    `default_phones()`."""
    items: list[tuple[str, str]] = []
    if isinstance(texts, str):
        items.append(("text", texts))
    else:
        items.extend(message_texts(texts))
    items.extend(extra)
    out: list[Finding] = []
    for location, text in items:
        out += scan_text(text, location, phones)
    contents = [(loc, text) for loc, text in items if loc == "text" or loc.endswith(".content")]
    return (
        *out,
        *across_messages(contents, out, phones),
        *split_across(contents, out, phones),
    )


SPLIT_HINT = {"email": "email ***@*** (split)"}


def split_across(
    contents: Sequence[tuple[str, str]],
    found: Iterable[Finding] = (),
    phones: PhoneFinder | None = None,
) -> list[Finding]:
    """Values given in pieces with words between them (`privacy_split`), where no finding is:
    the dangling "@domain" a user name elsewhere in the conversation completes, and a number
    (phone, card, ID) whose digit pieces in two or three texts read as one."""
    known = [(f.location, f.start, f.end) for f in found]
    emails = [("email", *where) for where in split_emails(contents)]
    numbers = split_numbers(contents, partial(_kinds_at, phones=phones))
    return [
        Finding(kind, location, start, end, SPLIT_HINT.get(kind, f"{kind} *** (split)"), "split")
        for kind, location, start, end in (*emails, *numbers)
        if not any(loc == location and s < end and start < e for loc, s, e in known)
    ]


def _kinds_at(
    text: str, about_phones: bool, phones: PhoneFinder | None = None
) -> list[tuple[str, int, int]]:
    """(kind, start, end) of the pattern layer's findings on `text` (`split_numbers`' reader);
    `about_phones`: the conversation has a phone word, so `text` is read as after one (any
    valid number, however grouped)."""
    return [(f.kind, f.start, f.end) for f in scan_text(text, "text", phones, about_phones)]


def across_messages(
    contents: Sequence[tuple[str, str]],
    found: Iterable[Finding] = (),
    phones: PhoneFinder | None = None,
) -> list[Finding]:
    """Findings that span the boundary between consecutive texts when they are read back to
    back (location "conversation", span in the joined text). Those inside one text, and any
    that overlap what the per-text scan `found` already, are left to that scan."""
    if len(contents) < 2:
        return []
    joined = "".join(text for _, text in contents)
    offsets, at = {}, 0
    for location, text in contents:
        offsets[location] = at
        at += len(text)
    bounds = sorted(offsets.values())[1:]
    known = [
        (offsets[f.location] + f.start, offsets[f.location] + f.end)
        for f in found
        if f.location in offsets
    ]
    return [
        replace(f, origin="across")
        for f in scan_text(joined, "conversation", phones)
        if any(f.start < b < f.end for b in bounds)
        and not any(f.start < e and s < f.end for s, e in known)
    ]


def kinds(findings: Iterable[Finding]) -> tuple[Kind, ...]:
    """The distinct kinds found, sorted (what a refusal may name)."""
    return tuple(sorted({f.kind for f in findings}))
