"""`hybridllm demo` and the examples, end to end on the real SmolLM2-135M (local only, fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridllm.cli.main import main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEST_MODEL = "smollm2-135m-instruct"


def run_example(model_path: Path, *args: str, timeout: float = 60) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / args[0]), "--model", TEST_MODEL, *args[1:]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_demo_quick_local_only(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--quick", "--no-cloud", "--local-model", TEST_MODEL, "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "cloud: none (--no-cloud)" in out
    assert "-> local: policy 'code-completion' prefers local" in out
    summary = out[out.index("\nsummary\n") :].splitlines()
    assert summary[2].split()[:6] == ["scenario", "engine", "TTFT", "ms", "TPOT", "ms"]
    rows = summary[4:]
    assert [r.split()[0] for r in rows] == ["code-completion", "voice-assistant", "chat"]
    assert all(r.split()[1] == "local" for r in rows)


def test_demo_bad_local_model_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--no-cloud", "--local-model", "no-such-model"])
    assert code == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_demo_model_flag_needs_an_endpoint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["demo", "--model", "gpt-4o-mini"]) == 2
    assert "no endpoint is configured" in capsys.readouterr().err


def test_chat_once(model_path: Path) -> None:
    out = run_example(model_path, "chat.py", "--once", "Say hello.", "--max-tokens", "16")
    assert "[local: TTFT" in out


def test_voice_loop_barge_in_stops_generation(model_path: Path) -> None:
    out = run_example(model_path, "voice_loop.py", "--interrupt-after", "1.0")
    assert "[barge-in: engine busy at the interruption: True;" in out
    assert "busy now: False]" in out
    assert "finish: interrupted" in out


def test_sync_script(model_path: Path) -> None:
    out = run_example(model_path, "sync_script.py")
    assert "'engine': 'local'" in out
