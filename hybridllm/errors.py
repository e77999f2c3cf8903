"""Every error hybridllm raises, in one tree.

```
HybridError
├── ConfigError                 bad input from the user: arguments, manifests, policies
│   ├── InvalidArgumentError    an argument failed its check (`argument`, `value`, `rule`):
│   │                           stream()/complete(), engines, CLI options
│   ├── ManifestError           a model manifest is malformed or unknown
│   ├── PolicyError             a policy file or name is wrong
│   ├── RouterThresholdError    a router threshold cannot be met (or its arguments are wrong)
│   ├── DecisionLogError        the decision log was misused (unknown request id, ...)
│   └── MissingExtraError       a feature needs an optional extra that is not installed
│                               (`extra`: "bench", ...; `module`: what failed to import)
├── RefusedError                the request was refused before anything was sent: by routing
│   │                           (no engine may serve it) or by the guard at the cloud seam.
│   │                           Never retried; `engine`, `reasons` (routing's, else empty)
│   ├── PrivacyBlockedError     it holds personal or secret data and the privacy mode keeps
│   │                           it local (privacy "block", or engine="cloud" under "keep-local")
│   └── BudgetExceededError     its worst-case cost does not fit a budget cap
│       ├── LedgerUnavailableError  the shared ledger (a Redis server) cannot be reached, so
│       │                       no cap can be checked: refused, as over budget (fails closed)
│       └── RateLimitedError    the end user's cloud requests this minute reached the
│                               policy's `[limits] per_user_rpm` (`limit_rpm`, `retry_after_s`)
├── ModelError                  a model file cannot be used
│   ├── ModelNotFoundError      the file (or the manifest's cached file) does not exist
│   ├── ModelCorruptError       the file exists but does not load / fails its checksum
│   │                           (`reason`: "bad_magic", "malformed", "truncated", "checksum",
│   │                           "load_failed")
│   ├── ModelUnsupportedError   a whole, well-formed GGUF this llama.cpp build cannot run
│   │                           (`architecture`)
│   ├── ModelTooLargeError      the model at the asked context does not fit the free memory
│   │                           (`need_bytes`, `available_bytes`, `weights_bytes`, `kv_bytes`)
│   ├── RouterArtifactError     a router artifact is missing, tampered with or mismatched
│   └── TuneError               `hybridllm tune` could not measure the model
├── PullError                   `models pull` could not fetch or assemble a model
│   └── HubError                a model named on the Hugging Face hub could not be had
│                               (`ref`, `reason`: "repo_not_found", "file_not_found",
│                               "ambiguous", "gated", "offline_missing", "checksum",
│                               "not_gguf", "network")
├── ClientStateError            the client or a stream was used outside its lifetime
├── AnswerTimeoutError          `complete(timeout=)` passed before the answer ended (also a
│                               `TimeoutError`): `timeout_s`, the `text`, `tool_calls` and
│                               `trace` so far (the stream was closed, its spend settled)
├── InternalError               a fault inside hybridllm (a bug): the error is its __cause__;
│                               what leaves a request is always a HybridError (`typed`)
├── ServerStartError            a test server of `hybridllm.testing` did not start
└── EngineError                 an engine failed while serving a request
    ├── AllEnginesFailedError   every engine tried failed; `attempts` lists each one
    ├── DeadlineMissError       (recorded, not raised) an engine lost the race past the deadline
    ├── PreemptedError          (recorded, not raised) the device paused the answer for a more
    │                           urgent request; the race moved it to the cloud mid-answer
    ├── StallError              the serving engine sent no token for longer than the policy's
    │                           inter-token limit (`stall_ms`)
    ├── ContinuationError       a continuation did not continue the delivered text (`kind`
    │                           "restart": it began the answer again; "stopped": it ended at
    │                           once mid-sentence): the plan's rule for a failed engine applies
    ├── ContextOverflowError    prompt (+ requested output) does not fit the context
    ├── LocalEngineError        llama.cpp failed during prefill or decode
    ├── InvalidOutputError      a tool call or a JSON answer an engine produced failed its
    │   │                       schema (`what`, `produced`, `problem`): never delivered
    │   ├── UnsureCallError     a valid local call below the policy's `[tools]
    │   │                       min_call_confidence`: the cloud is asked instead
    │   └── UnfitCallError      a valid local call to a tool the request does not name
    │                           (`[tools] min_tool_fit`): the cloud is asked instead
    ├── QueueFullError          the local engine's queue is at its bound (`max_queue`) or the
    │   │                       wait would pass `max_queue_wait_s`: refused at once, never queued
    │   └── CloudQueueTimeoutError  the cloud engine's concurrency limit gave no slot within
    │                           `queue_timeout_s`: nothing was sent
    └── CloudError              an OpenAI-compatible endpoint failed
        ├── CloudConnectionError    connect refused / reset / DNS: nothing or part received
        ├── CloudTimeoutError       the endpoint did not answer in time
        ├── CloudProtocolError      malformed stream, error event inside the stream
        ├── CloudUnavailableError   no API key, or the key was refused: the engine sends
        │                           nothing until `set_api_key()`
        └── CloudStatusError        an HTTP error status (a 4xx other than 429: never retried)
            ├── AuthenticationError 401 / 403
            ├── RateLimitError      429 (retry_after from the header)
            └── ServerError         5xx
```

Each class has one parent: `except ConfigError` catches what the user must fix in arguments or
files, `except RefusedError` every refusal (privacy, budget, no engine allowed; whether routing
or the guard said no), `except EngineError` an engine that failed.

A request that fails a check at the edge (`InvalidArgumentError`, a `PolicyError` for a
`Policy(...)` with a bad field) reaches no engine. An HTTP 4xx other than 429 is the request's
fault, not the endpoint's: it is a plain `CloudStatusError`, never retried and never counted
against the cloud circuit (429 and 5xx are).

Refusals are never retryable: the orchestrator answers from the other engine instead, and the
trace's `refusals` say which engine refused and why. Their messages never hold the matched
secret (only the kinds found) nor the prompt. A refusal is one class whichever layer raises it:
routing's budget refusal is the guard's `BudgetExceededError` with the decision's `reasons`.

Engine errors (and refusals) carry `engine` ("local" or "cloud") and `received_content`: whether
any content token of this request had already been delivered when the failure happened. Callers
use it to decide between a retry (nothing delivered) and a continuation (some text delivered).

Deprecated names, kept for one release (a `DeprecationWarning` on use): `RequestRefusedError`
is `RefusedError`, `PrivacyRefusedError` is `PrivacyBlockedError`, `BudgetRefusedError` is
`BudgetExceededError`.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal


class HybridError(Exception):
    """Base class of every error raised by hybridllm."""


class ConfigError(HybridError):
    """Bad input from the user (arguments, files)."""


class InvalidArgumentError(ConfigError):
    """An argument of a public call (`HybridClient.stream`, an engine, a CLI option) failed its
    check. `argument`: its name ("temperature", "messages[1].content", "--max-tokens");
    `value`: what was given; `rule`: what it must be ("a number from 0 to 2")."""

    def __init__(self, argument: str, value: object, rule: str) -> None:
        self.argument = argument
        self.value = value
        self.rule = rule
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{argument} must be {rule}, not {shown}")


class ManifestError(ConfigError):
    def __init__(self, message: str, *, path: Path | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class PolicyError(ConfigError):
    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        field: str | None = None,
        suggestion: str | None = None,
    ) -> None:
        """`field`: the dotted field at fault; `suggestion`: for an unknown field, the closest
        known name ("ttft_deadline_ms" for "ttft_deadline"; None: none is close)."""
        self.path = path
        self.field = field
        self.suggestion = suggestion
        where = ": ".join(str(p) for p in (path, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class ModelError(HybridError):
    def __init__(self, message: str, *, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(f"{message}: {self.path}")


class ModelNotFoundError(ModelError):
    """The model file does not exist (or a manifest name has not been pulled)."""


# why a model file cannot be used although it exists (`ModelCorruptError.reason`)
CorruptProblem = Literal["bad_magic", "malformed", "truncated", "checksum", "load_failed"]


class ModelCorruptError(ModelError):
    """The model file exists but llama.cpp cannot load it, or its checksum is wrong.
    `reason`: the code of why (`CorruptProblem`); "load_failed" where nothing finer is known."""

    def __init__(
        self, message: str, *, path: Path | str, reason: CorruptProblem = "load_failed"
    ) -> None:
        self.reason = reason
        super().__init__(message, path=path)


class ModelUnsupportedError(ModelError):
    """A whole, well-formed GGUF that this build of llama.cpp cannot run (most often an
    architecture newer than the build): `architecture` names the file's
    (`general.architecture`)."""

    def __init__(self, message: str, *, path: Path | str, architecture: str) -> None:
        self.architecture = architecture
        super().__init__(message, path=path)


class ModelTooLargeError(ModelError):
    """The model at the asked context needs more memory than the device has free: refused
    before loading (an out-of-memory kill otherwise). The figures are estimates from the
    GGUF's own metadata, in bytes; `n_ctx` is the context asked for."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str,
        need_bytes: int,
        available_bytes: int,
        weights_bytes: int,
        kv_bytes: int,
        n_ctx: int,
    ) -> None:
        self.need_bytes, self.available_bytes = need_bytes, available_bytes
        self.weights_bytes, self.kv_bytes, self.n_ctx = weights_bytes, kv_bytes, n_ctx
        super().__init__(message, path=path)


