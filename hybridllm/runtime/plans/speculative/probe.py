"""Finding an endpoint's verifier dialect (`verifier`), once per endpoint: small fixed
requests with no user data, in the order vLLM's `prompt_logprobs`, echo log-probabilities,
OpenAI Predicted Outputs; none, with the reasons, when nothing answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridllm import errors
from hybridllm.engines.capabilities import VerificationPost
from hybridllm.runtime.plans.speculative.dialect_llama import EchoVerifier, echo_shift
from hybridllm.runtime.plans.speculative.dialect_openai import PredictionVerifier
from hybridllm.runtime.plans.speculative.dialect_vllm import probe_vllm
from hybridllm.runtime.plans.speculative.verifier import Probed, first_choice

_PROBE_TEXT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18"


async def probe(
    post: VerificationPost, local_ids: Sequence[int] | None = None, local_pieces: Sequence[str] = ()
) -> Probed:
    """Find the endpoint's dialect with small fixed requests (no user data), each sent by
    `post` (the cloud guard's): vLLM's `prompt_logprobs` (token-level when `local_ids`, the
    local tokenizer's ids of the probe text, come back decoded as `local_pieces`), then echo
    log-probabilities, then Predicted Outputs; None with the reasons when none answers."""
    why: list[str] = []
    found = await _probe_completions(post, local_ids, local_pieces, why)
    if found is None:
        found = await _probe_predicted_outputs(post, why)
    return found or Probed(None, "no verification dialect: " + "; ".join(why))


async def _probe_completions(
    post: VerificationPost,
    local_ids: Sequence[int] | None,
    local_pieces: Sequence[str],
    why: list[str],
) -> Probed | None:
    """Dialect (b) or (a) on `/v1/completions`, else None with the reason added to `why`."""
    body: dict[str, Any] = {
        "prompt": _PROBE_TEXT,
        "echo": True,
        "logprobs": 2,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
    }
    try:
        data = await post("completions", body)
        choice = first_choice(data)
        if isinstance(choice.get("prompt_logprobs"), list):
            return await probe_vllm(post, local_ids, local_pieces)
        shift = echo_shift(data)
        if shift is not None and echo_shift(data, None) is not None:
            return Probed(EchoVerifier(shift), f"echo-logprobs (rows shifted by {shift})")
        why.append(
            "completions: no prompt_logprobs, and echo log-probabilities do not predict the "
            "echoed text (llama_cpp.server needs --logits_all true)"
        )
    except errors.RefusedError:  # the guard said no: not an answer about the dialect
        raise
    except errors.HybridError as exc:
        why.append(f"completions: {exc}")
    return None


async def _probe_predicted_outputs(post: VerificationPost, why: list[str]) -> Probed | None:
    """Dialect (c) on `/v1/chat/completions`, else None with the reason added to `why`."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Reply with the word OK."}],
        "max_tokens": 2,
        "temperature": 0.0,
        "prediction": {"type": "content", "content": "OK"},
    }
    try:
        data = await post("chat/completions", body)
        details = (data.get("usage") or {}).get("completion_tokens_details") or {}
        if "accepted_prediction_tokens" in details:
            return Probed(PredictionVerifier(), "predicted-outputs")
        why.append("chat: no prediction token counts in the usage")
    except errors.RefusedError:  # the guard said no: not an answer about the dialect
        raise
    except errors.HybridError as exc:
        why.append(f"chat: {exc}")
    return None
