"""Engines: one small async seam (`Engine`), two real implementations and a scripted double.

`LlamaCppEngine` is imported lazily-cheap: llama_cpp itself loads only when a model starts.
"""

from hybridllm.engines.base import Engine, EngineInfo, GenerationRequest
from hybridllm.engines.llamacpp import LlamaCppEngine
from hybridllm.engines.openai_engine import OpenAIEngine
from hybridllm.engines.scripted import ScriptedEngine

__all__ = [
    "Engine",
    "EngineInfo",
    "GenerationRequest",
    "LlamaCppEngine",
    "OpenAIEngine",
    "ScriptedEngine",
]