# why a router artifact cannot be used (`RouterArtifactError.reason`, a code to branch on)
ArtifactProblem = Literal["missing", "tampered", "version", "malformed"]


class RouterArtifactError(ModelError):
    """A router artifact cannot be used. `reason`: the code of why (`ArtifactProblem`:
    "missing", "tampered", "version" or "malformed"); the message says it in words."""

    def __init__(self, message: str, *, path: Path | str, reason: ArtifactProblem) -> None:
        self.reason = reason
        super().__init__(message, path=path)


class RouterThresholdError(ConfigError):
    """A router threshold was asked for with wrong arguments or a floor it cannot meet."""


class DecisionLogError(ConfigError):
    """The decision log was used wrongly (an unknown request id, a bad value)."""


class MissingExtraError(ConfigError):
    """A feature needs an optional extra (`pip install 'hybridllm[<extra>]'`) that is not
    installed: `extra` names it, `module` is what failed to import."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{feature} needs {module}, which is not installed: pip install 'hybridllm[{extra}]'"
        )


class TuneError(ModelError):
    """`hybridllm tune` could not load or measure the model with some settings."""


class PullError(HybridError):
    """Fetching or assembling a model failed; no partial file was left behind."""


# why a model named on the Hugging Face hub could not be had (`HubError.reason`)
HubProblem = Literal[
    "repo_not_found",  # no such repository (or private, and the token does not reach it)
    "file_not_found",  # the repository has no such file, or no GGUF of the asked quantization
    "ambiguous",  # several GGUF files match the asked quantization: name the file
    "gated",  # a gated repository, and no token (or one without access)
    "offline_missing",  # offline (HF_HUB_OFFLINE=1) and the file is not in the cache
    "checksum",  # the downloaded bytes are not the hub's sha256 (the file was removed)
    "not_gguf",  # the file is not a GGUF model
    "network",  # the hub could not be reached or broke off (a partial file resumes later)
]


class HubError(PullError):
    """A model named on the Hugging Face hub (`hf://...`) could not be had. `ref`: what was
    asked; `reason`: the code of why (`HubProblem`); the message says what to do."""

    def __init__(self, message: str, *, ref: str, reason: HubProblem) -> None:
        self.ref, self.reason = ref, reason
        super().__init__(f"{ref}: {message}")


class ClientStateError(HybridError):
    """The client or a stream was used outside its lifetime (not entered, already closed)."""


class AnswerTimeoutError(HybridError, TimeoutError):
    """`complete(..., timeout=)` ran out before the whole answer came: nothing of it is lost,
    `text` and `tool_calls` hold what had come, `trace` the closed request's record."""

    def __init__(
        self, timeout_s: float, *, text: str, tool_calls: tuple[object, ...], trace: object
    ) -> None:
        self.timeout_s = timeout_s
        self.text = text
        self.tool_calls = tool_calls
        self.trace = trace
        super().__init__(
            f"no whole answer within {timeout_s:g} s ({len(text)} characters had come)"
        )


