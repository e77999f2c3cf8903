"""Router training, artifact round trip and integrity checks, scores and thresholds.

Trains real routers (scikit-learn, seconds) on a small synthetic labels file
(tests/_router_data.py) with a learnable pattern.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.errors import RouterArtifactError, RouterThresholdError
from hybridllm.routing import Router
from hybridllm.routing.artifact import default_dir as artifact_dir
from hybridllm.training.data import by_split, load_examples, split_of
from hybridllm.training.metrics import calibration_from_labelled
from hybridllm.training.train import feature_matrix, train
from tests._router_data import write_fixture


@pytest.fixture(scope="module")
def labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("labels") / "labels.jsonl")


@pytest.fixture(scope="module")
def trained(labels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("router")
    train(labels, out, log=io.StringIO())
    return out


@pytest.fixture
def artifact(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained artifact, free to damage."""
    return Path(shutil.copytree(trained, tmp_path / "router"))


def test_split_is_stable_disjoint_and_proportioned(labels: Path, trained: Path) -> None:
    examples = load_examples(labels)
    parts = by_split(examples)
    keys = [{ex.key for ex in part} for part in parts.values()]
    assert sum(len(k) for k in keys) == len(examples) == len(set().union(*keys))
    assert split_of("mmlu", "42") == split_of("mmlu", "42")
    counts = {"train": 0, "calibration": 0, "test": 0}
    for i in range(3000):
        counts[split_of("src", str(i))] += 1
    assert abs(counts["train"] / 3000 - 0.6) < 0.04 and abs(counts["test"] / 3000 - 0.2) < 0.04
    lines = (trained / "splits.tsv").read_text().splitlines()
    assert len(lines) == len(examples) + 1 and lines[1:] == sorted(lines[1:])
    for line in lines[1:]:
        source, item, split = line.split("\t")
        assert split == split_of(source, item)


def _sk_scores(est: dict[str, Any], prompts: list[Any]) -> np.ndarray[Any, Any]:
    """scikit-learn's calibrated probability, with the router's bound on the log-odds."""
    z = est["classifier"].decision_function(feature_matrix(prompts))
    logit = np.clip(est["calibrator"].decision_function(z.reshape(-1, 1)), -12, 12)
    return np.asarray(1.0 / (1.0 + np.exp(-logit)))


def test_round_trip_matches_scikit_learn(trained: Path, labels: Path) -> None:
    import skops.io as sio

    router = Router.load(trained)
    assert router.form == "factored" and list(router.heads) == ["cloud_right", "local_right"]
    est = sio.load(
        trained / "router.skops", trusted=["sklearn.linear_model._logistic.LogisticRegression"]
    )
    prompts = [ex.prompt for ex in load_examples(labels)[:30]]
    expected = _sk_scores(est["cloud_right"], prompts) * (
        1 - _sk_scores(est["local_right"], prompts)
    )
    got = np.array([router.score(p) for p in prompts])
    assert got == pytest.approx(expected, abs=1e-9)
    manifest = json.loads((trained / "manifest.json").read_text())
    for key in ("data", "versions", "feature_version", "metrics", "calibration", "artifact"):
        assert key in manifest
    assert set(manifest["versions"]) == {"sklearn", "skops", "numpy"}
    assert len(manifest["calibration"]["score_quantiles"]) == 101
    assert manifest["data"]["rows"] == 240
    assert manifest["heads"] == ["cloud_right", "local_right"] and manifest["form"] == "factored"


def test_single_form_round_trip(labels: Path, tmp_path: Path) -> None:
    import skops.io as sio

    train(labels, tmp_path, form="single", log=io.StringIO())
    router = Router.load(tmp_path)
    assert router.form == "single" and router.label == "cloud-needed"
    est = sio.load(
        tmp_path / "router.skops", trusted=["sklearn.linear_model._logistic.LogisticRegression"]
    )
    prompts = [ex.prompt for ex in load_examples(labels)[:30]]
    got = np.array([router.score(p) for p in prompts])
    assert got == pytest.approx(_sk_scores(est["label"], prompts), abs=1e-9)


