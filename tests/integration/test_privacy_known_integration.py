"""The privacy judge's name test on the real local model (llama-cpp-python on the test GGUF),
with the real loopback cloud behind a recording FaultProxy: the engine scores a plain text
token by token, reusing the KV cache for a shared prefix and leaving the engine free; a name
every model knows scores above the bar measured on invented names, an invented one far below;
and through `HybridClient` under "keep-local" a question about a public figure that the shipped
list does not hold goes to the cloud, while a private name alone stays on the device and never
reaches the wire. (The test's recall on public figures, per model, is measured by
benchmarks/bench_privacy.py --judge-model, not asserted here.)"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.engines.capabilities import ScoresText
from hybridllm.guard.privacy_known import FRAME, NameRecogniser
from hybridllm.guard.privacy_ner import default_scanner
from hybridllm.guard.privacy_public import is_public_figure
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY
from tests.integration.test_guarded_integration import leaked, on_the_wire

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
# left off the shipped list on purpose (an ordinary private name too; checked below), known to
# the test model with a margin of about 2.4 nats over its bar; the private name scores some 20
# nats under it
OFF_LIST = "Helen Keller"
PRIVATE = "Hannah Lindqvist"


async def test_the_engine_scores_a_text_and_the_bar_separates_names(model_path: Path) -> None:
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=2)
    await local.start()
    try:
        assert isinstance(local, ScoresText)
        first = await local.text_logprobs(f"{FRAME} Barack", " Obama")
        assert first and all(lp <= 0.0 for lp in first)
        again = await local.text_logprobs(f"{FRAME} Barack", " Obama")
        assert again == pytest.approx(first, abs=0.05)  # the shared prefix came from the cache
        assert not local.busy
        names = NameRecogniser(local)
        bar = await names.bar()
        assert await names.score("Barack Obama") > bar + 1.0
        assert await names.score(PRIVATE) < bar - 5.0
        assert not await names.known(PRIVATE)
    finally:
        await local.aclose()


async def test_a_public_figure_off_the_list_goes_to_the_cloud_and_a_private_name_does_not(
    proxy: FaultProxy, model_path: Path
) -> None:
    assert not is_public_figure(OFF_LIST)  # else the list, not the judge, would clear it
    proxy.record = True
    # the NER pipelines loaded first: while they load, routing leaves names to the guard at
    # the cloud seam, which knows no public figures (tests/unit/test_keep_local_names.py)
    await anyio.to_thread.run_sync(default_scanner().warm)
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    cloud = OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)
    cloud_first = Policy(
        name="cloud-first-names",
        routing={"prefer": "cloud"},
        privacy={"mode": "keep-local", "ner": True},
        sampling={"max_tokens": 2, "temperature": 0},
    )
    async with HybridClient(
        local=local, cloud=cloud, policy=cloud_first, privacy="keep-local", privacy_judge=30
    ) as c:
        public = await c.complete(f"What did {OFF_LIST} write about her teacher?")
        private = await c.complete(f"Write a birthday note to {PRIVATE} from the team.")
    assert public.trace.engine == "cloud"
    assert "privacy_public_names" in public.trace.reason_codes
    assert private.trace.engine == "local"
    assert not leaked("Lindqvist", on_the_wire(proxy))
    assert len(proxy.requests()) == 1