class InternalError(HybridError):
    """A fault inside hybridllm itself (a bug, not the engines' nor the user's): what the
    request raised is its `__cause__`. `received_content`: whether text had been delivered."""

    def __init__(self, message: str, *, received_content: bool = False) -> None:
        self.received_content = received_content
        super().__init__(message)


class ServerStartError(HybridError, RuntimeError):
    """A server of `hybridllm.testing` (`LlamaServer`, `HybridServer`) exited early or did not
    answer ``GET /v1/models`` in time."""


class RefusedError(HybridError):
    """The request was refused before anything of it was sent to `engine`: by routing (no
    engine may serve it; `reasons` are the decision's, `engine` is None when no engine was
    allowed at all) or by the guard at the cloud seam (`reasons` empty). Never retryable;
    `received_content`: whether content of this request had been delivered before (a refused
    continuation), as on `EngineError`."""

    def __init__(
        self,
        message: str,
        *,
        engine: str | None = None,
        reasons: tuple[str, ...] = (),
        received_content: bool = False,
    ) -> None:
        self.engine = engine
        self.reasons = reasons
        self.received_content = received_content
        why = f" (decision: {'; '.join(reasons)})" if reasons else ""
        super().__init__(message + why)

    @property
    def retryable(self) -> bool:
        return False


