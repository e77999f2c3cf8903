"""Lazy public names for a package's `__init__`: a name's module is imported on first access.

    __getattr__, __dir__ = lazy(__name__, {"HybridClient": "hybridllm.client", ...})

So `import hybridllm` costs almost nothing, and numpy, openai, llama.cpp or scikit-learn load
only when the app first touches a name that needs them. `moved` ({name: its home}) keeps names
that left the package's public set working for a while: each use warns (`DeprecationWarning`)
and names the module to import it from; they are not in `dir()`.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    package: str, names: Mapping[str, str], moved: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module `__getattr__` and `__dir__` that resolve `names` ({name: module}) on demand."""
    gone = dict(moved or {})

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None and name in gone:
            warnings.warn(
                f"{package}.{name} is no longer a public name of {package}: import it from "
                f"{gone[name]}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(gone[name]), name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
