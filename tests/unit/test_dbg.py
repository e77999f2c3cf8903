import pytest
from tests.unit.test_engines_by_name import trio, QUALITY
from hybridllm import HybridClient
pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]
async def test_x():
    engines = trio([0.2, "smart ", 0.01, "answer"], [0.1, "fast"])
    async with HybridClient(engines=engines, policy=QUALITY, router=None) as client:
        t = client._ticket("q", {}, streamed=True)
        print(t.clouds, t.cloud, client._roster)
        async with client.stream("q") as s:
            async for e in s.events(): print(e)