def test_format_1_artifact_still_loads(labels: Path, tmp_path: Path) -> None:
    """Artifacts of format 1 (one flat {classifier, calibrator} pair) keep loading."""
    import hashlib

    import skops.io as sio

    trusted = ["sklearn.linear_model._logistic.LogisticRegression"]
    train(labels, tmp_path, form="single", log=io.StringIO())
    prompts = [ex.prompt for ex in load_examples(labels)[:10]]
    before = [Router.load(tmp_path).score(p) for p in prompts]
    flat = sio.load(tmp_path / "router.skops", trusted=trusted)["label"]
    blob = sio.dumps(flat)
    (tmp_path / "router.skops").write_bytes(blob)
    m = json.loads((tmp_path / "manifest.json").read_text())
    del m["heads"]
    m["format"] = 1
    m["artifact"]["sha256"] = hashlib.sha256(blob).hexdigest()
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert [Router.load(tmp_path).score(p) for p in prompts] == pytest.approx(before, abs=1e-12)


def test_factored_form_needs_the_cloud_needed_label(labels: Path, tmp_path: Path) -> None:
    from hybridllm.errors import ConfigError

    with pytest.raises(ConfigError, match="factored"):
        train(labels, tmp_path, label="local-wrong", form="factored", log=io.StringIO())


def test_missing_head_is_refused(artifact: Path) -> None:
    m = json.loads((artifact / "manifest.json").read_text())
    m["heads"] = ["cloud_right", "nonsense"]
    (artifact / "manifest.json").write_text(json.dumps(m))
    assert _reason(artifact) == "malformed"


def test_scores_are_probabilities_and_learn_the_pattern(trained: Path) -> None:
    router = Router.load(trained)
    arith = [router.score(f"Calculate {a} * 37? Answer with the number only.") for a in (311, 902)]
    yesno = [
        router.score(f"Is a {w} bigger than a castle? Answer yes or no.") for w in ("cat", "ox")
    ]
    trivia = [router.score(f"Who wrote the famous {w} song of 1950?") for w in ("river", "moon")]
    assert all(0.0 < s < 1.0 for s in arith + yesno + trivia)
    # the cloud is needed for arithmetic only (local wrong, cloud right)
    assert min(arith) > max(yesno + trivia)
    # calibration is monotone: the calibrated order is the raw order
    feats = [router.features(p) for p in ("Calculate 5 * 5?", "Is it? Answer yes or no.")]
    raw = [router.raw_score(f) for f in feats]
    cal = [router.score_features(f) for f in feats]
    assert (raw[0] > raw[1]) == (cal[0] > cal[1])
    assert (
        router.score(
            [{"role": "user", "content": "Calculate 311 * 37? Answer with the number only."}]
        )
        == arith[0]
    )


def test_training_is_deterministic(labels: Path, trained: Path, tmp_path: Path) -> None:
    again = train(labels, tmp_path / "again", log=io.StringIO())
    first = json.loads((trained / "manifest.json").read_text())
    assert again["model"]["weights_sha256"] == first["model"]["weights_sha256"]
    assert again["calibration"] == first["calibration"]


def _reason(path: Path) -> str:
    with pytest.raises(RouterArtifactError) as info:
        Router.load(path)
    return info.value.reason


