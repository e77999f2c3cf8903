"""`hybridllm explain`: the decision and its reasons, offline, without sending anything."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from hybridllm.cli.explain import explain, offline_engine
from hybridllm.cli.main import main
from hybridllm.errors import PolicyError
from hybridllm.policy import Policy, resolve_policy
from hybridllm.routing.router import Router
from hybridllm.runtime.latency import LatencyModel
from hybridllm.testing import ScriptedEngine


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["explain", *argv])
    return code, capsys.readouterr().out


def test_explains_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "Say hi.", "--policy", "chat", "--no-router")
    assert code == 0
    assert "decision  single: local, then cloud" in out
    assert "no router score -> local first" in out and "TTFT" in out


def test_the_shipped_router_scores_the_prompt_as_the_client_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "Say hi.", "--policy", "chat")  # chat: target_cloud_share = 0.3
    assert code == 0
    threshold = Router.load().threshold(cloud_share=0.3)
    assert f"threshold {threshold:.3f} (target_cloud_share 0.3)" in out
    assert f"threshold {threshold:.2f} -> " in out  # the reason names the same cut


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
    (tmp_path / "strict.toml").write_text('extends = "chat"\n[privacy]\nmode = "block"\n')
    code, out = run(
        capsys, "mail a@b.example", "--policy", "strict", "--policy-dir", str(tmp_path),
        "--found", "email", "--json",
    )  # fmt: skip
    assert code == 1
    data = json.loads(out)
    assert data["plan"] == "refuse" and data["primary"] is None
    assert "privacy_blocked" in data["reason_codes"]
    assert len(data["reason_codes"]) == len(data["reasons"])


def test_unknown_policy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "x", "--policy", "nope"]) == 2
    assert "known policies" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "share", "floor"),
    [("target_cloud_share = 0.2", 0.2, None), ("quality_floor = 0.5", None, 0.5)],
)
def test_a_cloud_share_or_quality_floor_gets_the_routers_threshold(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    line: str,
    share: float | None,
    floor: float | None,
) -> None:
    (tmp_path / "p.toml").write_text(
        f'[routing]\nprefer = "auto"\nttft_deadline_ms = 800\n{line}\n'
    )
    want = Router.load().threshold(cloud_share=share, quality_floor=floor)
    for score, engine in ((want + 0.01, "cloud"), (max(0.0, want - 0.01), "local")):
        code, out = run(capsys, "x", "--policy", "p", "--policy-dir", str(tmp_path),
                        "--router-score", str(score), "--json")  # fmt: skip
        data = json.loads(out)
        assert code == 0 and data["router_threshold"] == pytest.approx(want)
        assert data["router_score"] == score and data["primary"] == engine
    # a stated threshold replaces the policy's reading of the score
    _, out = run(capsys, "x", "--policy", "p", "--policy-dir", str(tmp_path),
                 "--router-score", "0.5", "--threshold", "0.45")  # fmt: skip
    assert "threshold 0.450 (router_threshold)" in out and "-> cloud" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--router-score", "1.5"], "router score (--router-score) must be within 0..1, not 1.5"),
        (["--router-score", "nan"], "must be within 0..1"),
        (["--threshold", "-0.1"], "router threshold (--threshold) must be within 0..1"),
        (["--max-tokens", "-5"], "(--max-tokens) must be at least 1, not -5"),
        (["--found", "visa"], "unknown privacy finding kind (--found) 'visa'; known: "),
        (["--queue-s", "-1"], "(--queue-s) must be >= 0 seconds, not -1.0"),
    ],
)
def test_bad_inputs_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main(["explain", "x", "--policy", "chat", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and captured.err.startswith("error: ")


def test_without_a_router_a_cloud_share_needs_a_stated_threshold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "x", "--policy", "chat", "--no-router", "--router-score", "0.7"]) == 2
    assert "state --threshold" in capsys.readouterr().err
    code, out = run(capsys, "x", "--policy", "chat", "--no-router", "--router-score", "0.7",
                    "--threshold", "0.6")  # fmt: skip
    assert code == 0 and "router score 0.70 >= threshold 0.60 -> cloud" in out


class HardRouter:
    """A router double: prompts containing "hard" score high; the threshold is the share."""

    def score(self, messages: Sequence[Mapping[str, str]]) -> float:
        return 0.9 if "hard" in messages[-1]["content"] else 0.2

    def threshold(
        self, cloud_share: float | None = None, quality_floor: float | None = None
    ) -> float:
        return 1.0 - (cloud_share if cloud_share is not None else 0.5)


CASES = [
    # prompt, policy, queue, circuit open, router
    (
        "a hard question",
        Policy(name="share", routing={"prefer": "auto", "target_cloud_share": 0.3}),
        0,
        False,
        HardRouter(),
    ),
    (
        "an easy one",
        Policy(name="share", routing={"prefer": "auto", "target_cloud_share": 0.3}),
        0,
        False,
        HardRouter(),
    ),
    (
        "a hard one",
        Policy(
            name="floor", routing={"prefer": "auto", "quality_floor": 0.6, "ttft_deadline_ms": 300}
        ),
        0.0,
        True,
        HardRouter(),
    ),
    (
        "mail me at ann@example.org",
        Policy(
            name="private",
            routing={"prefer": "auto", "router_threshold": 0.1},
            privacy={"mode": "keep-local"},
        ),
        0.0,
        False,
        HardRouter(),
    ),
    (
        "Say hi.",
        Policy(name="code", routing={"prefer": "local", "ttft_deadline_ms": 300}),
        2.1,
        False,
        None,
    ),
    ("Write a proof that there are infinitely many primes.", "chat", 0.0, False, "shipped"),
]


@pytest.mark.parametrize(("prompt", "policy", "queue_s", "circuit_open", "router"), CASES)
def test_explain_decides_as_the_client_does(
    prompt: str, policy: Policy | str, queue_s: float, circuit_open: bool, router: object
) -> None:
    from hybridllm import HybridClient

    pol = policy if isinstance(policy, Policy) else resolve_policy(policy)
    scorer = Router.load() if router == "shipped" else router
    assert scorer is None or isinstance(scorer, Router | HardRouter)
    latency = LatencyModel()
    latency.seed("local")  # explain predicts from the priors: a client seeded with them
    latency.seed("cloud")
    client = HybridClient(local=offline_engine("local", queue_s), cloud=ScriptedEngine("cloud"),
                          router=scorer, latency=latency)  # fmt: skip
    if circuit_open:
        client.breakers["cloud"].opened_at = time.monotonic()
    theirs = client.decide(prompt, pol)
    ours = explain(prompt, pol, router=scorer, queue_s=queue_s, cloud_circuit_open=circuit_open)
    assert ours == theirs
    assert ours.facts.router_threshold is not None or scorer is None


def test_explain_shows_that_a_cascade_would_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "cascading.toml").write_text(
        'extends = "chat"\nplans = ["single", "hedge", "cascade"]\n'
    )
    argv = ("x", "--policy", "cascading", "--policy-dir", str(tmp_path), "--router-score", "0.1")
    code, out = run(capsys, *argv)
    assert code == 0 and "decision  cascade: local, then cloud" in out
    assert "the local engine holds its first tokens (up to 8) while the router reads" in out
    _, out = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert data["plan"] == "cascade" and data["cascade_judge"] == "prefix"
    assert data["refusal"] is None and data["load_rule"] is None
    _, out = run(capsys, "x", "--policy", "cascading", "--policy-dir", str(tmp_path), "--no-router")
    assert "decision  single: local, then cloud" in out  # no router: no cascade


def test_a_whole_answer_shows_and_runs_no_handoff(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    handoff = tmp_path / "handoff.toml"
    handoff.write_text('name = "h"\nplans = ["single", "handoff"]\nplan = "handoff"\n')
    args = ("Write a long story.", "--policy", str(handoff), "--no-router", "--json")
    plain = json.loads(run(capsys, *args)[1])
    tools = json.loads(run(capsys, *args, "--answer", "tools")[1])
    code, text = run(capsys, *args[:-1], "--answer", "json")
    assert plain["atomic"] is None and plain["plan"] == "handoff"
    assert tools["atomic"] == "tools" and tools["plan"] == "single"
    assert code == 0 and "answer    must be JSON: delivered whole" in text
    assert "plan=handoff, but the answer is JSON, delivered whole -> no handoff" in text


def test_named_clouds_and_tiers_show_which_cloud_serves_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "tiered.toml"
    policy.write_text(
        'name = "tiered"\n[routing]\ntiers = ["local", "fast", "smart"]\ntier_bounds = [0.3, 0.7]\n'
    )
    base = ("Say hi.", "--policy", str(policy), "--cloud", "fast", "--cloud", "smart", "--json")
    code, out = run(capsys, *base, "--router-score", "0.5")
    got = json.loads(out)
    assert code == 0 and got["router_tier"] == "fast" and got["primary"] == "cloud"
    assert "router_tier" in got["reason_codes"]
    assert [(c["engine"], c["chosen"]) for c in got["clouds"]] == [("fast", True), ("smart", False)]
    code, out = run(capsys, *base, "--router-score", "0.5", "--open-circuit", "fast")
    got = json.loads(out)
    assert [(c["engine"], c["chosen"], c["passed_over"]) for c in got["clouds"]] == [
        ("fast", False, "circuit_open"),
        ("smart", True, None),
    ]
    code, out = run(capsys, *base[:-1], "--router-score", "0.9")
    assert code == 0 and "tier      smart" in out and "smart (serves the cloud side)" in out


def test_a_policy_naming_a_cloud_explain_was_not_given_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pol = Policy(name="p", routing={"prefer": "smart"})
    with pytest.raises(PolicyError):
        explain("x", pol, engines=("local", "fast"))
    preview = explain("x", pol, engines=("local", "fast", "smart"))
    assert preview.decision.primary == "cloud"
    assert [c.engine for c in preview.state.clouds if c.chosen] == ["smart"]
