"""Whether the local model knows a name: a public figure the shipped list does not hold
(issue 31, part 3), so that a question about that person's public life is not kept on the
device as if it named a private person.

    names = NameRecogniser(local_engine)        # an engine that `ScoresText` (LlamaCppEngine)
    await names.known("Hedy Lamarr")            # True on the models measured
    await names.known("Hannah Lindqvist")       # False: an ordinary private name

The test: the model reads an encyclopedic list of famous people (`FRAME`) and the name's first
word; the name's score is the log-probability of the rest of the name, summed over its tokens.
A well-known person's surname follows readily ("Hedy" -> " Lamarr"); a private person's does
not, since nothing the model read ties the two. The bar is the model's own: the highest score of
the invented private names shipped in `data/invented_names.txt`, plus `MARGIN`, measured once
per recogniser (about 60 short scorings, the list's prefix evaluated once). A name scores above
the bar only where the model completes it more readily than any ordinary private name.

What it does not do: it says nothing of a person who shares a famous name (the NER layer keeps
a name after a naming cue such as "my neighbour" private before this test is asked), and a small
model knows fewer people than a large one (docs/privacy-and-budget.md has the measured recall).
A name of one word is never known here (the NER layer flags those only after a naming cue).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

import anyio

from hybridllm.engines.capabilities import ScoresText

FRAME = (
    "Famous people in history, science, politics, the arts and sports: Albert Einstein, "
    "Marie Curie, Nelson Mandela, Frida Kahlo,"
)
DATA = "invented_names.txt"
MARGIN = 0.5  # nats above the best-known invented name
_CACHE = 256  # names whose score is kept
_POSSESSIVE = re.compile(r"['’]s?$")
_TITLES = frozenset(
    "mr mrs ms dr prof sir dame lord lady president king queen prince princess saint st "
    "general herr frau m mme monsieur madame señor señora don doña".split()
)


@lru_cache(maxsize=1)
def invented_names() -> tuple[str, ...]:
    """The shipped invented private names (the bar's reference)."""
    text = resources.files("hybridllm.guard").joinpath("data", DATA).read_text(encoding="utf-8")
    return tuple(s for line in text.splitlines() if (s := line.strip()) and s[0] != "#")


_PARTICLES = frozenset("de du des la le van von der den di da del dos das y bin al ibn".split())


def name_words(span: str) -> list[str]:
    """The words of a person entity's text that make the name: the longest run of capitalised
    words (particles such as "de", "von" inside it), without a possessive or a leading title
    ("Katherine Johnson's" -> Katherine, Johnson; "Why is Katherine Johnson" -> Katherine,
    Johnson; "Dr. Ada Byron" -> Ada, Byron; "Simone de Beauvoir" whole)."""
    words = [_POSSESSIVE.sub("", w).strip('.,;:!?()"“”«»') for w in span.split()]
    runs: list[list[str]] = [[]]
    for w in (w for w in words if w):
        if w[:1].isupper() and w.lower().rstrip(".") not in _TITLES:
            runs[-1].append(w)
        elif runs[-1] and w in _PARTICLES:
            runs[-1].append(w)
        elif runs[-1]:
            runs.append([])
    for run in runs:
        while run and run[-1] in _PARTICLES:
            run.pop()
    return max(reversed(runs), key=len)


class NameRecogniser:
    """Scores names on `engine` (`ScoresText`) against a bar measured on the same model."""

    def __init__(self, engine: ScoresText, *, margin: float = MARGIN) -> None:
        self.engine = engine
        self.margin = margin
        self._bar: float | None = None
        self._lock = anyio.Lock()
        self._scores: OrderedDict[str, float] = OrderedDict()

    async def score(self, name: str) -> float:
        """The log-probability of the name's words after its first (-inf: one word only)."""
        words = name_words(name)
        if len(words) < 2:
            return -math.inf
        key = " ".join(words)
        if key in self._scores:
            self._scores.move_to_end(key)
            return self._scores[key]
        lps = await self.engine.text_logprobs(f"{FRAME} {words[0]}", " " + " ".join(words[1:]))
        value = float(sum(lps))
        self._scores[key] = value
        if len(self._scores) > _CACHE:
            self._scores.popitem(last=False)
        return value

    async def bar(self) -> float:
        """The score a name must pass: the best invented name's, plus the margin (measured on
        the first call, then kept)."""
        async with self._lock:
            if self._bar is None:
                scores = [await self.score(n) for n in invented_names()]
                self._bar = max(scores) + self.margin
            return self._bar

    async def known(self, name: str) -> bool:
        """Whether the model knows `name` better than any ordinary private name."""
        bar = await self.bar()
        return await self.score(name) > bar

    async def all_known(self, names: Sequence[str]) -> bool:
        """Whether every name of `names` is known (False for none)."""
        if not names:
            return False
        for name in names:
            if not await self.known(name):
                return False
        return True
