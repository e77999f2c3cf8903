"""The local model as the judge of borderline privacy cases (issue 31, part 2).

    judge = PrivacyJudge(local_engine, budget_s=1.5)
    case = borderline(texts, found_kinds)          # None: the fast layers' answer stands
    if case is not None:
        verdict = await judge.verdict(texts, case)  # Verdict(private, span, missed_deadline)

The fast layers (patterns, the phone library, NER, the public-figure list) decide most prompts.
A prompt is borderline (`borderline`) when their answer may be wrong either way:
- `name_alone`: the only finding is a person's name, with no identifier beside it (a public
  figure the list does not know, a fictional character: the judge may let it go to the cloud);
- `fragment`: nothing was found, but a piece of an identifier stands after a cue ("it starts
  07911", "then 234567"), or an "@domain" with no user name found for it;
- `lower_name`: nothing was found, but two lower-case words that may be a name follow "from",
  "named", "called" or "by" ("the email is from dmitri volkov").

A name alone is judged by whether the local model knows the name (`privacy_known`: the rest of
the name's log-probability after its first word, in an encyclopedic list, against a bar measured
on invented private names with the same model): every name known means public figures, and the
request goes where its policy sends it. This needs an engine that `ScoresText`
(`LlamaCppEngine`); with another engine names are left to the fast layers unless
`clears_names=True`. For the other cases the judge asks the local model one question ("does
this conversation hold personal data about a private person, and which span?") with the answer
constrained by a JSON schema, which the local engine turns into a llama.cpp grammar: the
verdict is always parseable. It runs on the
local engine like any request (its own worker thread: the event loop is free), at interactive
priority, with a budget of time: a verdict that would come too late counts as private (the
request goes local), never as a pass to the cloud unjudged.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

import anyio

from hybridllm.engines.base import Engine, GenerationRequest
from hybridllm.engines.capabilities import ScoresText
from hybridllm.errors import InvalidArgumentError
from hybridllm.events import Chunk, Delta
from hybridllm.guard.privacy import Finding
from hybridllm.guard.privacy_known import NameRecogniser
from hybridllm.guard.privacy_split import DANGLING_DOMAIN
from hybridllm.tools import tool_spec

Case = Literal["name_alone", "fragment", "lower_name"]
MAX_CHARS = 1_500  # the end of the conversation the judge reads (the newest turns)

_FRAGMENT = re.compile(
    r"(?i)(?<![\w])(?:starts?(?: with)?|begins?(?: with)?|then|the rest(?: is)?|ends?(?: with|"
    r" in)?|first (?:part|digits)(?: is| are)?|last (?:part|digits)(?: is| are)?|"
    r"commence par|puis|ensuite|empieza (?:por|con)|luego|dann)\W{0,3}(?P<v>\+?\d[\d ]{2,10}\d)"
)
_STOP = frozenset(
    "the a an my your his her our their this that these those some any all more most other "
    "such only own same so than too very just also le la les un une des mon ma mes".split()
)
_LOWER_NAME = re.compile(
    r"(?<![\w])(?:from|named|called|by|de la part de|de)\s+(?P<a>[a-z][a-z'-]{2,})\s+"
    r"(?P<b>[a-z][a-z'-]{2,})(?![\w])"
)

SYSTEM = (
    "You check a conversation for personal data about a PRIVATE person before it is sent to "
    "an online service. Personal data: a private person's name, phone number, email address, "
    "home address, date of birth or ID number, also when it is given in pieces over several "
    "messages. Famous people (historical figures, politicians, artists, athletes) and "
    "fictional characters are NOT private persons. Answer in JSON: private (true or false) "
    "and span (the words that are personal data, or an empty string)."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "private": {"type": "boolean"},
        "span": {"type": "string", "maxLength": 60},
    },
    "required": ["private", "span"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judge's answer: `private` (the request stays local), the `span` it named (kept in
    memory only, never logged), and whether the budget ran out (`missed_deadline`: then
    `private` is True by rule, not by the model). `seconds`: the judge's time."""

    private: bool
    span: str
    missed_deadline: bool
    seconds: float


def borderline(texts: Sequence[str], found: Sequence[str]) -> Case | None:
    """Which borderline case the conversation `texts` is, given the kinds the fast layers
    `found` (None: not borderline, their answer stands)."""
    if found:
        return "name_alone" if set(found) == {"person"} else None
    joined = "\n".join(texts)
    if _FRAGMENT.search(joined) or DANGLING_DOMAIN.search(joined):
        return "fragment"
    for m in _LOWER_NAME.finditer(joined):
        if m.group("a") not in _STOP and m.group("b") not in _STOP:
            return "lower_name"
    return None


