"""What an engine can do beyond the seam: small optional capabilities, declared as protocols.

The `Engine` seam (`engines.base`) is all a plan needs to stream an answer. Some plans need
more of an engine: the cascade reads the local model's own confidence, the speculative plan has
it draft and the cloud verify. Each such ability is one small `runtime_checkable` protocol
here, so code asks `isinstance(engine, ReadsSignals)` (a capability, never a concrete engine
class) and mypy sees the methods it then calls.

```
ReadsSignals        its own confidence signals on a prompt (LlamaCppEngine)
NamesItsModel       which model it runs (`model_id`, once open) (LlamaCppEngine)
ScoresText          log-probabilities of a plain text after a prefix (LlamaCppEngine)
Drafts              a `Drafter`: drafts tokens after a token context (LlamaCppEngine)
VerifiesAtEndpoint  posts a verifier's raw request through its own client (OpenAIEngine)
SetsApiKey          takes a new API key (OpenAIEngine)
Checks              says whether it can serve: reachable, key accepted, model found (both)
ConstrainsOutput    says up front whether it can constrain a request's schemas (LlamaCppEngine)
LimitsConcurrency   a `ConcurrencyLimit` whose forecast counts requests routed to it
Wraps               wraps another engine (the cloud guard), which it names with `wrapped()`
```

A wrapper forwards what a plan needs through itself: the cloud guard offers
`verification_endpoint`, `verification_post` (privacy scan and budget on every byte) and
`set_api_key` of the engine it wraps; `wrapped()` is for reading that engine, never for sending.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from hybridllm.engines.base import prompt_token_bound

if TYPE_CHECKING:
    from hybridllm.engines.base import Engine, Message
    from hybridllm.engines.limit import ConcurrencyLimit
    from hybridllm.engines.llama.signals import LocalSignals
    from hybridllm.engines.nucleus import Dist
    from hybridllm.tools import ToolSpec

__all__ = [
    "Drafted",
    "Drafter",
    "Drafts",
    "Checks",
    "ConstrainsOutput",
    "EngineCheck",
    "Endpoint",
    "LimitsConcurrency",
    "NamesItsModel",
    "Outgoing",
    "ReadsSignals",
    "ScoresText",
    "SetsApiKey",
    "VerificationPost",
    "VerifiesAtEndpoint",
    "Wraps",
]

# Sends one verifier request: POST a JSON body to a path of the endpoint ("completions",
# "chat/completions"); the answer's JSON object. Failures are `hybridllm.errors.CloudError`s.
# A verifier gets the cloud guard's `verification_post` bound to its round.
VerificationPost = Callable[[str, Mapping[str, Any]], Awaitable[dict[str, Any]]]


@runtime_checkable
class ReadsSignals(Protocol):
    """Reads its own confidence signals on a prompt (router stage 2, the cascade)."""

    async def signals(
        self,
        messages: Sequence[Message],
        n_answer: int = 8,
        *,
        rotations_within_s: float | None = None,
        rotations_max_s: float | None = None,
    ) -> LocalSignals: ...


@runtime_checkable
class NamesItsModel(Protocol):
    """Says which model it runs (`model_id`: its file's name once open, None before): what the
    router's stage-2 heads are compared with (the local engine)."""

    model_id: str | None


@runtime_checkable
class ScoresText(Protocol):
    """Scores a plain text under its model (no chat template): the privacy judge asks whether
    the model knows a name (`guard.privacy_known`)."""

    async def text_logprobs(self, prefix: str, text: str) -> tuple[float, ...]:
        """The log-probability of each token of `text` written after `prefix`."""
        ...


@runtime_checkable
class KnowsCache(Protocol):
    """Says how much of a prompt it would not prefill (its KV cache or a saved state holds it):
    routing predicts the local time to a first token from the rest."""

    def cached_tokens(self, messages: Sequence[Message]) -> int | None:
        """The prompt's leading tokens already held (None: it cannot tell now)."""
        ...


@runtime_checkable
class Warms(Protocol):
    """Prefills a conversation ahead of its next turn, at background priority, so that turn
    pays only for its new message (a turn the cloud served, issue 28)."""

    async def warm(self, messages: Sequence[Message], conversation: str | None = None) -> int:
        """Prefill `messages` (the last one the assistant's answer), kept under the app's
        `conversation` key if it gave one; the tokens prefilled."""
        ...

    async def forget(self, conversation: str) -> int:
        """Drop what is kept for the app's `conversation` key (it closed that conversation);
        the bytes freed."""
        ...


# ---- drafting -------------------------------------------------------------------------------


@dataclass
class Drafted:
    """One round's draft: token ids, each one's probability under the drafter (1.0 when
    greedy), q at each position (sampled drafts only), whether the last one ends the answer,
    and the time spent."""

    ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    dists: list[Dist] = field(default_factory=list)
    eos: bool = False
    reused: int = 0  # context tokens found in the KV cache (not evaluated again)
    evaluated: int = 0  # context tokens evaluated this round (the new tail)
    steps: int = 0  # one-token decode steps
    seconds: float = 0.0


class Drafter(Protocol):
    """A local model's handle for one speculative request: its chat template and tokenizer,
    and drafting after a token context (the KV cache keeps the committed context)."""

    @property
    def n_vocab(self) -> int: ...

    async def start(self) -> None: ...

    def render(self, messages: Sequence[Message]) -> str: ...

    def tokenize(self, text: str) -> list[int]: ...

    def piece(self, ids: Sequence[int], prev: Sequence[int] = ()) -> bytes:
        """The bytes of `ids` (special tokens as nothing), as they follow `prev`."""
        ...

    def is_eog(self, tok: int) -> bool: ...

    async def draft(
        self,
        context: Sequence[int],
        k: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        rng: random.Random | None = None,
    ) -> Drafted:
        """Up to `k` tokens after `context`; cancelling stops within one decode step."""
        ...


@runtime_checkable
class Drafts(Protocol):
    """Drafts tokens for the speculative plan."""

    def drafter(self) -> Drafter:
        """A drafting handle for one request."""
        ...


# ---- verifying at an endpoint ---------------------------------------------------------------


class Endpoint(NamedTuple):
    """Where drafts are verified: the speculative plan remembers a verifier per endpoint."""

    base_url: str
    model: str


@dataclass(frozen=True)
class Outgoing:
    """What one verification request carries, for the guard: the texts it sends (a prompt of
    token ids is declared as the text it encodes), a bound of its prompt tokens and the most
    tokens it may generate (reserved, then settled from the answer's usage)."""

    texts: tuple[tuple[str, str], ...]  # (where, text)
    prompt_tokens: int
    max_tokens: int

    @classmethod
    def of_body(cls, body: Mapping[str, Any], where: str = "verification.probe") -> Outgoing:
        """Read from a request body: its prompt text or chat messages (a prompt of token ids
        counts its ids and declares no text), and its `max_tokens` (16 when not given) plus a
        Predicted Outputs prediction (rejected prediction tokens bill as output: one token per
        byte at most)."""
        prompt, messages = body.get("prompt"), body.get("messages")
        texts: Iterable[str]
        if isinstance(messages, list):
            texts = [str(m.get("content", "")) for m in messages]
            bound = prompt_token_bound(messages)
        elif isinstance(prompt, str):
            texts, bound = [prompt], prompt_token_bound([{"role": "user", "content": prompt}])
        else:
            texts, bound = [], len(prompt) if isinstance(prompt, list) else 64
        pairs = tuple((where, t) for t in texts)
        max_out = int(body.get("max_tokens", 16))
        predicted = body.get("prediction")
        if isinstance(predicted, Mapping):
            max_out += len(str(predicted.get("content", "")).encode("utf-8"))
        return cls(pairs, bound, max_out)


@runtime_checkable
class VerifiesAtEndpoint(Protocol):
    """Sends a verifier's raw requests (the dialects of `runtime.plans.speculative`) through
    the engine's own client: its credential, its timeouts, its handling of a refused key."""

    def verification_endpoint(self) -> Endpoint | None:
        """Where this engine verifies (None: it cannot)."""
        ...

    async def verification_post(
        self, path: str, body: Mapping[str, Any], outgoing: Outgoing | None = None
    ) -> dict[str, Any]:
        """POST `body` (the engine adds its model) to `path`; the answer's JSON object.
        `outgoing`: what the request carries, for a guard wrapped around the engine (None:
        read from the body); an engine sends `body` as it is."""
        ...


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """What an engine's own check found (`Checks.check`): whether it answers (`reachable`), its
    key was accepted (`key_accepted`), its model is there (`model_found`); None where the check
    cannot say (a local engine has no key; an endpoint that lists no models). `detail`: the
    same in words, for people; `error`: the class of the error the check met (None: none)."""

    reachable: bool | None
    key_accepted: bool | None
    model_found: bool | None
    detail: str = ""
    error: type[BaseException] | None = None

    @property
    def serves(self) -> bool:
        """Nothing the check found stops it from serving."""
        return False not in (self.reachable, self.key_accepted, self.model_found)


@runtime_checkable
class Checks(Protocol):
    async def check(self, timeout_s: float) -> EngineCheck:
        """Whether the engine can serve now, found within `timeout_s` (a short probe: a cloud
        lists its models; never a generation). Never raises: what went wrong is the finding."""
        ...


@runtime_checkable
class ConstrainsOutput(Protocol):
    def check_constraints(self, spec: ToolSpec) -> None:
        """Whether this engine can constrain `spec`'s tool calls and JSON answer (a local
        grammar per schema): `InvalidArgumentError` naming the argument where it cannot, at
        admission, before any engine is sent the request."""
        ...


@runtime_checkable
class SetsApiKey(Protocol):
    def set_api_key(self, api_key: str) -> None:
        """Use a new API key from the next request on."""
        ...


@runtime_checkable
class LimitsConcurrency(Protocol):
    """Holds requests past a concurrency limit; routing counts a request it sends there in the
    limit's forecast before it arrives (`ConcurrencyLimit.expect`)."""

    limit: ConcurrencyLimit


@runtime_checkable
class Wraps(Protocol):
    """Wraps another engine (the cloud guard)."""

    def wrapped(self) -> Engine:
        """The engine wrapped, to read (its info, its limit), never to send through."""
        ...
