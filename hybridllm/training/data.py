"""Labelled router data: loading `labels.jsonl` and the stable train / calibration / test split,
and the local model's signals on those rows (`load_signals`, `load_whole_inputs`).

Each row of the file (written by `scripts/label_router_data.py`) is one prompt with both
engines' answers scored against the ground truth. The split of an item depends only on a sha256
of `source/id`, so it never changes when rows are added, reordered or relabelled, and the test
split is never used to train or tune.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from hybridllm.errors import ConfigError
from hybridllm.routing.labels import Example
from hybridllm.routing.stage2 import judged_inputs

Split = Literal["train", "calibration", "test"]
SPLITS: tuple[Split, ...] = ("train", "calibration", "test")
SPLIT_BOUNDS = (0.6, 0.8)  # train below 0.6, calibration below 0.8, test above
WHOLE_FILE = "answer_signals.jsonl"  # beside the signals: `label_local_signals.py --whole`


def split_of(source: str, item_id: str) -> Split:
    """The split of an item: a stable function of its source and id."""
    digest = hashlib.sha256(f"{source}/{item_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < SPLIT_BOUNDS[0]:
        return "train"
    return "calibration" if u < SPLIT_BOUNDS[1] else "test"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_examples(path: Path) -> list[Example]:
    """Read a labels file; a malformed line is a ConfigError naming the file and line. Repeated
    items (same source and id) keep their first row."""
    if not path.is_file():
        raise ConfigError(f"{path}: labelled data not found")
    out: list[Example] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ex = Example(
                    source=str(row["source"]),
                    id=str(row["id"]),
                    prompt=str(row["prompt"]),
                    local_correct=bool(row["local"]["correct"]),
                    cloud_correct=bool(row["cloud"]["correct"]),
                    prompt_tokens=int(row["local"].get("prompt_tokens", 0)),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{n}: malformed label row ({exc!r})") from exc
            if ex.key not in seen:
                seen.add(ex.key)
                out.append(ex)
    return out


def by_split(examples: Iterable[Example]) -> dict[Split, list[Example]]:
    out: dict[Split, list[Example]] = {s: [] for s in SPLITS}
    for ex in examples:
        out[split_of(ex.source, ex.id)].append(ex)
    return out


def write_split_file(examples: Sequence[Example], path: Path) -> None:
    """Record the split of every item (`source<TAB>id<TAB>split`, sorted) for review."""
    lines = sorted(f"{ex.source}\t{ex.id}\t{split_of(ex.source, ex.id)}" for ex in examples)
    path.write_text("source\tid\tsplit\n" + "".join(f"{line}\n" for line in lines))


def load_signals(path: Path) -> dict[str, dict[str, float]]:
    """The labeller's side file (`scripts/label_local_signals.py`): {"source/id": signals}."""
    if not path.is_file():
        raise ConfigError(f"{path}: local signals not found (scripts/label_local_signals.py)")
    out: dict[str, dict[str, float]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            sig = {str(k): math.nan if v is None else float(v) for k, v in row["signals"].items()}
            out.setdefault(f"{row['source']}/{row['id']}", sig)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: malformed signals row ({exc!r})") from exc
    return out


def load_whole_inputs(path: Path, whole_path: Path | None = None) -> dict[str, dict[str, float]]:
    """The "answer" models' inputs per labelled row (`whole_inputs`): the signals side file at
    `path` with the whole answers' figures (`whole_path`, default `answer_signals.jsonl` beside
    it); free-form rows without them are left out, multiple-choice rows kept as they are."""
    head = load_signals(path)
    whole_path = whole_path or path.with_name(WHOLE_FILE)
    if not whole_path.is_file():
        raise ConfigError(
            f"{whole_path}: whole answers' figures not found "
            "(scripts/label_local_signals.py --whole)"
        )
    whole = load_signals(whole_path)
    judged = {k: judged_inputs(v, whole.get(k)) for k, v in head.items()}
    return {k: v for k, v in judged.items() if v is not None}
