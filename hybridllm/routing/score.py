"""`RouterScore`: what `HybridClient.router_score(messages)` returns (no numpy here: the
client imports it eagerly; the scores are computed in `stage2.router_score`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterScore:
    """`HybridClient.router_score(messages)`: the router's scores for one prompt.

    `text`: stage 1 (the prompt's text). `local`: stage 2 from the local model's own signals
    alone (None without a local engine or a stage-2 artifact). `value`: the score routing uses,
    P(the local answer is wrong and the cloud's right): the combination when there are signals
    and a stage 2, else `text`. `signals`: the raw figures. `cost_ms`: the local work it took;
    `extra_ms` of it, the part a local answer that follows does not reuse (the option rotations:
    the prompt's prefill and the held tokens stay in the KV cache for it).
    `model`: the stage-2 model that gave `value` ("combined"; "combined_plain" for a
    multiple-choice prompt read without its option rotations; "combined_answer" for a judged
    whole answer), None when stage 1 alone decided.
    """

    text: float
    local: float | None
    value: float
    signals: dict[str, float]
    cost_ms: float
    model: str | None = None
    extra_ms: float = 0.0
