"""The router artifact on disk: `router.skops` plus `manifest.json`, in one directory, and
(since issue 45) `router.npz`, the same fitted numbers as plain arrays.

The skops file holds the fitted scikit-learn estimators, per head of the router (see
`router.FORMS`) a linear classifier and its Platt calibrator, and is loaded with an explicit
list of trusted types, so loading never executes code from the file. The manifest records the
heads, the training data hash and row counts, the library and feature versions, the metrics, the
calibration (score quantiles and quality curve), the sha256 of the skops file and (since
golden scores were added) `golden`: a few fixed prompts and the router's scores for them at
training time. Loading checks, in order: the files exist, the manifest parses and names a known
format, the skops file's hash matches, the feature version matches; then the versions:

- with `golden`, any scikit-learn version is accepted whose unpickled router reproduces the
  golden scores within `GOLDEN_TOLERANCE` (absolute). Scoring is plain numpy over the stored
  weights (see `router.py`), so scikit-learn matters only for unpickling via skops, and the
  golden scores check exactly that (and numpy, and the features) on this install;
- without `golden` (older manifests), the scikit-learn minor version must match the training's.

`router.npz` holds each estimator's `coef_` and `intercept_` (all that scoring reads), written
beside the skops file at training; the manifest's `weights` records its sha256 and the skops
file's it was taken from. Loading reads it, with numpy alone (`allow_pickle=False`), where it
is there and was taken from the skops file present: importing scikit-learn and skops to unpickle
took 2 s of a client's start here (issue 45). A weights file whose hash does not match is
tampered with; one taken from another skops file (that file replaced since), or none, and the
skops file is unpickled as before. The golden scores check what was read either way.

Each failure is a RouterArtifactError with a `reason`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm.errors import RouterArtifactError
from hybridllm.routing import features as F
from hybridllm.routing.heads import FORMS, Calibration, Head
from hybridllm.routing.labels import LABELS

FORMAT = 2  # 2: estimators per head, manifest "heads"; 1: one head, {classifier, calibrator}
READS = (1, 2)
MODEL_FILE = "router.skops"
WEIGHTS_FILE = "router.npz"
MANIFEST_FILE = "manifest.json"
ROUTER_DIR_ENV = "HYBRIDLLM_ROUTER_DIR"
TRUSTED_TYPES = ["sklearn.linear_model._logistic.LogisticRegression"]
GOLDEN_TOLERANCE = 1e-9  # absolute, per golden score


def default_dir() -> Path:
    """`$HYBRIDLLM_ROUTER_DIR`, else `router/` in the models directory (the shipped one)."""
    env = os.environ.get(ROUTER_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from hybridllm.local.models import manifests_dir

    return manifests_dir() / "router"


def library_versions() -> dict[str, str]:
    import numpy
    import sklearn
    import skops

    return {"sklearn": sklearn.__version__, "skops": skops.__version__, "numpy": numpy.__version__}


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def sha256_hex(data: bytes) -> str:
    """The sha256 of a file's bytes, as the manifest records it."""
    return hashlib.sha256(data).hexdigest()


def head_from(estimators: dict[str, Any]) -> Head:
    """A `Head` from a fitted {classifier, calibrator} pair."""
    clf, platt = estimators["classifier"], estimators["calibrator"]
    return Head(
        weights=np.asarray(clf.coef_, dtype=np.float64).ravel(),
        intercept=float(np.ravel(clf.intercept_)[0]),
        platt=(float(np.ravel(platt.coef_)[0]), float(np.ravel(platt.intercept_)[0])),
    )


@dataclass(frozen=True)
class Parts:
    """What a checked artifact holds: the heads, their calibration and the whole manifest."""

    heads: dict[str, Head]
    calibration: Calibration
    manifest: dict[str, Any]


