"""The `server` and `gateway` extras in pyproject.toml list exactly the third-party packages that
`hybridllm/server/*.py` and `hybridllm/gateway/*.py` import beyond the core dependencies (and
what the server imports, for the gateway imports the server): each one needed, none more."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybridllm"


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


def _third_party(*rooms: str) -> set[str]:
    modules: set[str] = set()
    for path in (p for room in rooms for p in (PACKAGE / room).glob("*.py")):
        modules |= _imported(path)
    stdlib = sys.stdlib_module_names | {"__future__"}
    # each of these import names is its distribution's name (checked when one is added)
    return {_name(m) for m in modules if m not in stdlib and m != "hybridllm"}


@pytest.mark.parametrize(
    ("extra_name", "rooms"), [("server", ("server",)), ("gateway", ("gateway", "server"))]
)
def test_the_extra_is_what_its_rooms_import(extra_name: str, rooms: tuple[str, ...]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extra = {_name(r) for r in project["optional-dependencies"][extra_name]}
    needed = _third_party(*rooms) - core
    assert needed, f"{rooms} import nothing beyond the core dependencies (starlette)"
    assert needed - extra == set(), f"imported by {rooms} but not in the {extra_name} extra"
    assert extra - needed == set(), f"in the {extra_name} extra but not imported by {rooms}"


# an adapter's extra: its module's third-party imports, by the distribution that provides each
ADAPTERS = {
    "langchain": ("integrations/langchain.py", {"langchain_core": "langchain-core"}),
    "livekit": ("integrations/livekit.py", {"livekit": "livekit-agents"}),
    "pipecat": ("integrations/pipecat.py", {"pipecat": "pipecat-ai"}),
}


@pytest.mark.parametrize("extra_name", sorted(ADAPTERS))
def test_an_adapters_extra_is_what_its_module_imports(extra_name: str) -> None:
    module, distributions = ADAPTERS[extra_name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = {_name(r) for r in project["optional-dependencies"][extra_name]}
    stdlib = sys.stdlib_module_names | {"__future__"}
    core = {_name(r).replace("-", "_") for r in project["dependencies"]}  # pydantic, anyio, ...
    imported = _imported(PACKAGE / module) - stdlib - core - {"hybridllm"}
    assert imported <= set(distributions), f"{module} imports {imported - set(distributions)}"
    assert extra == {distributions[m] for m in imported}
    dev = " ".join(project["optional-dependencies"]["dev"])
    assert re.search(rf"hybridllm\[[^\]]*\b{extra_name}\b", dev), f"dev lacks {extra_name}"