class PrivacyBlockedError(RefusedError):
    """The request holds personal or secret data and the privacy mode keeps it on the device.

    `kinds`: the kinds found (for example ("card", "email")); the matched text is never kept.
    `reasons`: the routing decision's reasons when routing refused the request (a forced
    `engine="cloud"`, or privacy "block"); empty when the guard at the cloud seam refused it.
    """

    def __init__(
        self, kinds: tuple[str, ...], *, engine: str = "cloud", reasons: tuple[str, ...] = ()
    ) -> None:
        self.kinds = kinds
        super().__init__(
            f"privacy: the request contains {', '.join(kinds)}; the privacy mode keeps it on the "
            f"device, nothing was sent to the {engine} engine",
            engine=engine,
            reasons=reasons,
        )


def _usd_format(*amounts: float) -> str:
    """A fixed-point format with at least 6 decimals and 3 significant digits of the smallest
    non-zero amount, so a message never prints two different amounts as the same figure."""
    small = min((abs(a) for a in amounts if a), default=1.0)
    digits = 6 if small >= 1e-3 else min(12, 2 - math.floor(math.log10(small)))
    return f".{digits}f"


class BudgetExceededError(RefusedError):
    """The request's worst-case cost does not fit under a cap (USD figures as plain floats).
    The guard raises it on a cloud request; routing raises the same refusal `with_reasons()`
    when the budget leaves no engine to serve the request."""

    def __init__(
        self,
        *,
        cap: str,
        limit_usd: float,
        spent_usd: float,
        reserved_usd: float,
        needed_usd: float,
        engine: str = "cloud",
        reasons: tuple[str, ...] = (),
        per_user: bool = False,
        tenant: str | None = None,
    ) -> None:
        self.cap = cap
        self.per_user = per_user  # the cap was the end user's (`Cap.per_user`), not the app's
        self.tenant = tenant  # the cap was this tenant's (a gateway key's name: `Cap.tenant`)
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self.reserved_usd = reserved_usd
        self.needed_usd = needed_usd
        usd = _usd_format(limit_usd, spent_usd, reserved_usd, needed_usd)
        super().__init__(
            f"budget: {cap} cap of ${limit_usd:{usd}} cannot cover this request (spent "
            f"${spent_usd:{usd}}, reserved by requests in flight ${reserved_usd:{usd}}, this "
            f"request needs up to ${needed_usd:{usd}}); nothing was sent to the {engine} engine",
            engine=engine,
            reasons=reasons,
        )

    def with_reasons(self, reasons: tuple[str, ...]) -> BudgetExceededError:
        """The same refusal, as routing raises it: with the decision's `reasons`."""
        return BudgetExceededError(
            cap=self.cap,
            limit_usd=self.limit_usd,
            spent_usd=self.spent_usd,
            reserved_usd=self.reserved_usd,
            needed_usd=self.needed_usd,
            engine=self.engine or "cloud",
            reasons=reasons,
            per_user=self.per_user,
            tenant=self.tenant,
        )


