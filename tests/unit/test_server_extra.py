"""The `server` extra in pyproject.toml lists exactly the third-party packages that
`hybridllm/server/*.py` imports beyond the core dependencies: each one it needs, none more."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "hybridllm" / "server"


def _name(requirement: str) -> str:
    """The distribution's normalised name ("Starlette>=0.37" -> "starlette")."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _imported(path: Path) -> set[str]:
    """The top-level modules a file imports (absolute imports only; nested ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _third_party() -> set[str]:
    modules: set[str] = set()
    for path in SERVER.glob("*.py"):
        modules |= _imported(path)
    stdlib = sys.stdlib_module_names | {"__future__"}
    # each of these import names is its distribution's name (checked when one is added)
    return {_name(m) for m in modules if m not in stdlib and m != "hybridllm"}


def test_the_server_extra_is_what_the_server_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extra = {_name(r) for r in project["optional-dependencies"]["server"]}
    needed = _third_party() - core
    assert needed, "the server imports something beyond the core dependencies (starlette)"
    assert needed - extra == set(), "imported by hybridllm/server but not in the server extra"
    assert extra - needed == set(), "in the server extra but not imported by hybridllm/server"
