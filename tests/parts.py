"""Parts a test needs beyond the Python packages every run has (Node.js, the privacy extra):
where one is missing the test skips on a developer's machine, and runs (so fails for it) in CI
(`CI` or `HYBRIDLLM_CI` set: `.ci/run` sets the latter and installs every part)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

IN_CI = bool(os.environ.get("CI") or os.environ.get("HYBRIDLLM_CI"))

HAS_NODE = shutil.which("node") is not None
HAS_NER = all(importlib.util.find_spec(p) for p in ("presidio_analyzer", "spacy"))


def needs(present: bool, reason: str) -> pytest.MarkDecorator:
    """Skip where the part is missing, except in CI, where a missing part fails the test."""
    return pytest.mark.skipif(not present and not IN_CI, reason=reason)


def skip_unless(present: bool, reason: str) -> None:
    """`needs`, inside a test: skip here, fail in CI."""
    if present:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI installs every part)")
    pytest.skip(reason)
