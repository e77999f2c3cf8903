"""Engines: one small async seam (`Engine`) and two real implementations (the scripted double,
`ScriptedEngine`, is public in `hybridllm.testing`).

Each name loads on first use: `LlamaCppEngine` brings llama.cpp only when a model starts, and
`OpenAIEngine` brings the openai SDK only when it is first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridllm.lazy_names import lazy

_NAMES = {
    "Engine": "hybridllm.engines.base",
    "EngineInfo": "hybridllm.engines.base",
    "EngineOptions": "hybridllm.engines.options",
    "GenerationRequest": "hybridllm.engines.base",
    "LlamaOptions": "hybridllm.engines.options",
    "OpenAIOptions": "hybridllm.engines.options",
    "LlamaCppEngine": "hybridllm.engines.llamacpp",
    "OpenAIEngine": "hybridllm.engines.openai_engine",
}
__getattr__, __dir__ = lazy(__name__, _NAMES, {"ScriptedEngine": "hybridllm.testing"})
__all__ = sorted(_NAMES)

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from hybridllm.engines.base import (
        Engine as Engine,
        EngineInfo as EngineInfo,
        GenerationRequest as GenerationRequest,
    )
    from hybridllm.engines.llamacpp import LlamaCppEngine as LlamaCppEngine
    from hybridllm.engines.openai_engine import OpenAIEngine as OpenAIEngine
    from hybridllm.engines.options import (
        EngineOptions as EngineOptions,
        LlamaOptions as LlamaOptions,
        OpenAIOptions as OpenAIOptions,
    )
