"""The one place that loads llama.cpp (`llama_cpp`), with the OpenMP wait policy set first.

OpenMP reads `OMP_WAIT_POLICY` once, when the native library loads, so the policy must be in the
environment before the first `import llama_cpp` of the process (see `waitpolicy`). Every module
of hybridllm that needs llama.cpp asks this loader for it; importing hybridllm itself loads
nothing native and changes no environment variable.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from hybridllm.local import waitpolicy


def llama_cpp() -> ModuleType:
    """The `llama_cpp` module; on first load, the wait policy is applied just before it."""
    module = sys.modules.get("llama_cpp")
    if module is not None:
        return module
    waitpolicy.apply()
    return importlib.import_module("llama_cpp")


def llama_cpp_part(name: str) -> ModuleType:
    """A submodule of llama_cpp (`"llama_chat_format"`, `"_logger"`), loaded the same way."""
    llama_cpp()
    return importlib.import_module(f"llama_cpp.{name}")
