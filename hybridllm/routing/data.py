"""Labelled router data: loading `labels.jsonl` and the stable train / calibration / test split.

Each row of the file (written by `scripts/label_router_data.py`) is one prompt with both
engines' answers scored against the ground truth. The split of an item depends only on a sha256
of `source/id`, so it never changes when rows are added, reordered or relabelled, and the test
split is never used to train or tune.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hybridllm.errors import ConfigError
from hybridllm.routing.features import Messages

Split = Literal["train", "calibration", "test"]
Label = Literal["cloud-needed", "local-wrong"]
LABELS: dict[Label, str] = {
    "cloud-needed": "1 = the local answer was wrong and the cloud's right (the cloud is needed)",
    "local-wrong": "1 = the local answer was wrong (whether or not the cloud's was right)",
}
SPLITS: tuple[Split, ...] = ("train", "calibration", "test")
SPLIT_BOUNDS = (0.6, 0.8)  # train below 0.6, calibration below 0.8, test above


@dataclass(frozen=True, slots=True)
class Example:
    """One labelled prompt (text, or messages for logged traffic). `local_correct` /
    `cloud_correct`: each engine's answer was right."""

    source: str
    id: str
    prompt: Messages
    local_correct: bool
    cloud_correct: bool
    prompt_tokens: int = 0

    def label(self, kind: Label = "cloud-needed") -> bool:
        """The router's training label (see LABELS)."""
        if kind == "local-wrong":
            return not self.local_correct
        return not self.local_correct and self.cloud_correct

    @property
    def key(self) -> str:
        return f"{self.source}/{self.id}"


def as_label(value: object) -> Label:
    """A label name checked against LABELS (a ConfigError otherwise)."""
    for label in LABELS:
        if value == label:
            return label
    raise ConfigError(f"unknown router label {value!r}; known: {', '.join(LABELS)}")


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
