"""Budget caps hold without `prices=` (issue 24, section 6): hybridllm ships prices for a few
well-known models, a user's own endpoint is priced by a file of the documented format, and a
cap that cannot be costed is a typed error at the first request under it, never a cap that
silently does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import ConfigError, HybridClient, Prices
from hybridllm.errors import PolicyError
from hybridllm.guard.prices import ModelPrice
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


def test_the_shipped_prices_load_and_price_dated_snapshots_as_their_model() -> None:
    prices = Prices.shipped()
    assert prices.price("gpt-4o-mini") == ModelPrice(input_per_million=0.15, output_per_million=0.6)
    assert prices.price("gpt-4o-mini-2024-07-18") == prices.price("gpt-4o-mini")
    assert prices.find("gpt-4o-mini-latest") is None and prices.default is None
    assert all(p.input_per_million > 0 and p.output_per_million > 0 for p in prices.models.values())
    with pytest.raises(ConfigError, match="no price for model 'my-llama'.*prices="):
        prices.price("my-llama")


def engines(model: str) -> tuple[ScriptedEngine, ScriptedEngine]:
    return (
        ScriptedEngine("local", tokens=["local"]),
        ScriptedEngine("cloud", tokens=["cloud"], model=model),
    )


async def test_a_preset_cap_holds_without_prices() -> None:
    """batch.toml caps a request at $0.05: 6,000 output tokens of gpt-4o ($10 per million) are
    $0.06, so the request goes local with the budget's reason; a small one goes to the cloud."""
    local, cloud = engines("gpt-4o")
    async with HybridClient(local=local, cloud=cloud, policy="batch", router=None) as client:
        big = await client.complete("report", max_tokens=6000)
        small = await client.complete("report", max_tokens=100)
    assert big.text == "local" and "budget_local" in big.trace.reason_codes
    assert small.text == "cloud" and len(cloud.requests) == 1
    assert small.trace.cost_usd is not None and small.trace.cost_usd > 0  # costed and settled


async def test_a_cap_that_cannot_be_costed_is_a_policy_error(tmp_path: Path) -> None:
    local, cloud = engines("my-llama")
    async with HybridClient(local=local, cloud=cloud, policy="batch", router=None) as client:
        with pytest.raises(PolicyError, match="'batch' caps cloud spend.*'my-llama'.*prices="):
            client.stream("report")
        assert (await client.complete("hi", policy="chat")).text  # an uncapped policy serves
    assert not any(r.messages[-1]["content"] == "report" for r in cloud.requests)
    own = tmp_path / "prices.toml"  # the documented format: a user's own endpoint, free
    own.write_text("[default]\ninput_per_million = 0\noutput_per_million = 0\n")
    async with HybridClient(local=local, cloud=cloud, policy="batch", prices=own) as client:
        done = await client.complete("report", max_tokens=100)
    assert done.text == "cloud" and done.trace.cost_usd == 0
