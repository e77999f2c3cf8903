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


def test_demo_tour_shows_every_act(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tour on small models (Qwen2.5-Coder-0.5B local: it renders tools; SmolLM2 as the
    stand-in cloud): every act runs and is in the table, the stalled cloud is rescued by the
    local engine, the privacy act is refused with nothing sent, and the demo says the stand-in
    shares the device's cores. What each plan decided is the models' business, not asserted."""
    argv = ["demo", "--local-model", "qwen2.5-coder-0.5b-instruct"]
    argv += ["--standin-model", TEST_MODEL, "--threads", "1"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "note: the stand-in cloud runs on this machine" in out
    for act in ("router", "fallback", "handoff", "cascade", "speculative", "priority", "tool"):
        assert f"\n[{act}" in out, act
    rows = out[out.index("\nsummary\n") :].splitlines()[4:]
    acts = [r.split()[0] for r in rows]
    assert acts[:4] == ["router", "router", "router", "fallback"], rows
    assert {"handoff", "cascade", "speculative", "background", "interactive"} <= set(acts)
    assert "failed" not in out[out.index("\nsummary\n") :], rows
    fallback = rows[3].split()
    assert fallback[1] == "local", rows[3]  # the stalled cloud never answered
    assert rows[-1].split()[0] == "privacy" and "refused; nothing was sent" in rows[-1]
    assert "|| paused after" in out  # the background answer gave way
    assert "() tool call get_weather" in out
