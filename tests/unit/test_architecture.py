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


def _documented_names() -> list[str]:
    """The public names ARCHITECTURE.md lists (its "public-names" block), room words left out."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- public-names -->")[1].split("<!-- /public-names -->")[0]
    rooms = {"client", "policy", "engines", "routing", "events", "trace", "errors", "logging"}
    return [w for w in block.replace("```", " ").split() if w not in rooms]


def _type_checking_names() -> list[str]:
    """The names `hybridllm/__init__.py` imports for type checkers (`if TYPE_CHECKING:`)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If))
    imports = [n for n in ast.walk(block) if isinstance(n, ast.ImportFrom)]
    return [alias.asname or alias.name for n in imports for alias in n.names]


def test_the_public_names_are_the_documented_list_and_each_resolves() -> None:
    import hybridllm

    documented = _documented_names()
    assert len(documented) == len(set(documented)) and sorted(documented) == hybridllm.__all__
    assert sorted(_type_checking_names()) == hybridllm.__all__  # what mypy sees is the same
    assert all(callable(getattr(hybridllm, name)) for name in hybridllm.__all__)
    assert {"Draft", "Retract", "RefusedError", "Trace"} <= set(hybridllm.__all__)
    errors = [n for n in hybridllm.__all__ if n.endswith("Error")]
    assert len(errors) <= 7 and len(hybridllm.__all__) < 66


def test_a_name_that_left_the_public_set_warns_and_names_its_home() -> None:
    import hybridllm
    from hybridllm import engines, errors, testing

    homes = [m.__name__ for m in (hybridllm, engines, testing) if "ScriptedEngine" in m.__all__]
    assert homes == ["hybridllm.testing"]  # exported from one place only
    with pytest.warns(DeprecationWarning, match="import it from hybridllm.testing"):
        moved = hybridllm.ScriptedEngine  # type: ignore[attr-defined]
    assert moved is testing.ScriptedEngine and "ScriptedEngine" not in dir(hybridllm)
    with pytest.warns(DeprecationWarning, match="import it from hybridllm.errors"):
        assert hybridllm.CloudError is errors.CloudError  # type: ignore[attr-defined]


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
