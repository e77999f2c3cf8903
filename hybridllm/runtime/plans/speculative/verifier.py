"""What every verifier dialect shares: the round it judges, the verdict it returns, the
`Verifier` protocol, and reading an OpenAI-shaped answer (its first choice, its billed usage, the
greedy entry of a top-logprobs dict).

```
Verifier (one `verify(round) -> Verdict` per dialect)
├── EchoVerifier             (a) /v1/completions with echo + logprobs (llama-cpp-python's server,
│                                started with --logits_all true); text-level (`dialect_llama`)
├── PromptLogprobsVerifier   (b) /v1/completions with vLLM's `prompt_logprobs`; token-level
│                                (token ids of a shared tokenizer; greedy or sampled)
├── TextLogprobsVerifier     (b) the same on a text prompt; text-level (`dialect_vllm`)
└── PredictionVerifier       (c) OpenAI Predicted Outputs: chat completions with `prediction`;
                                 text-level, the cloud's own text comes back (`dialect_openai`)
```

(d) none: `probe.probe()` returns no verifier and the reason; the plan then streams plainly.

A verifier holds no connection: each call gets the `VerificationPost` that sends its one
request, the cloud guard's `verification_post` (privacy scan, reservation and settlement; the
plan declares the round's text and bounds in an `Outgoing`), which sends it through the cloud
engine's own client (`OpenAIEngine.verification_post`: its key, its timeouts, a refused key
noticed there).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from hybridllm import errors
from hybridllm.engines.base import Message
from hybridllm.engines.capabilities import VerificationPost
from hybridllm.engines.nucleus import Dist

Dialect = Literal["echo-logprobs", "prompt-logprobs", "predicted-outputs"]


class Unverifiable(Exception):  # noqa: N818 - a verdict, not a failure of the endpoint
    """The answer cannot judge this round (see the dialects); the plan streams the rest."""


@dataclass(frozen=True)
class Sampling:
    """A sampled round (temperature > 0): the request's temperature and top_p, the random
    source (seeded from the request's seed), q at each drafted position, the vocabulary size."""

    temperature: float
    top_p: float
    rng: random.Random
    q: Sequence[Dist]
    vocab: int


@dataclass(frozen=True)
class Round:
    """What one verification round sends: the rendered prompt, the committed answer, the
    context as token ids (prompt + committed, local tokenizer), and the draft. `text_of`:
    the text of token ids following the context (local tokenizer); `sampling`: the draft was
    sampled (speculative sampling decides), else greedy."""

    prompt_text: str
    committed_text: str
    context_ids: Sequence[int]
    draft_ids: Sequence[int]
    draft_pieces: Sequence[str]
    messages: Sequence[Message] = ()
    text_of: Callable[[Sequence[int]], str] | None = None
    sampling: Sampling | None = None

    @property
    def draft_text(self) -> str:
        return "".join(self.draft_pieces)


@dataclass(frozen=True)
class Verdict:
    """The cloud's answer to one round. `accepted`: drafted tokens it agreed with; `text`: the
    text to commit (the accepted draft text, then the cloud's own next token or tokens);
    `next_id`: the cloud's own token id (token-level dialects); `finished`: the answer ended;
    `gap`: the cloud's top-2 log-probability gap where its own token was chosen (a near-tie
    when small); billed usage as the server reported it; `switch`: the round could decide
    only its first `accepted` tokens (why): commit `text`, then stream plainly."""

    accepted: int
    text: str
    accepted_text: str
    next_id: int | None
    finished: bool
    prompt_tokens: int
    completion_tokens: int
    gap: float | None = None
    usage_reported: bool = True
    switch: str | None = None


class Verifier(Protocol):
    dialect: Dialect
    token_level: bool

    @property
    def samples(self) -> bool:
        """Whether it can judge sampled drafts (speculative sampling)."""
        ...

    async def verify(self, round_: Round, post: VerificationPost) -> Verdict:
        """Judge `round_` with one request sent by `post` (the cloud guard's, for this round)."""
        ...


@dataclass(frozen=True)
class Probed:
    """What probing an endpoint found: a verifier, or None and why."""

    verifier: Verifier | None
    reason: str


class BilledUsage(NamedTuple):
    """An answer's usage as the server reported it (`reported` False: it reported none)."""

    prompt_tokens: int
    completion_tokens: int
    reported: bool


def billed_usage(data: Mapping[str, Any]) -> BilledUsage:
    u = data.get("usage") or {}
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    if isinstance(p, int) and isinstance(c, int):
        return BilledUsage(p, c, True)
    return BilledUsage(0, 0, False)


def first_choice(data: Mapping[str, Any]) -> dict[str, Any]:
    """`choices[0]` of an answer (a protocol error when it has none)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise errors.CloudProtocolError("verification: no choices in the answer") from exc
    if not isinstance(choice, dict):
        raise errors.CloudProtocolError("verification: a choice is not an object")
    return choice


def greedy_and_gap(dist: Mapping[str, float]) -> tuple[str, float | None]:
    """The greedy key of a top-logprobs dict and its gap to the second."""
    ranked = sorted(dist.items(), key=lambda kv: kv[1], reverse=True)
    gap = ranked[0][1] - ranked[1][1] if len(ranked) > 1 else None
    return ranked[0][0], gap


def text_verdict(
    round_: Round,
    accepted_text: str,
    own: str,
    finished: bool,
    usage: BilledUsage,
    gap: float | None,
) -> Verdict:
    """The verdict of a text-level round: `accepted_text` (a prefix of the draft), then the
    cloud's `own` text; the accepted drafted tokens are those wholly inside `accepted_text`."""
    n, acc = 0, 0
    for piece in round_.draft_pieces:
        if acc + len(piece) > len(accepted_text):
            break
        acc += len(piece)
        n += 1
    p, c, reported = usage
    return Verdict(n, accepted_text + own, accepted_text, None, finished, p, c, gap, reported)
