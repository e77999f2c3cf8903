"""hybridllm: one async streaming API over a local GGUF model and any OpenAI-compatible cloud.

The public names load on first use (`hybridllm._lazy`): `import hybridllm` loads no numpy,
openai, llama.cpp or scikit-learn, and changes no environment variable. llama.cpp's OpenMP wait
policy is set by the one loader of llama.cpp (`hybridllm.local.loader`) just before it loads.

Rooms (ARCHITECTURE.md): the public face here (client, policy, errors, events); `runtime/`
(stream, plans, retry, circuit, latency, trace); `routing/` (features, router, decide);
`guard/` (budget, prices, privacy, the guarded cloud engine); `engines/`; `local/` (models,
variants, tuning, wait policy, the llama.cpp loader); `cli/`; `testing/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridllm._lazy import lazy

_NAMES = {
    "Cap": "hybridllm.guard.budget",
    "Ledger": "hybridllm.guard.budget",
    "ModelPrice": "hybridllm.guard.prices",
    "Prices": "hybridllm.guard.prices",
    "Completion": "hybridllm.client",
    "RouterScore": "hybridllm.routing.score",
    "HybridClient": "hybridllm.client",
    "Engine": "hybridllm.engines.base",
    "GenerationRequest": "hybridllm.engines.base",
    "LlamaOptions": "hybridllm.engines.options",
    "OpenAIOptions": "hybridllm.engines.options",
    "LlamaCppEngine": "hybridllm.engines.llamacpp",
    "OpenAIEngine": "hybridllm.engines.openai_engine",
    "ScriptedEngine": "hybridllm.engines.scripted",
    "GuardedEngine": "hybridllm.guard.guarded",
    "AllEnginesFailedError": "hybridllm.errors",
    "AuthenticationError": "hybridllm.errors",
    "BudgetExceededError": "hybridllm.errors",
    "ClientStateError": "hybridllm.errors",
    "CloudConnectionError": "hybridllm.errors",
    "CloudError": "hybridllm.errors",
    "CloudProtocolError": "hybridllm.errors",
    "CloudStatusError": "hybridllm.errors",
    "CloudTimeoutError": "hybridllm.errors",
    "CloudUnavailableError": "hybridllm.errors",
    "ConfigError": "hybridllm.errors",
    "ContextOverflowError": "hybridllm.errors",
    "DecisionLogError": "hybridllm.errors",
    "EngineError": "hybridllm.errors",
    "HybridError": "hybridllm.errors",
    "InvalidArgumentError": "hybridllm.errors",
    "LocalEngineError": "hybridllm.errors",
    "ManifestError": "hybridllm.errors",
    "ModelCorruptError": "hybridllm.errors",
    "ModelError": "hybridllm.errors",
    "ModelNotFoundError": "hybridllm.errors",
    "PolicyError": "hybridllm.errors",
    "PreemptedError": "hybridllm.errors",
    "CloudQueueTimeoutError": "hybridllm.errors",
    "PrivacyBlockedError": "hybridllm.errors",
    "PrivacyRefusedError": "hybridllm.errors",
    "BudgetRefusedError": "hybridllm.errors",
    "PullError": "hybridllm.errors",
    "QueueFullError": "hybridllm.errors",
    "RateLimitError": "hybridllm.errors",
    "RefusedError": "hybridllm.errors",
    "RequestRefusedError": "hybridllm.errors",
    "RouterArtifactError": "hybridllm.errors",
    "RouterThresholdError": "hybridllm.errors",
    "ServerError": "hybridllm.errors",
    "StallError": "hybridllm.errors",
    "TuneError": "hybridllm.errors",
    "CloudUnavailable": "hybridllm.events",
    "Done": "hybridllm.events",
    "Event": "hybridllm.events",
    "Fallback": "hybridllm.events",
    "Handoff": "hybridllm.events",
    "Hedge": "hybridllm.events",
    "ParallelStart": "hybridllm.events",
    "Paused": "hybridllm.events",
    "Route": "hybridllm.events",
    "Token": "hybridllm.events",
    "Usage": "hybridllm.events",
    "Policy": "hybridllm.policy",
    "Stream": "hybridllm.runtime.stream",
    "Trace": "hybridllm.runtime.trace",
}
__getattr__, __dir__ = lazy(__name__, _NAMES)
__all__ = sorted(_NAMES)

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from hybridllm.client import Completion as Completion, HybridClient as HybridClient
    from hybridllm.engines.base import Engine as Engine, GenerationRequest as GenerationRequest
    from hybridllm.engines.llamacpp import LlamaCppEngine as LlamaCppEngine
    from hybridllm.engines.openai_engine import OpenAIEngine as OpenAIEngine
    from hybridllm.engines.options import (
        LlamaOptions as LlamaOptions,
        OpenAIOptions as OpenAIOptions,
    )
    from hybridllm.engines.scripted import ScriptedEngine as ScriptedEngine
    from hybridllm.errors import (
        AllEnginesFailedError as AllEnginesFailedError,
        AuthenticationError as AuthenticationError,
        BudgetExceededError as BudgetExceededError,
        BudgetRefusedError as BudgetRefusedError,
        ClientStateError as ClientStateError,
        CloudConnectionError as CloudConnectionError,
        CloudError as CloudError,
        CloudProtocolError as CloudProtocolError,
        CloudQueueTimeoutError as CloudQueueTimeoutError,
        CloudStatusError as CloudStatusError,
        CloudTimeoutError as CloudTimeoutError,
        CloudUnavailableError as CloudUnavailableError,
        ConfigError as ConfigError,
        ContextOverflowError as ContextOverflowError,
        DecisionLogError as DecisionLogError,
        EngineError as EngineError,
        HybridError as HybridError,
        InvalidArgumentError as InvalidArgumentError,
        LocalEngineError as LocalEngineError,
        ManifestError as ManifestError,
        ModelCorruptError as ModelCorruptError,
        ModelError as ModelError,
        ModelNotFoundError as ModelNotFoundError,
        PolicyError as PolicyError,
        PreemptedError as PreemptedError,
        PrivacyBlockedError as PrivacyBlockedError,
        PrivacyRefusedError as PrivacyRefusedError,
        PullError as PullError,
        QueueFullError as QueueFullError,
        RateLimitError as RateLimitError,
        RefusedError as RefusedError,
        RequestRefusedError as RequestRefusedError,
        RouterArtifactError as RouterArtifactError,
        RouterThresholdError as RouterThresholdError,
        ServerError as ServerError,
        StallError as StallError,
        TuneError as TuneError,
    )
    from hybridllm.events import (
        CloudUnavailable as CloudUnavailable,
        Done as Done,
        Event as Event,
        Fallback as Fallback,
        Handoff as Handoff,
        Hedge as Hedge,
        ParallelStart as ParallelStart,
        Paused as Paused,
        Route as Route,
        Token as Token,
        Usage as Usage,
    )
    from hybridllm.guard.budget import Cap as Cap, Ledger as Ledger
    from hybridllm.guard.guarded import GuardedEngine as GuardedEngine
    from hybridllm.guard.prices import ModelPrice as ModelPrice, Prices as Prices
    from hybridllm.policy import Policy as Policy
    from hybridllm.routing.score import RouterScore as RouterScore
    from hybridllm.runtime.stream import Stream as Stream
    from hybridllm.runtime.trace import Trace as Trace
