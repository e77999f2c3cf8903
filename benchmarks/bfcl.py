"""The Berkeley Function Calling Leaderboard's non-live data, and an AST check of our own writing
(issue 26's benchmark; `bench_tools.py` runs it).

The data comes from the `bfcl-eval` wheel on PyPI (`pip download --no-deps`, cached under
$HYBRIDLLM_CACHE_DIR/bfcl or ~/.cache/hybridllm/bfcl): its questions and possible answers for
`simple_python`, `multiple`, `parallel` and `irrelevance`. Nothing else of the package is
installed (its dependencies are heavy and unused here).

BFCL's function documents are not OpenAI tools as they stand: their parameter types are
Python's ("dict", "float", "tuple", "any") and their names have dots. `openai_tool` converts
them as BFCL's own OpenAI handler does (dots become underscores; "dict" "object", "float"
"number", "tuple" "array", "any" no type), and `score` maps the names back.

`score(category, calls, answer)`: irrelevance is right when no call was made; otherwise the
calls must match the possible answers one to one (order free for parallel): same function,
every required parameter present, every given parameter known, and each value among the
answer's allowed values (numbers compare by value, an int for a float; strings compare as BFCL
does, case-insensitive without spaces and a few punctuation marks; lists and dicts element by
element; "" in the allowed values means the parameter may be left out).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

WHEEL = "bfcl-eval==2026.3.23"
CATEGORIES = ("simple_python", "multiple", "parallel", "irrelevance")
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_STRIP = re.compile(r"[ ,./\-_*^]")


def cache_dir() -> Path:
    root = os.environ.get("HYBRIDLLM_CACHE_DIR") or str(Path.home() / ".cache" / "hybridllm")
    return Path(root) / "bfcl"


def wheel() -> Path:
    """The bfcl-eval wheel, downloaded once (no dependencies)."""
    where = cache_dir()
    found = sorted(where.glob("bfcl_eval-*.whl"))
    if found:
        return found[-1]
    where.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(where)]
    subprocess.run(cmd, check=True)
    return sorted(where.glob("bfcl_eval-*.whl"))[-1]


def _lines(z: zipfile.ZipFile, name: str) -> Iterator[dict[str, Any]]:
    with z.open(name) as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def load(category: str) -> list[dict[str, Any]]:
    """The category's items: id, messages (the first turn), functions, answer (None for
    irrelevance)."""
    with zipfile.ZipFile(wheel()) as z:
        questions = list(_lines(z, f"bfcl_eval/data/BFCL_v4_{category}.json"))
        answers: dict[str, Any] = {}
        if category != "irrelevance":
            path = f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json"
            answers = {a["id"]: a["ground_truth"] for a in _lines(z, path)}
    return [
        {
            "id": q["id"],
            "category": category,
            "messages": q["question"][0],
            "functions": q["function"],
            "answer": answers.get(q["id"]),
        }
        for q in questions
    ]


# ---- BFCL's documents as OpenAI tools --------------------------------------------------------


def tool_name(name: str) -> str:
    return name.replace(".", "_")


def _schema(node: Any) -> Any:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "type" and isinstance(value, str) and value in TYPES:
                if TYPES[value] is not None:
                    out["type"] = TYPES[value]
            elif key in ("optional",):
                continue
            else:
                out[key] = _schema(value)
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def openai_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    params = _schema(function.get("parameters") or {"type": "dict", "properties": {}})
    params.setdefault("type", "object")
    return {
        "type": "function",
        "function": {
            "name": tool_name(function["name"]),
            "description": function.get("description", ""),
            "parameters": params,
        },
    }


# ---- the AST check -------------------------------------------------------------------------------


def _norm_str(s: str) -> str:
    return _STRIP.sub("", s.lower()).replace("'", '"')


def _value_ok(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, bool) or isinstance(value, bool):
        return value is allowed or value == allowed and type(value) is type(allowed)
    if isinstance(allowed, int | float) and isinstance(value, int | float):
        return float(value) == float(allowed)
    if isinstance(allowed, str) and isinstance(value, str):
        return _norm_str(value) == _norm_str(allowed)
    if isinstance(allowed, list) and isinstance(value, list):
        return len(value) == len(allowed) and all(map(_value_ok, value, allowed))
    if isinstance(allowed, dict) and isinstance(value, dict):
        if set(value) - set(allowed):
            return False
        return all(
            (k in value and any(_value_ok(value[k], a) for a in opts)) or "" in opts
            for k, opts in allowed.items()
        )
    return bool(value == allowed)


def _call_ok(name: str, args: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    ((want, params),) = expected.items()
    if tool_name(want) != name or set(args) - set(params):
        return False
    for param, allowed in params.items():
        if param not in args:
            if "" not in allowed:
                return False
        elif not any(_value_ok(args[param], a) for a in allowed if a != "" or args[param] == ""):
            return False
    return True


def score(category: str, calls: Sequence[tuple[str, Mapping[str, Any]]], answer: Any) -> bool:
    """Whether the calls (name, parsed arguments) answer the item."""
    if category == "irrelevance":
        return not calls
    if len(calls) != len(answer):
        return False
    left = list(answer)
    for name, args in calls:  # one to one, order free
        match = next((e for e in left if _call_ok(name, args, e)), None)
        if match is None:
            return False
        left.remove(match)
    return True
