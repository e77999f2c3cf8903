"""Routing reads what the local engine holds of a prompt (issue 28): the prediction counts only
the uncached tokens and the decision's reasons say how many are cached. `ScriptedEngine`
doubles (scripted test engines) on the virtual clock; one says what it holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.capabilities import KnowsCache
from hybridllm.routing import LiveState, Reason, RequestFacts, decide
from hybridllm.runtime.gather import Gatherer
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]
LOCAL = Policy(name="v", routing={"prefer": "local"})


class HoldingLocal(ScriptedEngine):
    """A scripted local engine that says it holds `held` tokens of any prompt."""

    def __init__(self, held: int, **kw: Any) -> None:
        super().__init__("local", **kw)
        self.held = held

    def cached_tokens(self, messages: Sequence[Any]) -> int | None:
        return self.held


def test_the_reasons_say_what_the_local_engine_holds() -> None:
    facts = RequestFacts(900, 64)
    held = decide(facts, LOCAL, LiveState(local_cached_tokens=812))
    assert held.reasons[-1] == Reason(
        "local_cached", "local holds 812 of the prompt's 900 tokens in its KV cache"
    )
    assert "local_cached" not in decide(facts, LOCAL, LiveState()).codes


def test_the_prediction_counts_only_what_is_not_held() -> None:
    gather = Gatherer()
    request = GenerationRequest(({"role": "user", "content": "x" * 400},))
    facts = RequestFacts(900, 64)
    assert gather.local_tokens(facts, request, cached=812) == 88
    assert gather.local_tokens(facts, request) == 900  # nothing known: all of it
    local = HoldingLocal(700, token_count=900)
    assert isinstance(local, KnowsCache)
    assert gather.local_cached(request, {"local": local}) == 700


async def test_explain_shows_the_cached_tokens() -> None:
    local = HoldingLocal(300, tokens=["ok"], token_count=400)
    async with HybridClient(local=local, router=None, policy=LOCAL) as client:
        preview = client.decide("hello there")
    assert preview.state.local_cached_tokens == 300
    assert "local_cached" in preview.decision.codes