def load_parts(directory: Path) -> Parts:
    """Read and check a router directory; any problem is a RouterArtifactError."""
    mpath, fpath = directory / MANIFEST_FILE, directory / MODEL_FILE
    for p in (mpath, fpath):
        if not p.is_file():
            raise RouterArtifactError(
                "router artifact file missing (train one with `hybridllm router train`)",
                path=p,
                reason="missing",
            )
    manifest = _read_manifest(mpath)
    declared, fmt = manifest["artifact"]["sha256"], manifest["format"]
    blob = fpath.read_bytes()
    actual = sha256_hex(blob)
    if actual != declared:
        raise RouterArtifactError(
            f"router file sha256 {actual[:12]}... does not match the manifest's "
            f"{str(declared)[:12]}... (modified or tampered with)",
            path=fpath,
            reason="tampered",
        )
    _check_versions(manifest, mpath)
    names = list(manifest.get("heads", FORMS["single"]))
    estimators = read_weights(directory, manifest, names) if fmt != 1 else None
    try:
        if estimators is None:
            estimators = _load_estimators(blob, fpath, names, flat=fmt == 1,
                                          verified="golden" in manifest)  # fmt: skip
    except RouterArtifactError as exc:
        trained, here = _sklearn_versions(manifest)
        if exc.reason == "malformed" and _minor(trained) != _minor(here):
            raise RouterArtifactError(
                f"router saved with scikit-learn {trained} does not load with this install's "
                f"{here} ({exc}): retrain it (`hybridllm router train`) or install "
                f"scikit-learn {_minor(trained)}",
                path=fpath,
                reason="version",
            ) from exc
        raise
    try:
        parts = Parts(
            heads={n: head_from(estimators[n]) for n in names},
            calibration=Calibration.from_json(manifest["calibration"]),
            manifest=manifest,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RouterArtifactError(
            f"router artifact does not fit this router ({exc})", path=fpath, reason="malformed"
        ) from exc
    return parts


def _read_manifest(mpath: Path) -> dict[str, Any]:
    """The manifest, parsed: it names the file's hash, a format this hybridllm reads and a
    known label."""
    try:
        manifest = json.loads(mpath.read_text())
        _ = manifest["artifact"]["sha256"]  # it names the file's hash
        fmt = manifest["format"]
        if manifest.get("label", "cloud-needed") not in LABELS:
            raise ValueError(f"unknown label {manifest.get('label')!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise RouterArtifactError(
            f"malformed router manifest ({exc!r})", path=mpath, reason="malformed"
        ) from exc
    if fmt not in READS:
        raise RouterArtifactError(
            f"router manifest format {fmt!r}, this hybridllm reads {list(READS)}",
            path=mpath,
            reason="version",
        )
    return dict(manifest)


def load_extra(directory: Path, manifest: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The estimators stored under `keys` beside the heads (stage 2), checked as the heads are
    (file hash, trusted types); a missing key is a RouterArtifactError."""
    weights = read_weights(directory, manifest, keys)
    if weights is not None:  # the skops file is not read again
        return weights
    fpath = directory / MODEL_FILE
    blob = fpath.read_bytes()
    if sha256_hex(blob) != manifest["artifact"]["sha256"]:
        raise RouterArtifactError("router file changed since its manifest was checked",
                                  path=fpath, reason="tampered")  # fmt: skip
    return _load_estimators(blob, fpath, keys, flat=False, verified=True)


@dataclass(frozen=True)
class Linear:
    """A fitted linear model's numbers as scoring reads them (`coef_`, `intercept_`), read
    from `router.npz` in place of the scikit-learn estimator they were taken from."""

    coef_: np.ndarray
    intercept_: np.ndarray


def weights_blob(estimators: dict[str, Any]) -> bytes:
    """`router.npz`'s bytes for {key: {"classifier", "calibrator"}} fitted estimators: each
    one's `coef_` and `intercept_` as float64 arrays, in name order, with fixed zip dates (the
    same numbers, the same bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for key, pair in sorted(estimators.items()):
            for role in ("classifier", "calibrator"):
                for part in ("coef_", "intercept_"):
                    info = zipfile.ZipInfo(f"{key}|{role}|{part}.npy", (1980, 1, 1, 0, 0, 0))
                    array = np.ascontiguousarray(getattr(pair[role], part), dtype=np.float64)
                    with z.open(info, "w") as f:
                        np.lib.format.write_array(f, array, allow_pickle=False)
    return buf.getvalue()


def read_weights(
    directory: Path, manifest: dict[str, Any], keys: list[str]
) -> dict[str, Any] | None:
    """{key: {"classifier", "calibrator"}} as `Linear`s from `router.npz`, or None where there
    is none taken from the skops file the manifest names (`_load_estimators` reads that)."""
    entry, wpath = manifest.get("weights"), directory / WEIGHTS_FILE
    if not isinstance(entry, dict) or entry.get("of") != manifest["artifact"]["sha256"]:
        return None  # none, or taken from a skops file since replaced
    if not wpath.is_file():
        return None
    blob = wpath.read_bytes()
    if sha256_hex(blob) != entry.get("sha256"):
        raise RouterArtifactError(
            "router weights file sha256 does not match the manifest's (modified or tampered with)",
            path=wpath,
            reason="tampered",
        )
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        return {
            key: {
                role: Linear(arrays[f"{key}|{role}|coef_"], arrays[f"{key}|{role}|intercept_"])
                for role in ("classifier", "calibrator")
            }
            for key in keys
        }
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise RouterArtifactError(
            f"router weights file does not load ({exc!r})", path=wpath, reason="malformed"
        ) from exc


def _check_versions(manifest: dict[str, Any], mpath: Path) -> None:
    fv = manifest.get("feature_version")
    if fv != F.FEATURE_VERSION or manifest.get("n_hash") != F.N_HASH:
        raise RouterArtifactError(
            f"router trained on feature version {fv} (n_hash {manifest.get('n_hash')}), this "
            f"hybridllm computes version {F.FEATURE_VERSION} (n_hash {F.N_HASH}): retrain it",
            path=mpath,
            reason="version",
        )
    if manifest.get("dense_names") != list(F.DENSE_NAMES):
        raise RouterArtifactError(
            "router trained on other dense features: retrain it", path=mpath, reason="version"
        )
    if "golden" in manifest:
        return  # any scikit-learn that reproduces the golden scores (`check_golden`)
    trained, here = _sklearn_versions(manifest)
    if _minor(trained) != _minor(here):
        raise RouterArtifactError(
            f"router saved with scikit-learn {trained}, this install has {here}: retrain it "
            "(`hybridllm router train`) or install the matching version",
            path=mpath,
            reason="version",
        )


def _sklearn_versions(manifest: dict[str, Any]) -> tuple[str, str]:
    """(the scikit-learn version the router was saved with, this install's)."""
    versions = manifest.get("versions")
    trained = versions.get("sklearn", "?") if isinstance(versions, dict) else "?"
    return str(trained), library_versions()["sklearn"]


def check_golden(
    manifest: dict[str, Any], score: Callable[[F.Messages], float], mpath: Path
) -> None:
    """A loaded router (its `score`) must reproduce the golden scores recorded at training.
    `Router.load` calls this with the router it built; manifests without them pass."""
    if "golden" not in manifest:
        return
    try:
        golden = manifest["golden"]
        prompts, expected = golden["prompts"], [float(x) for x in golden["scores"]]
        if not prompts or len(prompts) != len(expected):
            raise ValueError(f"{len(prompts)} golden prompts, {len(expected)} scores")
        got = [score(p) for p in prompts]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RouterArtifactError(
            f"malformed golden scores in the router manifest ({exc!r})",
            path=mpath,
            reason="malformed",
        ) from exc
    diffs = [abs(g - e) for g, e in zip(got, expected, strict=True)]
    off = [i for i, d in enumerate(diffs) if not d <= GOLDEN_TOLERANCE]  # NaN is off too
    if off:
        worst = max(off, key=lambda i: math.inf if math.isnan(diffs[i]) else diffs[i])
        trained, here = _sklearn_versions(manifest)
        lib = library_versions()
        versions = manifest.get("versions")
        saved = versions if isinstance(versions, dict) else {}
        raise RouterArtifactError(
            f"router does not reproduce its golden scores on this install: golden prompt "
            f"{worst} scores {got[worst]!r}, recorded {expected[worst]!r} (off by "
            f"{diffs[worst]:.3g}, tolerance {GOLDEN_TOLERANCE:g}); saved with scikit-learn "
            f"{trained}, skops {saved.get('skops', '?')}, numpy {saved.get('numpy', '?')}, this "
            f"install has scikit-learn {here}, skops {lib['skops']}, numpy {lib['numpy']}: "
            "retrain it (`hybridllm router train`) or install the versions it was saved with",
            path=mpath,
            reason="version",
        )


def _load_estimators(
    blob: bytes, fpath: Path, heads: list[str], *, flat: bool, verified: bool = False
) -> dict[str, Any]:
    """{head: {classifier, calibrator}}; format 1 files hold one flat pair. `verified`: golden
    scores will check the result, so scikit-learn's warning about unpickling an estimator of
    another version is silenced (the golden check, not that warning, decides)."""
    import warnings

    import skops.io as sio
    from sklearn.exceptions import InconsistentVersionWarning

    try:
        untrusted = sio.get_untrusted_types(data=blob)
        unexpected = sorted(set(untrusted) - set(TRUSTED_TYPES))
        if unexpected:
            raise RouterArtifactError(
                f"router file holds types outside the trusted list: {unexpected}",
                path=fpath,
                reason="tampered",
            )
        with warnings.catch_warnings():
            if verified:
                warnings.simplefilter("ignore", InconsistentVersionWarning)
            obj = sio.loads(blob, trusted=TRUSTED_TYPES)
    except RouterArtifactError:
        raise
    except Exception as exc:  # skops raises many kinds on a corrupt zip
        raise RouterArtifactError(
            f"router file does not load ({type(exc).__name__}: {exc})",
            path=fpath,
            reason="malformed",
        ) from exc
    pair = {"classifier", "calibrator"}
    if not isinstance(obj, dict):
        obj = {}
    parts = {heads[0]: obj} if flat else {h: obj.get(h) for h in heads}
    if not all(isinstance(p, dict) and pair <= p.keys() for p in parts.values()):
        raise RouterArtifactError(
            f"router file does not hold {{'classifier', 'calibrator'}} for heads {heads}",
            path=fpath,
            reason="malformed",
        )
    return parts
