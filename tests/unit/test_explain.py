"""`hybridllm explain`: the decision and its reasons, offline, without sending anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["explain", *argv])
    return code, capsys.readouterr().out


def test_explains_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "Say hi.", "--policy", "chat")
    assert code == 0
    assert "decision  single: local, then cloud" in out
    assert "no router score -> local first" in out and "TTFT" in out


def test_load_and_router_and_privacy_show_in_the_reasons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out = run(capsys, "x", "--policy", "code-completion", "--queue-s", "2.1")
    assert "local queue 2100 ms > deadline 300 ms -> cloud" in out
    _, out = run(capsys, "x", "--policy", "chat", "--router-score", "0.81", "--threshold", "0.62")
    assert "router score 0.81 >= threshold 0.62 -> cloud" in out
    _, out = run(capsys, "x", "--policy", "long-writing", "--cloud-circuit", "open")
    assert "cloud circuit open -> local" in out


def test_refusal_exits_1_and_json_is_machine_readable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "strict.toml").write_text('extends = "chat"\nprivacy = "block"\n')
    code, out = run(
        capsys, "mail a@b.example", "--policy", "strict", "--policy-dir", str(tmp_path),
        "--found", "email", "--json",
    )  # fmt: skip
    assert code == 1
    data = json.loads(out)
    assert data["plan"] == "refuse" and data["primary"] is None
    assert any("privacy: email found" in r for r in data["reasons"])


def test_unknown_policy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "x", "--policy", "nope"]) == 2
    assert "known policies" in capsys.readouterr().err
