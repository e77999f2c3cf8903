"""Dialect (c), OpenAI Predicted Outputs: the draft is the prediction; the cloud generates its own
text (at most k + 1 tokens) and `usage.completion_tokens_details` says how many prediction
tokens it accepted and rejected; rejected ones are billed as output (they are in
`completion_tokens`). Closed APIs cannot score given tokens, so this is the only dialect they
offer, and the round's committed text is simply the cloud's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridllm.engines.base import CONTINUE_INSTRUCTION
from hybridllm.engines.capabilities import VerificationPost
from hybridllm.runtime.plans.speculative.verifier import (
    Dialect,
    Round,
    Verdict,
    billed_usage,
    first_choice,
)


@dataclass
class PredictionVerifier:
    """Chat completions with `prediction={"type": "content", "content": draft}`."""

    dialect: Dialect = "predicted-outputs"
    token_level: bool = False
    samples: bool = False
    counts: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "rejected": 0})

    async def verify(self, round_: Round, post: VerificationPost) -> Verdict:
        messages = [dict(m) for m in round_.messages]
        if round_.committed_text:
            messages += [
                {"role": "assistant", "content": round_.committed_text},
                {"role": "user", "content": CONTINUE_INSTRUCTION},
            ]
        body = {
            "messages": messages,
            "temperature": 0.0,
            "max_tokens": len(round_.draft_ids) + 1,
            "prediction": {"type": "content", "content": round_.draft_text},
        }
        return self.read(await post("chat/completions", body), round_)

    def read(self, data: Mapping[str, Any], round_: Round) -> Verdict:
        choice = first_choice(data)
        text = str((choice.get("message") or {}).get("content") or "")
        p_tok, c_tok, reported = billed_usage(data)
        details = (data.get("usage") or {}).get("completion_tokens_details") or {}
        self.counts["accepted"] += int(details.get("accepted_prediction_tokens") or 0)
        self.counts["rejected"] += int(details.get("rejected_prediction_tokens") or 0)
        n, acc = 0, 0
        for piece in round_.draft_pieces:
            if not text.startswith(piece, acc):
                break
            acc += len(piece)
            n += 1
        finished = choice.get("finish_reason") == "stop"
        return Verdict(n, text, text[:acc], None, finished, p_tok, c_tok, None, reported)