class PrivacyJudge:
    """Asks the local engine for a grammar-constrained verdict, within `budget_s` seconds."""

    def __init__(
        self,
        engine: Engine,
        *,
        budget_s: float = 2.0,
        clears_names: bool | None = None,
        max_tokens: int = 40,
    ) -> None:
        """`budget_s`: the most time a verdict may take (cut further by a request's deadline);
        `clears_names`: whether a name alone is judged too (a "not private" verdict then lets it
        go to the cloud). None: where the engine `ScoresText`, whose name test is measured to
        clear no private name of ours (docs/privacy-and-budget.md); True with another engine
        asks the generative question, which the small models answered "not private" for
        private names too."""
        if not isinstance(budget_s, int | float) or isinstance(budget_s, bool) or budget_s <= 0:
            raise InvalidArgumentError("budget_s", budget_s, "a number of seconds above 0")
        if clears_names is not None and not isinstance(clears_names, bool):
            raise InvalidArgumentError("clears_names", clears_names, "None, True or False")
        self.engine = engine
        self.budget_s = float(budget_s)
        self.names = NameRecogniser(engine) if isinstance(engine, ScoresText) else None
        auto = self.names is not None
        self.clears_names = auto if clears_names is None else clears_names
        self.max_tokens = max_tokens

    def request(self, texts: Sequence[str]) -> GenerationRequest:
        """The judge's request: the conversation's newest `MAX_CHARS` characters, quoted."""
        conversation = "\n".join(f"[message {i + 1}] {t}" for i, t in enumerate(texts))
        quoted = conversation[-MAX_CHARS:]
        return GenerationRequest(
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Conversation:\n{quoted}\n\nVerdict?"},
            ],
            max_tokens=self.max_tokens,
            temperature=0.0,
            priority="interactive",
            tools=tool_spec(
                None, None, {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}
            ),
        )

    async def verdict(
        self, texts: Sequence[str], budget_s: float | None = None, names: Sequence[str] = ()
    ) -> Verdict:
        """The verdict on `texts`, or, past `budget_s` (None: the judge's own; the smaller of
        the two), a private one (`missed_deadline`). `names`: the person entities of a name
        alone (`person_names`), judged by whether the model knows each (where it `ScoresText`);
        the span of a name it does not know is the verdict's."""
        budget = self.budget_s if budget_s is None else min(self.budget_s, budget_s)
        t0 = time.perf_counter()
        out: tuple[bool, str] | None = None
        if budget > 0:
            with anyio.move_on_after(budget):
                out = await self._judge(texts, names)
        seconds = time.perf_counter() - t0
        if out is None:
            return Verdict(True, "", True, seconds)
        return Verdict(out[0], out[1], False, seconds)

    async def _judge(self, texts: Sequence[str], names: Sequence[str]) -> tuple[bool, str]:
        """(private, span): the name test for names, else the model's answer to the question."""
        if names and self.names is not None:
            for name in names:
                if not await self.names.known(name):
                    return True, name
            return False, ""
        return parse(await _text(self.engine.stream(self.request(texts))))


async def _text(chunks: AsyncGenerator[Chunk, None]) -> str:
    parts: list[str] = []
    async with aclosing(chunks) as stream:
        async for chunk in stream:
            if isinstance(chunk, Delta):
                parts.append(chunk.text)
    return "".join(parts)


def person_names(found: Sequence[Finding], texts: Sequence[tuple[str, str]]) -> list[str]:
    """The text of each `person` finding, read from `texts` ((location, text) pairs as
    scanned); a finding whose location is not among them gives "" (never known: private)."""
    by_location = dict(texts)
    return [by_location.get(f.location, "")[f.start : f.end] for f in found if f.kind == "person"]


def parse(answer: str) -> tuple[bool, str]:
    """(private, span) of the model's JSON answer. The grammar makes it parseable; an answer
    cut by `max_tokens` before "private" is read as private (the safe side)."""
    try:
        data = json.loads(answer)
    except ValueError:
        m = re.search(r'"private"\s*:\s*(true|false)', answer)
        return (m is None or m.group(1) == "true"), ""
    if not isinstance(data, dict) or not isinstance(data.get("private"), bool):
        return True, ""
    span = data.get("span")
    return data["private"], span if isinstance(span, str) else ""
