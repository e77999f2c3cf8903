"""Writing the router artifact (`router.skops` and `manifest.json`, read by
`hybridllm.routing.artifact`): after training, and after recalibrating on traffic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm.errors import RouterArtifactError
from hybridllm.routing import features as F
from hybridllm.routing.artifact import (
    FORMAT,
    MANIFEST_FILE,
    MODEL_FILE,
    WEIGHTS_FILE,
    library_versions,
    sha256_hex,
    weights_blob,
)
from hybridllm.routing.heads import Head
from hybridllm.routing.router import Router


def weights_sha256(heads: dict[str, Head]) -> str:
    """A hash of the fitted numbers: equal for two trainings that learned the same model."""
    h = hashlib.sha256()
    for name, head in heads.items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(head.weights, dtype=np.float64).tobytes())
        h.update(np.array([head.intercept, *head.platt], dtype=np.float64).tobytes())
    return h.hexdigest()


def save_router(
    directory: Path,
    estimators: dict[str, Any],
    manifest: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `router.skops`, `router.npz` (the same numbers as plain arrays, read at load
    without scikit-learn) and `manifest.json` (it gains format, versions, hashes).

    `estimators`: {head name: {"classifier", "calibrator"}} in `router.FORMS` order; `extra`:
    more estimators under other keys in the same file (stage 2, `load_extra`)."""
    import skops.io as sio

    directory.mkdir(parents=True, exist_ok=True)
    every = {**estimators, **(extra or {})}
    blob = sio.dumps(every)
    (directory / MODEL_FILE).write_bytes(blob)
    weights = weights_blob(every)
    (directory / WEIGHTS_FILE).write_bytes(weights)
    full = {
        "format": FORMAT,
        "feature_version": F.FEATURE_VERSION,
        "n_hash": F.N_HASH,
        "dense_names": list(F.DENSE_NAMES),
        "versions": library_versions(),
        **manifest,
        "heads": list(estimators),
        "artifact": {"file": MODEL_FILE, "sha256": sha256_hex(blob), "bytes": len(blob)},
        "weights": {"file": WEIGHTS_FILE, "sha256": sha256_hex(weights), "of": sha256_hex(blob)},
    }
    text = json.dumps(full, indent=1, sort_keys=False) + "\n"
    (directory / MANIFEST_FILE).write_text(text)
    return full


def save_recalibrated(router: Router, directory: Path) -> Path:
    """Write a copy of `router`'s artifact with its current calibration (e.g. after
    `Router.recalibrate` on traffic) to `directory`; the skops and weights files are copied
    unchanged."""
    if router.path is None:
        raise RouterArtifactError("router was not loaded from disk", path=directory,
                                  reason="missing")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    blob = (router.path / MODEL_FILE).read_bytes()
    if sha256_hex(blob) != router.manifest["artifact"]["sha256"]:
        raise RouterArtifactError("router file changed since it was loaded",
                                  path=router.path / MODEL_FILE, reason="tampered")  # fmt: skip
    if directory.resolve() != router.path.resolve():
        (directory / MODEL_FILE).write_bytes(blob)
        weights = router.path / WEIGHTS_FILE  # its numbers, read at load (absent: unpickled)
        if weights.is_file():
            (directory / WEIGHTS_FILE).write_bytes(weights.read_bytes())
    manifest = {**router.manifest, "calibration": router.calibration.to_json()}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return directory