class LedgerUnavailableError(BudgetExceededError):
    """The budget ledger cannot be reached (its Redis server is down or unreachable), so no cap
    can be checked: the cloud request is refused as over budget (the ledger fails closed, and
    routing answers locally). `ledger`: which one (its URL, never the password); `cause`: what
    failed, as its type and message."""

    def __init__(
        self,
        ledger: str,
        cause: str,
        *,
        needed_usd: float = 0.0,
        reasons: tuple[str, ...] = (),
    ) -> None:
        self.ledger = ledger
        self.cause = cause
        self.cap = f"ledger {ledger}"
        self.per_user, self.tenant = False, None
        self.limit_usd = self.spent_usd = self.reserved_usd = 0.0
        self.needed_usd = needed_usd
        RefusedError.__init__(
            self,
            f"budget: the ledger {ledger} cannot be reached ({cause}), so no cap can be "
            "checked; nothing was sent to the cloud engine",
            engine="cloud",
            reasons=reasons,
        )

    def with_reasons(self, reasons: tuple[str, ...]) -> LedgerUnavailableError:
        """The same refusal, as routing raises it: with the decision's `reasons`."""
        return LedgerUnavailableError(
            self.ledger, self.cause, needed_usd=self.needed_usd, reasons=reasons
        )


class RateLimitedError(BudgetExceededError):
    """An end user sent more cloud requests this minute than the policy lets one user send
    (`[limits] per_user_rpm`): refused, like a cap (the request goes local or fails, as
    `[budget] on_exceeded` says). `limit_rpm`: the limit; `retry_after_s`: when the user's
    minute ends."""

    def __init__(
        self,
        limit_rpm: int,
        retry_after_s: float,
        *,
        engine: str = "cloud",
        reasons: tuple[str, ...] = (),
    ) -> None:
        self.limit_rpm, self.retry_after_s = limit_rpm, retry_after_s
        self.cap = f"per-user {limit_rpm} cloud requests a minute"
        self.per_user, self.tenant = True, None
        self.limit_usd = self.spent_usd = self.reserved_usd = self.needed_usd = 0.0
        RefusedError.__init__(
            self,
            f"rate: this user sent {limit_rpm} cloud requests this minute, the policy's limit; "
            f"nothing was sent to the {engine} engine (its minute ends in {retry_after_s:.1f} s)",
            engine=engine,
            reasons=reasons,
        )

    def with_reasons(self, reasons: tuple[str, ...]) -> RateLimitedError:
        return RateLimitedError(
            self.limit_rpm, self.retry_after_s, engine=self.engine or "cloud", reasons=reasons
        )


class EngineError(HybridError):
    """An engine failed while serving a request."""

    def __init__(self, message: str, *, engine: str, received_content: bool = False) -> None:
        self.engine = engine
        self.received_content = received_content
        super().__init__(message)

    @property
    def retryable(self) -> bool:
        return False


class AllEnginesFailedError(EngineError):
    """No engine could answer. `attempts`: (engine, error, ms since the stream() call) each."""

    def __init__(
        self, attempts: list[tuple[str, BaseException, float]], *, received_content: bool
    ) -> None:
        self.attempts = attempts
        lines = "; ".join(
            f"{eng} at {ms:.0f} ms: {type(e).__name__}: {e}" for eng, e, ms in attempts
        )
        super().__init__(
            f"no engine could answer ({lines})",
            engine=attempts[-1][0] if attempts else "local",
            received_content=received_content,
        )


class DeadlineMissError(EngineError):
    """An engine produced no token before the deadline and lost the race (health bookkeeping)."""


