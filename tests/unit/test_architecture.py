"""The rules of ARCHITECTURE.md that import-linter cannot state: a cheap `import hybridllm`, one
loader of llama.cpp, small modules, a short top level."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybridllm"
HEAVY = (
    "numpy", "openai", "llama_cpp", "sklearn", "scipy", "skops", "httpx2", "pydantic", "spacy",
    "presidio_analyzer",
)  # fmt: skip


def _after(code: str) -> dict[str, object]:
    """Run `code` in a fresh interpreter; report the heavy modules loaded and the environment."""
    probe = (
        f"import os, sys, json; env = dict(os.environ); {code}; "
        f"print(json.dumps({{'loaded': sorted(m for m in {HEAVY!r} if m in sys.modules), "
        "'env_changed': sorted(k for k in os.environ if os.environ.get(k) != env.get(k))}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(run.stdout)
    return result


def test_import_hybridllm_loads_nothing_heavy_and_sets_nothing() -> None:
    assert _after("import hybridllm") == {"loaded": [], "env_changed": []}


def test_errors_events_and_policy_stay_light() -> None:
    seen = _after("import hybridllm; hybridllm.HybridError; hybridllm.Token")
    assert seen == {"loaded": [], "env_changed": []}


@pytest.mark.parametrize(
    ("name", "needs"),
    [("HybridClient", "anyio"), ("OpenAIEngine", "openai"), ("Policy", "pydantic")],
)
def test_a_public_name_loads_its_module_on_first_use(name: str, needs: str) -> None:
    probe = f"import sys, hybridllm; hybridllm.{name}; print({needs!r} in sys.modules)"
    run = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert run.stdout.strip() == "True"


def test_unknown_public_name_is_an_attribute_error() -> None:
    import hybridllm

    with pytest.raises(AttributeError, match="NoSuchThing"):
        hybridllm.NoSuchThing  # noqa: B018
    assert "HybridClient" in dir(hybridllm)
    assert set(hybridllm.__all__) <= set(dir(hybridllm))


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_loader_imports_llama_cpp() -> None:
    importers = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []  # the loader uses importlib, after setting the wait policy
    loader = (PACKAGE / "local" / "loader.py").read_text(encoding="utf-8")
    assert loader.index("waitpolicy.apply()") < loader.index('import_module("llama_cpp")')


def test_modules_are_small_and_the_top_level_short() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
