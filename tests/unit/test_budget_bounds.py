"""The reservation is the true upper bound of what a cloud request can be billed (issue 24,
section 6): Predicted Outputs bill rejected prediction tokens as output, so the speculative
plan's verification rounds and its probe reserve the prediction as output too."""

from __future__ import annotations

from typing import Any

import pytest

from hybridllm import GuardedEngine, ModelPrice, Prices, SQLiteLedger
from hybridllm.engines.base import prompt_token_bound
from hybridllm.guard.guarded import RequestContext
from hybridllm.runtime.plans.speculative.dialect_openai import PredictionVerifier
from hybridllm.runtime.plans.speculative.outlook import SpeculationState
from hybridllm.runtime.plans.speculative.verifier import Round
from hybridllm.testing import ScriptedEngine
from tests.unit.test_speculative_units import replay

pytestmark = pytest.mark.anyio

PRICE = ModelPrice(input_per_million=1.0, output_per_million=2.0)


class CharDrafter:
    """One token per character (what the probe asks of the local model)."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def piece(self, ids: list[int], prev: object = ()) -> bytes:
        return "".join(chr(i) for i in ids).encode()


class Answers(ScriptedEngine):
    """A cloud double that verifies at an endpoint: one documented chat completions answer."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("cloud")
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []

    def verification_endpoint(self) -> tuple[str, str]:
        return ("http://x/v1", "scripted")

    async def verification_post(self, path: str, body: Any) -> dict[str, Any]:
        self.bodies.append(dict(body))
        return self.answer


async def test_a_predicted_outputs_round_reserves_its_draft_as_output() -> None:
    from hybridllm.runtime.plans.speculative.plan import SpeculativeSetup
    from hybridllm.runtime.plans.speculative.rounds import verify_round

    answer = {
        "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "d0 x"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6},
    }
    ledger = SQLiteLedger()
    prices = Prices(models={"scripted": PRICE})
    guard = GuardedEngine(Answers(answer), privacy="off", ledger=ledger, prices=prices)
    cloud = guard.bind(RequestContext())
    setup = SpeculativeSetup(ScriptedEngine("local"), cloud, SpeculationState())
    round_ = Round(
        "p", "", [1, 2], [3, 4, 5], ["d0", "d1", "d2"], [{"role": "user", "content": "q"}]
    )
    await verify_round(setup, (PredictionVerifier(), cloud), round_)
    prompt = max(prompt_token_bound([{"role": "user", "content": "pd0d1d2"}]), 5)
    # k + 1 tokens of its own text, and the 6-byte draft: rejected prediction tokens bill
    entry = ledger.entries()[0]
    assert entry["reserved_nano"] == PRICE.cost_nano(prompt, 3 + 1 + 6)
    assert entry["overrun_nano"] == 0


async def test_the_predicted_outputs_probe_reserves_its_prediction_as_output() -> None:
    openai_like = {
        "/chat/completions": {
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "OK"}}],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 1,
                "completion_tokens_details": {"accepted_prediction_tokens": 1},
            },
        },
        "/completions": 404,
    }
    ledger = SQLiteLedger()
    prices = Prices(models={"m": PRICE})
    async with replay(openai_like) as engine:
        guard = GuardedEngine(engine, privacy="off", ledger=ledger, prices=prices)
        key = guard.verification_endpoint()
        assert key is not None
        state = SpeculationState()
        found = await state.verifier(key, guard.verification_post, CharDrafter())  # type: ignore[arg-type]
    assert isinstance(found.verifier, PredictionVerifier), found.reason
    chat = ledger.entries()[-1]
    bound = prompt_token_bound([{"role": "user", "content": "Reply with the word OK."}])
    assert chat["state"] == "settled"
    assert chat["reserved_nano"] == PRICE.cost_nano(bound, 2 + len("OK"))  # max_tokens + "OK"