class PreemptedError(EngineError):
    """The local engine paused this answer to serve a more urgent request (preemption,
    `engines.queue`). A race whose policy allows the cloud moves the answer there at once, as a
    continuation of the delivered text (`Trace.switches` says so); elsewhere the engine resumes
    it itself and nothing is raised."""


class StallError(EngineError):
    """The serving engine went quiet for longer than the policy's inter-token limit.

    Like a timeout, it is retryable only while nothing was delivered; a stall is noticed only
    once an engine is streaming, so the race answers it with a continuation on the other engine
    (and raises it only where no continuation is possible)."""

    @classmethod
    def after(cls, limit_s: float, engine: str) -> StallError:
        """The stall of a streaming `engine` (text already delivered) past `limit_s`."""
        return cls(f"no token for {limit_s * 1e3:.0f} ms", engine=engine, received_content=True)

    @property
    def retryable(self) -> bool:
        return not self.received_content


class ContinuationError(EngineError):
    """The continuing engine did not continue the delivered text (`runtime.seam`): `kind`
    "restart" (it began the answer again and left it before the seam) or "stopped" (it ended
    at once where the delivered text stops mid-sentence); `produced`: its opening text. Nothing
    of it was delivered."""

    def __init__(self, engine: str, kind: str, produced: str) -> None:
        self.kind = kind
        self.produced = produced
        what = "began the answer again" if kind == "restart" else "stopped mid-sentence"
        super().__init__(
            f"the {engine} engine's continuation {what} ({produced[:60]!r})",
            engine=engine,
            received_content=True,
        )


class ContextOverflowError(EngineError):
    def __init__(self, *, engine: str, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"prompt of {prompt_tokens} tokens (+{max_tokens} requested output tokens) does not "
            f"fit the {engine} engine's context of {n_ctx} tokens",
            engine=engine,
        )


class LocalEngineError(EngineError):
    pass


class InvalidOutputError(EngineError):
    """A tool call (`what` "tool_call"), a JSON answer (`what` "json") or an answer to a tool
    result that only echoes it (`what` "echo") that `engine` produced does not hold against
    the request's tools, response format or last turn: `produced` is what
    it produced (the call as `name(arguments)`, or the answer's text), `problem` what is wrong.
    Never delivered to the app: the request escalates to the other engine where the policy
    allows, else this is raised."""

    def __init__(self, engine: str, what: str, produced: str, problem: str) -> None:
        self.what = what
        self.produced = produced
        self.problem = problem
        shown = produced if len(produced) <= 200 else produced[:197] + "..."
        kind = {"tool_call": "tool call", "json": "JSON answer"}.get(what, "answer")
        super().__init__(f"the {engine} engine's {kind} {shown!r} is {problem}", engine=engine)


class UnsureCallError(InvalidOutputError):
    """A valid tool call whose engine's own `confidence` is below `threshold` (the policy's
    `[tools] min_call_confidence`), where the cloud may answer instead: not delivered, the
    request escalates."""

    def __init__(self, engine: str, produced: str, confidence: float, threshold: float) -> None:
        self.confidence = confidence
        self.threshold = threshold
        problem = f"a call its engine is unsure of (confidence {confidence:.2f} < {threshold:g})"
        super().__init__(engine, "tool_call", produced, problem)


class UnfitCallError(InvalidOutputError):
    """A valid tool call to a tool whose name the request hardly states (`fit`, the share of
    the name's words the request has, below `threshold`: the policy's `[tools] min_tool_fit`;
    `hybridllm.tools.fit`), where the cloud may answer instead: not delivered, the request
    escalates. A small model calls some offered tool even where none fits."""

    def __init__(self, engine: str, produced: str, fit: float, threshold: float) -> None:
        self.fit = fit
        self.threshold = threshold
        problem = f"a call to a tool the request does not name (fit {fit:.2f} < {threshold:g})"
        super().__init__(engine, "tool_call", produced, problem)