def test_tampered_file_is_refused(artifact: Path) -> None:
    blob = bytearray((artifact / "router.skops").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (artifact / "router.skops").write_bytes(bytes(blob))
    assert _reason(artifact) == "tampered"


def _load_in_a_fresh_interpreter(path: Path | None) -> dict[str, Any]:
    code = (
        "import json, sys\n"
        "from hybridllm.routing import Router\n"
        f"r = Router.load({str(path)!r} if {path is not None} else None)\n"
        "print(json.dumps({'score': r.score('Who wrote Moby-Dick?'), 'stage2': sorted(r.stage2),"
        " 'imported': [m for m in ('sklearn', 'skops', 'scipy') if m in sys.modules]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("which", ["trained", "shipped"])
def test_the_weights_file_is_read_without_scikit_learn(
    trained: Path, tmp_path: Path, which: str
) -> None:
    """Loading reads `router.npz` with numpy alone (the golden scores check it); without it,
    the skops file is unpickled, to the same scores."""
    source = trained if which == "trained" else None
    fast = _load_in_a_fresh_interpreter(source)
    assert fast["imported"] == []
    copy = Path(shutil.copytree(source or artifact_dir(), tmp_path / "copy"))
    (copy / "router.npz").unlink()
    slow = _load_in_a_fresh_interpreter(copy)
    assert "sklearn" in slow["imported"] and "skops" in slow["imported"]
    assert fast["score"] == slow["score"] and fast["stage2"] == slow["stage2"]
    if which == "shipped":
        assert fast["stage2"]  # stage 2's estimators come from the weights file too


def test_a_weights_file_that_does_not_match_its_hash_is_refused(artifact: Path) -> None:
    blob = bytearray((artifact / "router.npz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (artifact / "router.npz").write_bytes(bytes(blob))
    assert _reason(artifact) == "tampered"


def test_weights_taken_from_another_skops_file_are_not_read(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridllm.routing import artifact as artifact_module

    unpickled: list[list[str]] = []
    real = artifact_module._load_estimators

    def counted(blob: bytes, fpath: Path, heads: list[str], **kw: Any) -> dict[str, Any]:
        unpickled.append(heads)
        return real(blob, fpath, heads, **kw)

    monkeypatch.setattr(artifact_module, "_load_estimators", counted)
    score = Router.load(artifact).score("Who wrote Moby-Dick?")
    assert unpickled == []
    m = json.loads((artifact / "manifest.json").read_text())
    m["weights"]["of"] = "0" * 64  # taken from a skops file since replaced
    (artifact / "manifest.json").write_text(json.dumps(m))
    assert Router.load(artifact).score("Who wrote Moby-Dick?") == score
    assert unpickled == [["cloud_right", "local_right"]]


def test_a_weights_file_that_is_not_an_npz_is_malformed(artifact: Path) -> None:
    import hashlib

    blob = b"PK\x03\x04 not a zip archive"
    (artifact / "router.npz").write_bytes(blob)
    entry = json.loads((artifact / "manifest.json").read_text())["weights"]
    _edit_manifest(artifact, weights={**entry, "sha256": hashlib.sha256(blob).hexdigest()})
    assert _reason(artifact) == "malformed"


def test_weights_missing_a_head_are_malformed(artifact: Path) -> None:
    import hashlib

    from hybridllm.routing.artifact import Linear, weights_blob

    with np.load(artifact / "router.npz") as npz:
        arrays = {n: npz[n] for n in npz.files}
    pairs = {
        "cloud_right": {
            role: Linear(
                arrays[f"cloud_right|{role}|coef_"], arrays[f"cloud_right|{role}|intercept_"]
            )
            for role in ("classifier", "calibrator")
        }
    }
    blob = weights_blob(pairs)
    (artifact / "router.npz").write_bytes(blob)
    entry = json.loads((artifact / "manifest.json").read_text())["weights"]
    _edit_manifest(artifact, weights={**entry, "sha256": hashlib.sha256(blob).hexdigest()})
    assert _reason(artifact) == "malformed"


def test_missing_files_are_refused(artifact: Path, tmp_path: Path) -> None:
    assert _reason(tmp_path / "nowhere") == "missing"
    (artifact / "router.skops").unlink()
    assert _reason(artifact) == "missing"


def _edit_manifest(path: Path, **changes: object) -> None:
    m = json.loads((path / "manifest.json").read_text())
    for key, value in changes.items():
        if key == "sklearn":
            m["versions"]["sklearn"] = value
        else:
            m[key] = value
    (path / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("change", [{"feature_version": 999}, {"n_hash": 1024}, {"format": 99}])
def test_version_mismatch_is_refused(artifact: Path, change: dict[str, object]) -> None:
    _edit_manifest(artifact, **change)
    with pytest.raises(RouterArtifactError, match="retrain|format") as info:
        Router.load(artifact)
    assert info.value.reason == "version"


def _fake_sklearn(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """This install's scikit-learn version, as the artifact check sees it."""
    from hybridllm.routing import artifact

    real = artifact.library_versions()
    monkeypatch.setattr(artifact, "library_versions", lambda: {**real, "sklearn": version})


def test_golden_scores_are_recorded_and_reproduced(trained: Path) -> None:
    from hybridllm.training.train import GOLDEN_PROMPTS

    golden = json.loads((trained / "manifest.json").read_text())["golden"]
    assert len(golden["prompts"]) == len(golden["scores"]) == len(GOLDEN_PROMPTS) == 8
    router = Router.load(trained)
    assert [router.score(p) for p in golden["prompts"]] == golden["scores"]


def test_other_sklearn_version_loads_when_golden_scores_reproduce(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edit_manifest(artifact, sklearn="0.24.2")  # saved with another version...
    _fake_sklearn(monkeypatch, "1.5.2")  # ...loaded by a third: the golden scores decide
    assert 0.0 < Router.load(artifact).score("Who wrote Moby-Dick?") < 1.0


@pytest.mark.parametrize("delta", [1e-6, float("nan")])
def test_golden_score_not_reproduced_is_refused(
    artifact: Path, monkeypatch: pytest.MonkeyPatch, delta: float
) -> None:
    m = json.loads((artifact / "manifest.json").read_text())
    m["golden"]["scores"][3] += delta
    (artifact / "manifest.json").write_text(json.dumps(m))
    _fake_sklearn(monkeypatch, "1.5.2")
    with pytest.raises(RouterArtifactError, match="golden prompt 3.*scikit-learn 1.5.2") as info:
        Router.load(artifact)
    assert info.value.reason == "version"


def test_golden_score_within_tolerance_loads(artifact: Path) -> None:
    m = json.loads((artifact / "manifest.json").read_text())
    m["golden"]["scores"][0] += 5e-10
    (artifact / "manifest.json").write_text(json.dumps(m))
    Router.load(artifact)


def test_malformed_golden_entry_is_refused(artifact: Path) -> None:
    m = json.loads((artifact / "manifest.json").read_text())
    m["golden"]["scores"] = m["golden"]["scores"][:-1]
    (artifact / "manifest.json").write_text(json.dumps(m))
    assert _reason(artifact) == "malformed"


def test_manifest_without_golden_scores_needs_the_same_minor_version(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = json.loads((artifact / "manifest.json").read_text())
    del m["golden"]
    m["versions"]["sklearn"] = "1.5.0"
    (artifact / "manifest.json").write_text(json.dumps(m))
    _fake_sklearn(monkeypatch, "1.5.2")
    Router.load(artifact)  # same minor: loads, as before golden scores
    _fake_sklearn(monkeypatch, "1.6.1")
    with pytest.raises(RouterArtifactError, match="1.5.0.*1.6.1.*retrain") as info:
        Router.load(artifact)
    assert info.value.reason == "version"


def test_file_that_fails_to_unpickle_under_another_version_is_a_version_error(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridllm.routing import artifact as artifact_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RouterArtifactError("router file does not load", path=artifact, reason="malformed")

    monkeypatch.setattr(artifact_module, "_load_estimators", broken)
    (artifact / "router.npz").unlink()  # the skops file is what is unpickled
    assert _reason(artifact) == "malformed"  # same version: a broken file
    _fake_sklearn(monkeypatch, "0.99.0")  # another minor than the training's, whatever it was
    with pytest.raises(RouterArtifactError, match="does not load with this install") as info:
        Router.load(artifact)
    assert info.value.reason == "version"


def test_malformed_manifest_is_refused(artifact: Path) -> None:
    (artifact / "manifest.json").write_text("{not json")
    assert _reason(artifact) == "malformed"


def test_untrusted_types_are_refused_even_with_a_matching_hash(artifact: Path) -> None:
    import collections
    import hashlib

    import skops.io as sio

    blob = sio.dumps({"classifier": collections.Counter(a=1), "calibrator": 1})
    (artifact / "router.skops").write_bytes(blob)
    _edit_manifest(
        artifact, artifact={"file": "router.skops", "sha256": hashlib.sha256(blob).hexdigest()}
    )
    with pytest.raises(RouterArtifactError, match="trusted") as info:
        Router.load(artifact)
    assert info.value.reason == "tampered"


def _router(scores: list[float], local: list[bool], cloud: list[bool]) -> Router:
    from hybridllm.routing import features as F

    return Router(
        weights=np.zeros(F.N_HASH + len(F.DENSE_NAMES)),
        intercept=0.0,
        platt=(1.0, 0.0),
        calibration=calibration_from_labelled(scores, local, cloud),
    )


def test_threshold_for_a_cloud_share() -> None:
    scores = list(np.linspace(0.0, 1.0, 101))
    r = _router(scores, [False] * 101, [True] * 101)
    for share in (0.1, 0.3, 0.5, 0.9):
        t = r.threshold(cloud_share=share)
        assert t == pytest.approx(1.0 - share)
        assert np.mean(np.array(scores) > t + 1e-9) == pytest.approx(share, abs=0.011)
    assert r.threshold(cloud_share=0.0) == 1.0 and r.threshold(cloud_share=1.0) == 0.0


def test_threshold_for_a_quality_floor() -> None:
    # five prompts, highest score first: gains +1, +1, 0, 0, -1; local-only quality 2/5
    scores = [0.9, 0.8, 0.6, 0.4, 0.2]
    local = [False, False, True, False, True]
    cloud = [True, True, True, False, False]
    r = _router(scores, local, cloud)
    assert r.threshold(quality_floor=0.4) == 1.0  # local-only already reaches it
    assert r.threshold(quality_floor=0.6) == 0.8  # top 1: send only the 0.9 prompt
    assert r.threshold(quality_floor=0.8) == 0.6  # top 2
    with pytest.raises(RouterThresholdError, match="best quality"):
        r.threshold(quality_floor=0.9)


def test_threshold_argument_errors() -> None:
    r = _router([0.1, 0.9], [True, False], [True, True])
    with pytest.raises(RouterThresholdError):
        r.threshold()
    with pytest.raises(RouterThresholdError):
        r.threshold(cloud_share=0.5, quality_floor=0.5)
    with pytest.raises(RouterThresholdError):
        r.threshold(cloud_share=1.5)


def test_recalibrate_on_traffic_moves_share_thresholds_only() -> None:
    r = _router(list(np.linspace(0, 1, 101)), [False] * 101, [True] * 101)
    traffic = list(np.linspace(0.0, 0.2, 50))  # the user's prompts score low
    r2 = r.recalibrate(traffic)
    assert r2.threshold(cloud_share=0.5) == pytest.approx(0.1)
    assert r.threshold(cloud_share=0.5) == pytest.approx(0.5)  # the original is unchanged
    assert r2.calibration.curve == r.calibration.curve
    assert r2.calibration.source == "traffic n=50"
    with pytest.raises(RouterThresholdError):
        r.recalibrate([0.5] * 5)
    with pytest.raises(RouterThresholdError):
        r.recalibrate([2.0] * 30)


def test_shipped_artifact_loads() -> None:
    router = Router.load()
    assert len(router.manifest["golden"]["scores"]) == 8  # checked on load, on any scikit-learn
    s = router.score("What is the capital of France? Answer with a short phrase only.")
    assert 0.0 < s < 1.0
    assert router.label in ("cloud-needed", "local-wrong")
    assert 0.0 < router.threshold(cloud_share=0.5) < 1.0
