"""hybridllm: one async streaming API over a local GGUF model and any OpenAI-compatible cloud."""

# ruff: noqa: E402  (the wait policy must be set before any module that may load llama.cpp)

# llama.cpp's OpenMP threads spin while they wait by default; on a machine where anything else
# runs (the app itself, a browser, a loopback server) two spinning threads on two cores made
# decode about 10x slower than passive waiting (README, "Local speed"). The policy is read when
# llama.cpp loads, so it is chosen here: the environment's, else the device's tuned choice
# (`hybridllm tune --dedicated`), else passive.
from hybridllm.waitpolicy import apply as _apply_wait_policy

_apply_wait_policy()

from hybridllm.budget import Cap, Ledger, ModelPrice, Prices
from hybridllm.client import Completion, HybridClient
from hybridllm.engines import (
    Engine,
    GenerationRequest,
    LlamaCppEngine,
    OpenAIEngine,
    ScriptedEngine,
)
from hybridllm.engines.guarded import GuardedEngine
from hybridllm.errors import (
    AllEnginesFailedError,
    AuthenticationError,
    BudgetExceededError,
    ClientStateError,
    CloudConnectionError,
    CloudError,
    CloudProtocolError,
    CloudStatusError,
    CloudTimeoutError,
    ConfigError,
    ContextOverflowError,
    DecisionLogError,
    EngineError,
    HybridError,
    LocalEngineError,
    ManifestError,
    ModelCorruptError,
    ModelError,
    ModelNotFoundError,
    PolicyError,
    PrivacyBlockedError,
    PullError,
    RateLimitError,
    RefusedError,
    RequestRefusedError,
    RouterArtifactError,
    RouterThresholdError,
    ServerError,
    TuneError,
)
from hybridllm.events import Done, Event, Fallback, Hedge, Route, Token, Usage
from hybridllm.policy import Policy
from hybridllm.stream import Stream
from hybridllm.trace import Trace

__all__ = [
    "AuthenticationError",
    "BudgetExceededError",
    "Cap",
    "GuardedEngine",
    "Ledger",
    "ModelPrice",
    "Prices",
    "PrivacyBlockedError",
    "RefusedError",
    "ClientStateError",
    "CloudConnectionError",
    "CloudError",
    "CloudProtocolError",
    "CloudStatusError",
    "CloudTimeoutError",
    "Completion",
    "ConfigError",
    "ContextOverflowError",
    "DecisionLogError",
    "Done",
    "Engine",
    "EngineError",
    "Event",
    "Fallback",
    "Hedge",
    "AllEnginesFailedError",
    "GenerationRequest",
    "HybridClient",
    "HybridError",
    "LlamaCppEngine",
    "LocalEngineError",
    "ManifestError",
    "ModelCorruptError",
    "TuneError",
    "ModelError",
    "ModelNotFoundError",
    "OpenAIEngine",
    "Policy",
    "PolicyError",
    "PullError",
    "RateLimitError",
    "RequestRefusedError",
    "RouterArtifactError",
    "RouterThresholdError",
    "Route",
    "ServerError",
    "ScriptedEngine",
    "Stream",
    "Token",
    "Trace",
    "Usage",
]
