"""hybridllm: one async streaming API over a local GGUF model and any OpenAI-compatible cloud.

The public names load on first use (`hybridllm.lazy_names`): `import hybridllm` loads no numpy,
openai, llama.cpp or scikit-learn, and changes no environment variable. llama.cpp's OpenMP wait
policy is set by the one loader of llama.cpp (`hybridllm.local.loader`) just before it loads.

The public names (`__all__`, listed in ARCHITECTURE.md): the client, `Policy` and the money
types, the engines, the events, `Trace` and its records, the root errors and `RefusedError`,
and `log_content` (the opt-in for prompt and answer text in log records, `hybridllm.logs`). The
whole error tree is `hybridllm.errors`; `ScriptedEngine` and the test tooling `hybridllm.testing`.

Rooms (ARCHITECTURE.md): the public face here (client, policy, errors, events); `runtime/`
(stream, plans, retry, circuit, latency, trace); `routing/` (features, router, decide);
`guard/` (budget, prices, privacy, the guarded cloud engine); `engines/`; `local/` (models,
variants, tuning, wait policy, the llama.cpp loader); `cli/`; `testing/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridllm.lazy_names import lazy

_NAMES = {
    "Completion": "hybridllm.client",
    "HybridClient": "hybridllm.client",
    "Stream": "hybridllm.runtime.stream",
    "Policy": "hybridllm.policy",
    "Cap": "hybridllm.guard.budget",
    "Quota": "hybridllm.guard.budget",
    "Tenant": "hybridllm.policy",
    "Ledger": "hybridllm.guard.budget",
    "SQLiteLedger": "hybridllm.guard.budget",
    "RedisLedger": "hybridllm.guard.budget_redis",
    "ledger_from_url": "hybridllm.guard.ledgers",
    "ModelPrice": "hybridllm.guard.prices",
    "Prices": "hybridllm.guard.prices",
    "Engine": "hybridllm.engines.base",
    "GenerationRequest": "hybridllm.engines.base",
    "LlamaOptions": "hybridllm.engines.options",
    "OpenAIOptions": "hybridllm.engines.options",
    "LlamaCppEngine": "hybridllm.engines.llamacpp",
    "OpenAIEngine": "hybridllm.engines.openai_engine",
    "ChatTemplate": "hybridllm.engines.template",
    "GuardedEngine": "hybridllm.guard.guarded",
    "RouterScore": "hybridllm.routing.score",
    "RoutePreview": "hybridllm.routing.decision",
    "StreamArgs": "hybridllm.runtime.admission",
    "CloudUnavailable": "hybridllm.events",
    "DeadlineMissed": "hybridllm.events",
    "Done": "hybridllm.events",
    "Draft": "hybridllm.events",
    "Event": "hybridllm.events",
    "Fallback": "hybridllm.events",
    "Handoff": "hybridllm.events",
    "Hedge": "hybridllm.events",
    "ParallelStart": "hybridllm.events",
    "PartialJSON": "hybridllm.events",
    "Paused": "hybridllm.events",
    "Retract": "hybridllm.events",
    "Route": "hybridllm.events",
    "Token": "hybridllm.events",
    "ToolCall": "hybridllm.events",
    "Usage": "hybridllm.events",
    "CascadeRecord": "hybridllm.runtime.trace",
    "HandoffRecord": "hybridllm.runtime.trace",
    "Pause": "hybridllm.runtime.trace",
    "Speculation": "hybridllm.runtime.trace",
    "Spend": "hybridllm.runtime.trace",
    "Switch": "hybridllm.runtime.trace",
    "Trace": "hybridllm.runtime.trace",
    "Attempt": "hybridllm.runtime.trace",
    "Telemetry": "hybridllm.telemetry",
    "StatsReport": "hybridllm.telemetry",
    "ClientStateError": "hybridllm.errors",
    "ConfigError": "hybridllm.errors",
    "EngineError": "hybridllm.errors",
    "HybridError": "hybridllm.errors",
    "ModelError": "hybridllm.errors",
    "PullError": "hybridllm.errors",
    "RefusedError": "hybridllm.errors",
    "log_content": "hybridllm.logs",
}
# names that left the public set (issue 24): still importable, with a DeprecationWarning
_MOVED = {
    name: "hybridllm.errors"
    for name in (
        "AllEnginesFailedError",
        "AuthenticationError",
        "BudgetExceededError",
        "BudgetRefusedError",
        "CloudConnectionError",
        "CloudError",
        "CloudProtocolError",
        "CloudQueueTimeoutError",
        "CloudStatusError",
        "CloudTimeoutError",
        "CloudUnavailableError",
        "ContextOverflowError",
        "DecisionLogError",
        "InvalidArgumentError",
        "LocalEngineError",
        "ManifestError",
        "ModelCorruptError",
        "ModelNotFoundError",
        "PolicyError",
        "PreemptedError",
        "PrivacyBlockedError",
        "PrivacyRefusedError",
        "QueueFullError",
        "RateLimitError",
        "RequestRefusedError",
        "RouterArtifactError",
        "RouterThresholdError",
        "ServerError",
        "StallError",
        "TuneError",
    )
}
_MOVED["ScriptedEngine"] = "hybridllm.testing"
__getattr__, __dir__ = lazy(__name__, _NAMES, _MOVED)
__all__ = sorted(_NAMES)

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from hybridllm.client import (
        Completion as Completion,
        HybridClient as HybridClient,
    )
    from hybridllm.engines.base import (
        Engine as Engine,
        GenerationRequest as GenerationRequest,
    )
    from hybridllm.engines.llamacpp import LlamaCppEngine as LlamaCppEngine
    from hybridllm.engines.openai_engine import OpenAIEngine as OpenAIEngine
    from hybridllm.engines.options import (
        LlamaOptions as LlamaOptions,
        OpenAIOptions as OpenAIOptions,
    )
    from hybridllm.engines.template import ChatTemplate as ChatTemplate
    from hybridllm.errors import (
        ClientStateError as ClientStateError,
        ConfigError as ConfigError,
        EngineError as EngineError,
        HybridError as HybridError,
        ModelError as ModelError,
        PullError as PullError,
        RefusedError as RefusedError,
    )
    from hybridllm.events import (
        CloudUnavailable as CloudUnavailable,
        DeadlineMissed as DeadlineMissed,
        Done as Done,
        Draft as Draft,
        Event as Event,
        Fallback as Fallback,
        Handoff as Handoff,
        Hedge as Hedge,
        ParallelStart as ParallelStart,
        PartialJSON as PartialJSON,
        Paused as Paused,
        Retract as Retract,
        Route as Route,
        Token as Token,
        ToolCall as ToolCall,
        Usage as Usage,
    )
    from hybridllm.guard.budget import (
        Cap as Cap,
        Ledger as Ledger,
        Quota as Quota,
        SQLiteLedger as SQLiteLedger,
    )
    from hybridllm.guard.budget_redis import RedisLedger as RedisLedger
    from hybridllm.guard.guarded import GuardedEngine as GuardedEngine
    from hybridllm.guard.ledgers import ledger_from_url as ledger_from_url
    from hybridllm.guard.prices import (
        ModelPrice as ModelPrice,
        Prices as Prices,
    )
    from hybridllm.logs import log_content as log_content
    from hybridllm.policy import Policy as Policy, Tenant as Tenant
    from hybridllm.routing.decision import RoutePreview as RoutePreview
    from hybridllm.routing.score import RouterScore as RouterScore
    from hybridllm.runtime.admission import StreamArgs as StreamArgs
    from hybridllm.runtime.stream import Stream as Stream
    from hybridllm.runtime.trace import (
        Attempt as Attempt,
        CascadeRecord as CascadeRecord,
        HandoffRecord as HandoffRecord,
        Pause as Pause,
        Speculation as Speculation,
        Spend as Spend,
        Switch as Switch,
        Trace as Trace,
    )
    from hybridllm.telemetry import (
        StatsReport as StatsReport,
        Telemetry as Telemetry,
    )
