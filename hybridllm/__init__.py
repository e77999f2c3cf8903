"""hybridllm: one async streaming API over a local GGUF model and any OpenAI-compatible cloud."""

from hybridllm.client import Completion, HybridClient
from hybridllm.engines import Engine, GenerationRequest, LlamaCppEngine, OpenAIEngine, ScriptedEngine
from hybridllm.errors import (
    AuthenticationError,
    ClientStateError,
    CloudConnectionError,
    CloudError,
    CloudProtocolError,
    CloudStatusError,
    CloudTimeoutError,
    ConfigError,
    ContextOverflowError,
    EngineError,
    HybridError,
    LocalEngineError,
    ManifestError,
    ModelCorruptError,
    ModelError,
    ModelNotFoundError,
    PolicyError,
    PullError,
    RateLimitError,
    ServerError,
)
from hybridllm.events import Done, Event, Fallback, Route, Token, Usage
from hybridllm.policy import Policy
from hybridllm.stream import Stream
from hybridllm.trace import Trace

__all__ = [
    "AuthenticationError", "ClientStateError", "CloudConnectionError", "CloudError",
    "CloudProtocolError", "CloudStatusError", "CloudTimeoutError", "Completion", "ConfigError",
    "ContextOverflowError", "Done", "Engine", "EngineError", "Event", "Fallback",
    "GenerationRequest", "HybridClient", "HybridError", "LlamaCppEngine", "LocalEngineError",
    "ManifestError", "ModelCorruptError", "ModelError", "ModelNotFoundError", "OpenAIEngine",
    "Policy", "PolicyError", "PullError", "RateLimitError", "Route", "ServerError",
    "ScriptedEngine", "Stream", "Token", "Trace", "Usage",
]