class QueueFullError(EngineError):
    """The engine's queue is at its bound: `waiting` requests already wait (`max_queue`), or
    this request would wait (or has waited) longer than `max_queue_wait_s`. Raised before the
    request reaches the model, so the race answers it from the other engine at once; not
    retryable on the same engine (a retry would only join the same queue)."""

    def __init__(
        self,
        message: str,
        *,
        engine: str = "local",
        waiting: int,
        max_queue: int | None,
        max_queue_wait_s: float | None,
    ) -> None:
        self.waiting = waiting
        self.max_queue = max_queue
        self.max_queue_wait_s = max_queue_wait_s
        super().__init__(message, engine=engine)


class CloudQueueTimeoutError(QueueFullError):
    """The cloud engine's concurrency limit (`OpenAIEngine(max_concurrency=...)`) gave this
    request no slot within `queue_timeout_s` (Retry-After of a 429 counts as waiting). Nothing
    was sent, so the race answers it from the local engine at once; not retried on the same
    engine, and not held against the endpoint's circuit (the limit is the client's own)."""

    def __init__(
        self,
        message: str,
        *,
        engine: str = "cloud",
        waiting: int,
        max_concurrency: int | None,
        queue_timeout_s: float | None,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.queue_timeout_s = queue_timeout_s
        super().__init__(
            message,
            engine=engine,
            waiting=waiting,
            max_queue=None,
            max_queue_wait_s=queue_timeout_s,
        )


class CloudError(EngineError):
    def __init__(self, message: str, *, received_content: bool = False) -> None:
        super().__init__(message, engine="cloud", received_content=received_content)


class CloudConnectionError(CloudError):
    @property
    def retryable(self) -> bool:
        return not self.received_content


class CloudTimeoutError(CloudError):
    @property
    def retryable(self) -> bool:
        return not self.received_content


class CloudProtocolError(CloudError):
    pass


class CloudUnavailableError(CloudError):
    """The cloud engine is off for a configuration reason and sent nothing: no API key, or the
    endpoint refused the key (401/403) and the engine stopped sending until the key changes.
    `reason` says which and what to do; `status_code` is the refusal's status (None: no key)."""

    def __init__(self, reason: str, *, status_code: int | None = None) -> None:
        self.reason = reason
        self.status_code = status_code
        super().__init__(f"the cloud engine is unavailable: {reason}")


class CloudStatusError(CloudError):
    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        retry_after: float | None = None,
        received_content: bool = False,
    ) -> None:
        self.status_code = status_code
        self.retry_after = retry_after
        super().__init__(f"HTTP {status_code}: {message}", received_content=received_content)


class AuthenticationError(CloudStatusError):
    pass


class RateLimitError(CloudStatusError):
    @property
    def retryable(self) -> bool:
        return not self.received_content


class ServerError(CloudStatusError):
    @property
    def retryable(self) -> bool:
        return not self.received_content


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error a failed task group stands for: its first HybridError if any (nested groups
    flattened), else its first error."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    hybrid = [e for e in leaves if isinstance(e, HybridError)]
    return (hybrid or leaves)[0]


def typed(exc: BaseException, *, received_content: bool = False) -> HybridError:
    """What a request's failure is to the app: a HybridError, never an `ExceptionGroup`. A
    group stands for its first HybridError (`first_error`); any other error is an
    `InternalError` whose cause it is."""
    leaf = first_error(exc) if isinstance(exc, BaseExceptionGroup) else exc
    if isinstance(leaf, HybridError):
        return leaf
    wrapped = InternalError(f"{type(leaf).__name__}: {leaf}", received_content=received_content)
    wrapped.__cause__ = leaf
    return wrapped


# ---- deprecated names ----------------------------------------------------------------------

_DEPRECATED = {
    "RequestRefusedError": "RefusedError",
    "PrivacyRefusedError": "PrivacyBlockedError",
    "BudgetRefusedError": "BudgetExceededError",
}

if not TYPE_CHECKING:  # type checkers see only the current names

    def __getattr__(name: str) -> type[HybridError]:
        new = _DEPRECATED.get(name)
        if new is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"hybridllm.errors.{name} is deprecated: it is {new} now (every refusal is a "
            "RefusedError)",
            DeprecationWarning,
            stacklevel=2,
        )
        cls: type[HybridError] = globals()[new]
        return cls
