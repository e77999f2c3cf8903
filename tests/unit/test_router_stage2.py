"""Router stage 2 (issue 14): the local model's signals, their summaries, training into the
same artifact, loading and its checks, combining with stage 1, and learning from the log.

Real scikit-learn training on the synthetic labels (tests/_router_data.py) plus a synthetic
signals side file whose first-token probability tells, with noise, whether the local answer
was right. No model: the signals' extraction from real logits is tested in
tests/integration/test_cascade.py.
"""

from __future__ import annotations

import io
import json
import math
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.engines.llama.signals import (
    SIGNAL_NAMES,
    TokenTracker,
    distribution,
    option_letters,
    summarise,
)
from hybridllm.errors import RouterArtifactError
from hybridllm.routing import DecisionLog, Router
from hybridllm.routing.stage2 import router_score
from hybridllm.training.data import by_split, load_examples, load_signals
from hybridllm.training.train import train
from tests._router_data import write_fixture


def write_side_file(
    labels: Path, path: Path, seed: int, figures: Callable[[bool, random.Random], dict[str, Any]]
) -> Path:
    """A signals side file for the labels: `figures(local answer right, rng)` per row."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for line in labels.read_text().splitlines():
            row = json.loads(line)
            sig = figures(row["local"]["correct"], rng)
            f.write(json.dumps({"source": row["source"], "id": row["id"], "signals": sig}) + "\n")
    return path


def write_signals(labels: Path, path: Path, seed: int = 0) -> Path:
    def figures(ok: bool, rng: random.Random) -> dict[str, Any]:
        p = min(0.99, max(0.01, (0.85 if ok else 0.35) + rng.gauss(0, 0.12)))
        sig: dict[str, Any] = dict.fromkeys(SIGNAL_NAMES, None)
        sig.update(first_p=p, first_entropy=2.0 * (1 - p), first_margin=p / 2,
                   lp_mean=math.log(p), lp_min=math.log(p) - 0.3, lp_q10=math.log(p) - 0.2,
                   lp_q25=math.log(p) - 0.1, lp_q50=math.log(p), answer_tokens=8.0,
                   is_choice=0.0)  # fmt: skip
        return sig

    return write_side_file(labels, path, seed, figures)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("labels")
    labels = write_fixture(d / "labels.jsonl")
    return labels, write_signals(labels, d / "local_signals.jsonl")


@pytest.fixture(scope="module")
def trained(data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("router2")
    train(data[0], out, log=io.StringIO(), signals=data[1])
    return out


def test_distribution_summaries_of_known_logits() -> None:
    logits = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    d = distribution(logits, chosen=1)
    assert d.top_p == pytest.approx(0.7) and d.margin == pytest.approx(0.5)
    assert d.logprob == pytest.approx(math.log(0.2), abs=1e-6)
    entropy = -sum(p * math.log(p) for p in (0.7, 0.2, 0.1))
    assert d.entropy == pytest.approx(entropy, abs=1e-6)


def test_answer_token_quantiles_and_option_probability() -> None:
    t = TokenTracker(limit=4)
    for p in (0.9, 0.5, 0.8, 0.6, 0.99):  # the fifth is past the limit
        t.add(np.log(np.array([p, 1 - p], dtype=np.float32)), chosen=0)
    t.add_options(np.log(np.array([0.6, 0.3, 0.1, 0.0001], dtype=np.float32)), [0, 1, 2])
    s = t.signals()
    lps = np.log([0.9, 0.5, 0.8, 0.6])
    assert s["answer_tokens"] == 4 and s["first_p"] == pytest.approx(0.9)
    assert s["lp_min"] == pytest.approx(lps.min()) and s["lp_mean"] == pytest.approx(lps.mean())
    assert s["lp_q10"] == pytest.approx(np.quantile(lps, 0.1))
    assert s["option_p"] == pytest.approx(0.6 / 1.0, abs=1e-4) and s["is_choice"] == 1.0
    empty = summarise([], None)
    assert math.isnan(empty["first_p"]) and empty["is_choice"] == 0.0


def test_option_letters_only_for_multiple_choice() -> None:
    assert option_letters("Q?\n\nA. one\nB. two\nC. three\n\nAnswer.") == ["A", "B", "C"]
    assert option_letters("What is 2 + 2?") == []
    assert option_letters("Plan B. is fine") == []


def test_stage2_is_trained_into_the_same_artifact_and_loads(trained: Path) -> None:
    manifest = json.loads((trained / "manifest.json").read_text())
    assert manifest["heads"] == ["cloud_right", "local_right"]  # stage 1 unchanged
    assert set(manifest["stage2"]) >= {"combined", "signals", "golden", "metrics", "data"}
    r = Router.load(trained)
    assert set(r.stage2) == {"combined", "signals", "combined_plain", "signals_plain"}
    assert r.stage2["combined"].text_inputs == 2 and r.stage2["signals"].text_inputs == 0


def test_stage1_is_the_same_with_or_without_stage2(data: tuple[Path, Path], trained: Path,
                                                   tmp_path: Path) -> None:  # fmt: skip
    train(data[0], tmp_path, log=io.StringIO())  # no signals
    plain, both = Router.load(tmp_path), Router.load(trained)
    assert plain.stage2 == {}
    for p in ("Calculate 123 * 45? Answer with the number only.", "Is a river long?"):
        assert plain.score(p) == both.score(p)


def test_signals_rank_the_local_models_mistakes(data: tuple[Path, Path], trained: Path) -> None:
    r = Router.load(trained)
    signals = load_signals(data[1])
    test = by_split(load_examples(data[0]))["test"]
    local = [r.stage2["signals"].score((), signals[e.key]) for e in test]
    wrong = [s for s, e in zip(local, test, strict=True) if not e.local_correct]
    right = [s for s, e in zip(local, test, strict=True) if e.local_correct]
    assert np.mean(wrong) > np.mean(right) + 0.1


def test_router_score_combines_both_stages(data: tuple[Path, Path], trained: Path) -> None:
    r = Router.load(trained)
    sig = load_signals(data[1])
    ex = load_examples(data[0])[0]
    s = router_score(r, ex.prompt, sig[ex.key], cost_ms=12.5)
    assert s.text == r.score(ex.prompt) and s.cost_ms == 12.5
    assert s.local is not None and 0 < s.local < 1 and 0 < s.value < 1
    assert s.value == pytest.approx(
        r.stage2["combined"].score(r.head_logits(r.features(ex.prompt)), sig[ex.key])
    )
    alone = router_score(r, ex.prompt, None)  # no local engine: stage 1 decides
    assert alone.local is None and alone.value == alone.text
    t = r.stage2["combined"].threshold(cloud_share=0.3)
    assert 0.0 <= t <= 1.0


def test_a_changed_stage2_is_refused(trained: Path, tmp_path: Path) -> None:
    art = Path(shutil.copytree(trained, tmp_path / "r"))
    m = json.loads((art / "manifest.json").read_text())
    m["stage2"]["combined"]["mean"][0] += 1.0
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RouterArtifactError, match="stage 2"):
        Router.load(art)


def test_stage2_learns_from_the_decision_log(data: tuple[Path, Path], tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.db", store_prompts=True)
    sig = {"first_p": 0.2, "lp_mean": -1.5, "option_p": math.nan, "is_choice": 0.0}
    rid = log.record(route="local", features={}, messages="Who wrote Hamlet?")
    log.outcome(rid, engine="local", cascade={"decision": "local", "held_ms": 40.0,
                                              "signals": sig})  # fmt: skip
    log.feedback(rid, good=False)
    learned = log.training_signals()
    assert learned[f"log/{rid}"]["first_p"] == 0.2
    assert math.isnan(learned[f"log/{rid}"]["option_p"])
    log.close()
    full = train(data[0], tmp_path / "r", from_log=tmp_path / "d.db", signals=data[1],
                 log=io.StringIO())  # fmt: skip
    assert full["stage2"]["data"]["log_rows"] == 1
    assert full["stage2"]["data"]["rows"]["train"] == full["data"]["splits"]["train"] + 1


def test_multiple_choice_without_rotations_is_scored_by_the_plain_stage_2() -> None:
    from hybridllm.routing import Router
    from hybridllm.routing.stage2 import PLAIN, WHOLE, router_score, without_rotations

    router = Router.load()
    assert set(router.stage2) == {"combined", "signals", *PLAIN.values(), *WHOLE.values()}
    prompt = "Which is a bird?\n\nA. cat\nB. crow\nC. dog\n\nAnswer with the letter only."
    base = {"first_p": 0.4, "first_entropy": 1.5, "first_margin": 0.1, "lp_mean": -0.9,
            "lp_min": -1.2, "lp_q10": -1.1, "lp_q25": -1.0, "lp_q50": -0.9, "answer_tokens": 2.0,
            "option_p": 0.4, "option_entropy": 1.0, "is_choice": 1.0}  # fmt: skip
    rotated = {**base, "perm_agree": 1.0, "perm_p": 0.5, "perm_margin": 0.2}
    skipped = {**base, "perm_agree": math.nan, "perm_p": math.nan, "perm_margin": math.nan}
    assert without_rotations(skipped) and not without_rotations(rotated)
    assert not without_rotations({**skipped, "is_choice": 0.0})  # not multiple choice
    from hybridllm.routing import features

    logits = router.head_logits(features.extract(prompt))
    full, plain = router_score(router, prompt, rotated), router_score(router, prompt, skipped)
    assert full.value == pytest.approx(router.stage2["combined"].score(logits, rotated))
    assert plain.value == pytest.approx(router.stage2["combined_plain"].score(logits, skipped))
    assert plain.local == pytest.approx(router.stage2["signals_plain"].score((), skipped))
    assert (full.model, plain.model) == ("combined", "combined_plain")
    # the full model would read the missing figures as zeros: a different, wrong score
    assert plain.value != pytest.approx(router.stage2["combined"].score(logits, skipped))


def test_a_logged_cascade_without_rotations_teaches_the_plain_models_only(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    log = DecisionLog(tmp_path / "d.db", store_prompts=True)
    sig = {"first_p": 0.3, "lp_mean": -1.0, "option_p": 0.4, "is_choice": 1.0,
           "perm_agree": math.nan, "perm_p": math.nan, "perm_margin": math.nan}  # fmt: skip
    rid = log.record(route="local", features={}, messages="Q?\n\nA. x\nB. y\n\nLetter only.")
    log.outcome(rid, engine="local", cascade={"decision": "local", "held_ms": 40.0,
                                              "signals": sig})  # fmt: skip
    log.feedback(rid, good=True)
    log.close()
    full = train(data[0], tmp_path / "r", from_log=tmp_path / "d.db", signals=data[1],
                 log=io.StringIO())  # fmt: skip
    assert full["stage2"]["data"]["without_rotations"] == 1
    assert full["stage2"]["data"]["rows"]["train"] == full["data"]["splits"]["train"] + 1


def write_whole(labels: Path, path: Path, seed: int = 1) -> Path:
    """Whole-answer figures whose last tokens tell, with noise, whether the answer was right."""

    def figures(ok: bool, rng: random.Random) -> dict[str, Any]:
        tail = (-0.1 if ok else -1.6) + rng.gauss(0, 0.3)
        return {"lp_mean": -0.5, "lp_min": -2.0, "lp_q10": -1.5, "lp_q25": -1.0, "lp_q50": -0.4,
                "answer_len": 4.0 + rng.random(), "answer_ended": 1.0, "tail_lp_mean": tail,
                "tail_lp_min": tail - 0.5, "repeat_share": rng.random() / 10}  # fmt: skip

    return write_side_file(labels, path, seed, figures)


def test_whole_inputs_add_the_whole_answers_figures_to_the_heads() -> None:
    from hybridllm.routing.stage2 import whole_inputs

    head = {"first_p": 0.4, "lp_mean": -0.3, "lp_min": -0.9, "answer_tokens": 8.0,
            "is_choice": 0.0, "option_p": None}  # fmt: skip
    whole = {"first_p": 0.41, "lp_mean": -0.8, "lp_min": -4.0, "answer_tokens": 230.0,
             "answer_len": 5.4, "tail_lp_mean": -0.2}  # fmt: skip
    got = whole_inputs(head, whole)
    # the log-probability summary over all tokens, the whole answer's own figures; the rest
    # (the first token, how many answer tokens the head read) as the other models read it
    assert got["lp_mean"] == -0.8 and got["lp_min"] == -4.0 and got["answer_len"] == 5.4
    assert got["first_p"] == 0.4 and got["answer_tokens"] == 8.0 and math.isnan(got["option_p"])
    mc = {**head, "is_choice": 1.0}  # a letter answer is judged by its head
    assert whole_inputs(mc, whole) == whole_inputs(mc, None) == {**mc, "option_p": math.nan}


def test_answer_models_judge_the_whole_answer(data: tuple[Path, Path], tmp_path: Path) -> None:
    labels = tmp_path / "labels.jsonl"
    shutil.copy(data[0], labels)
    # the head's figures tell nothing here (a step-by-step solution's first tokens): shuffled
    rows = data[1].read_text().splitlines()
    sigs = [json.loads(x)["signals"] for x in rows]
    random.Random(3).shuffle(sigs)
    signals = tmp_path / "local_signals.jsonl"
    signals.write_text("".join(json.dumps({**json.loads(x), "signals": g}) + "\n"
                               for x, g in zip(rows, sigs, strict=True)))  # fmt: skip
    whole = write_whole(labels, tmp_path / "answer_signals.jsonl")
    full = train(labels, tmp_path / "r", signals=Path(signals), log=io.StringIO())
    entry = full["stage2"]
    n = len(labels.read_text().splitlines())
    assert entry["data"]["whole"]["file"] == "answer_signals.jsonl"
    assert sum(entry["data"]["whole_answers"].values()) == n  # every row had its whole answer
    r = Router.load(tmp_path / "r")
    assert {"combined_answer", "signals_answer"} <= set(r.stage2)
    assert "tail_lp_mean" in r.stage2["signals_answer"].signal_names
    assert "tail_lp_mean" not in r.stage2["signals"].signal_names
    from hybridllm.routing.stage2 import whole_inputs

    head, tail = load_signals(Path(signals)), load_signals(whole)
    test = by_split(load_examples(labels))["test"]
    inputs = {e.key: whole_inputs(head[e.key], tail[e.key]) for e in test}
    ex = test[0]
    s = router_score(r, ex.prompt, inputs[ex.key], whole=True)
    logits = r.head_logits(r.features(ex.prompt))
    assert s.value == pytest.approx(r.stage2["combined_answer"].score(logits, inputs[ex.key]))
    assert s.local == pytest.approx(r.stage2["signals_answer"].score((), inputs[ex.key]))
    prefix = router_score(r, ex.prompt, head[ex.key])  # the held tokens: the prefix models
    assert prefix.value == pytest.approx(r.stage2["combined"].score(logits, head[ex.key]))
    assert (s.model, prefix.model) == ("combined_answer", "combined")

    def gap(model: str, sig: dict[str, dict[str, float]]) -> float:
        local = {e.key: r.stage2[model].score((), sig[e.key]) for e in test}
        wrong = [local[e.key] for e in test if not e.local_correct]
        right = [local[e.key] for e in test if e.local_correct]
        return float(np.mean(wrong) - np.mean(right))

    # the last tokens tell what the head does not, and the answer models learnt to read them
    assert abs(gap("signals", head)) < 0.15 and gap("signals_answer", inputs) > 0.3


def test_eval_cross_validates_the_whole_answer_judge(
    data: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridllm.cli.main import main
    from hybridllm.training.data import load_whole_inputs

    labels = Path(shutil.copy(data[0], tmp_path / "labels.jsonl"))
    signals = Path(shutil.copy(data[1], tmp_path / "local_signals.jsonl"))
    whole = write_whole(labels, tmp_path / "answer_signals.jsonl")
    # a free-form row without its whole answer is left out; a multiple-choice one is kept
    lines = whole.read_text().splitlines()
    whole.write_text("\n".join(lines[1:]) + "\n")
    head = load_signals(signals)
    first, second = (json.loads(x) for x in labels.read_text().splitlines()[:2])
    mc_key = f"{second['source']}/{second['id']}"
    rows = signals.read_text().splitlines()
    rows[1] = json.dumps({**json.loads(rows[1]), "signals": {**head[mc_key], "is_choice": 1.0}})
    signals.write_text("\n".join(rows) + "\n")
    inputs = load_whole_inputs(signals)
    assert f"{first['source']}/{first['id']}" not in inputs and len(inputs) == len(lines) - 1
    assert "tail_lp_mean" not in inputs[mc_key]  # a letter answer: judged by its head
    from hybridllm.errors import ConfigError

    with pytest.raises(ConfigError, match="--whole"):  # no whole answers beside these signals
        load_whole_inputs(data[1])
    argv = ["router", "eval", "--stage2", "--data", str(labels), "--signals", str(signals)]
    assert main([*argv, "--whole"]) == 0
    out = capsys.readouterr().out
    assert f"{len(lines) - 1} rows, 5 folds" in out and "left out of training" in out
    signals_line = next(ln for ln in out.splitlines() if ln.startswith("signals "))
    assert float(signals_line.split()[1]) > 0.5  # the whole answers' last tokens route well


def test_a_logged_whole_answer_teaches_the_answer_models(
    data: tuple[Path, Path], tmp_path: Path
) -> None:
    log = DecisionLog(tmp_path / "d.db", store_prompts=True)
    head = {"first_p": 0.6, "lp_mean": -0.2, "lp_min": -0.9, "answer_tokens": 8.0,
            "is_choice": 0.0}  # fmt: skip
    whole = {**head, "lp_mean": -0.5, "lp_min": -3.0, "answer_tokens": 120.0, "answer_len": 4.8,
             "answer_ended": 1.0, "tail_lp_mean": -0.1, "tail_lp_min": -0.4,
             "repeat_share": 0.05}  # fmt: skip
    rid = log.record(route="local", features={}, messages="Add 2 and 2, step by step.")
    judged = {"decision": "local", "judge": "answer", "signals": head, "answer_signals": whole}
    log.outcome(rid, engine="local", cascade=judged)
    log.feedback(rid, good=True)
    other = log.record(route="local", features={}, messages="Say hi.")  # judged by its head
    log.outcome(other, engine="local", cascade={"decision": "local", "signals": head})
    log.feedback(other, good=True)
    assert set(log.training_whole()) == {f"log/{rid}"}
    assert log.training_whole()[f"log/{rid}"]["tail_lp_mean"] == -0.1
    log.close()
    # no answer_signals.jsonl beside these signals: one logged whole answer is too few
    alone = train(data[0], tmp_path / "r1", from_log=tmp_path / "d.db", signals=data[1],
                  log=io.StringIO())  # fmt: skip
    assert alone["stage2"]["data"]["whole"] == {"file": None, "sha256": None, "log_rows": 1}
    assert alone["stage2"]["data"]["whole_answers"] is None
    assert "combined_answer" not in alone["stage2"]
    # beside the labelled whole answers, it is one more training row
    labels = Path(shutil.copy(data[0], tmp_path / "labels.jsonl"))
    signals = Path(shutil.copy(data[1], tmp_path / "local_signals.jsonl"))
    write_whole(labels, tmp_path / "answer_signals.jsonl")
    full = train(labels, tmp_path / "r2", from_log=tmp_path / "d.db", signals=signals,
                 log=io.StringIO())  # fmt: skip
    entry = full["stage2"]
    assert entry["data"]["whole"]["log_rows"] == 1
    assert entry["data"]["whole_answers"]["train"] == full["data"]["splits"]["train"] + 1
    assert "combined_answer" in entry and "tail_lp_mean" in entry["signals_answer"]["signal_names"]


def test_the_shipped_answer_models_read_long_answers_better_than_their_heads() -> None:
    """On the shipped artifact's held-out test split: for step-by-step solutions and code, the
    first 8 tokens rank the local model's mistakes no better than chance; the whole answer
    does (data/router/answer_signals.jsonl, `label_local_signals.py --whole`)."""
    from sklearn.metrics import roc_auc_score

    from hybridllm.training.data import load_whole_inputs

    d = Path(__file__).resolve().parents[2] / "data" / "router"
    router = Router.load()
    test = [e for e in by_split(load_examples(d / "labels.jsonl"))["test"]
            if e.source in ("gsm8k", "humaneval", "mbpp")]  # fmt: skip
    head, whole = (
        load_signals(d / "local_signals.jsonl"),
        load_whole_inputs(d / "local_signals.jsonl"),
    )
    right = [e.local_correct for e in test]

    def auc(model: str, sig: dict[str, dict[str, float]]) -> float:
        p = [router.stage2[model].probabilities((), sig[e.key])["local_right"] for e in test]
        return float(roc_auc_score(right, p))

    assert len(test) >= 30 and auc("signals_answer", whole) > max(0.6, auc("signals", head) + 0.1)
