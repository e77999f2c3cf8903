"""What the router learns to predict: its labels, and one labelled prompt (`Example`).

The decision log turns feedback into examples (`DecisionLog.training_examples`) and the artifact
names its label, so these live with the router; loading labelled files and splitting them is
training's (`hybridllm.training.data`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridllm.errors import ConfigError
from hybridllm.routing.features import Messages

Label = Literal["cloud-needed", "local-wrong"]
LABELS: dict[Label, str] = {
    "cloud-needed": "1 = the local answer was wrong and the cloud's right (the cloud is needed)",
    "local-wrong": "1 = the local answer was wrong (whether or not the cloud's was right)",
}


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
