"""`hybridllm serve-model` checks its arguments before the model loads or uvicorn starts: a bad
one is
one line on stderr and exit code 2, never uvicorn's traceback (issue 24)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridllm.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")  # an existing file is all the check asks (it is loaded later)
    return path


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """uvicorn's part replaced by a recorder: what `serve()` would have been called with."""
    calls: list[dict[str, Any]] = []

    def serve(model: Any, **kwargs: Any) -> None:
        calls.append({"model": model.model, **kwargs})

    monkeypatch.setattr("hybridllm.server.app.serve", serve)
    return calls


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--port", "99999"], "--port must be an int from 0 to 65535, not 99999"),
        (["--port", "-1"], "--port must be an int from 0 to 65535"),
        (["--n-ctx", "0"], "--n-ctx must be an int >= 1"),
        (["--n-threads", "-2"], "--n-threads must be an int >= 1"),
        (["--max-logprobs", "0"], "--max-logprobs must be an int >= 1"),
        (["--log-level", "loud"], "--log-level must be one of 'critical'"),
        (["--alias", " "], "--alias must be a non-blank string"),
        (["--api-key", " "], "--api-key must be a non-blank key"),
        (["--host", "bad host!"], "--host must be an address or a host name"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_code_2(
    extra: list[str],
    says: str,
    gguf: Path,
    served: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert says in _one_error_line(["serve-model", str(gguf), *extra], capsys)
    assert served == []  # uvicorn never started


@pytest.mark.parametrize("model", ["nope", "/no/such/model.gguf"])
def test_an_unknown_model_is_one_line(
    model: str, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert model in _one_error_line(["serve-model", model], capsys)
    assert served == []


def test_a_port_in_use_is_one_line(
    gguf: Path, busy_port: int, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    line = _one_error_line(["serve-model", str(gguf), "--port", str(busy_port)], capsys)
    assert f"cannot listen on 127.0.0.1:{busy_port}" in line
    assert served == []


def test_good_arguments_reach_the_server(
    gguf: Path, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve-model", str(gguf), "--port", "0", "--n-ctx", "512", "--log-level", "info"]
    assert main(argv) == 0
    assert served == [
        {"model": str(gguf), "host": "127.0.0.1", "port": 0, "api_key": None, "log_level": "info"}
    ]


def test_python_m_hybridllm_server_says_it_in_one_line_too() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "hybridllm.server", "nope"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().startswith("error: unknown model 'nope'"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
