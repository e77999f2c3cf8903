"""A request's keyword arguments are one typed list (`hybridllm.client.StreamArgs`), shared by
`stream()`, `complete()`, `decide()` and the blocking forms.

mypy catches a misspelt one in every form: `mypy --strict tests/unit/test_request_args.py`
needs each `type: ignore[call-arg]` below (strict mode reports an ignore that is not needed,
as it would be with `**kwargs: Any`). At run time the misspelt keyword is an
`InvalidArgumentError` that names it, before anything is sent.
"""

from __future__ import annotations

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import InvalidArgumentError
from hybridllm.routing.decision import RoutePreview
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

MISSPELT = "max_token must be a known keyword argument"


async def test_every_form_takes_the_same_keyword_arguments() -> None:
    local = ScriptedEngine("local", tokens=["a", "b"])
    async with HybridClient(local=local, policy=Policy(name="p")) as client:
        preview = client.decide("hi", "chat", max_tokens=2, temperature=0.0, plan="single")
        done = await client.complete("hi", max_tokens=2, temperature=0.0, plan="single")
        s = client.stream("hi", policy="chat", max_tokens=2, temperature=0.0, engine="local")
        streamed = "".join([t async for t in s])
    assert isinstance(preview, RoutePreview) and preview.facts.max_tokens == 2
    assert done.text == streamed == "ab"
    assert [(r.max_tokens, r.temperature) for r in local.requests] == [(2, 0.0), (2, 0.0)]


async def test_a_misspelt_keyword_is_refused_by_name_in_every_async_form() -> None:
    local = ScriptedEngine("local", tokens=["a"])
    async with HybridClient(local=local) as client:
        with pytest.raises(InvalidArgumentError, match=MISSPELT) as err:
            client.stream("hi", max_token=5)  # type: ignore[call-arg]
        with pytest.raises(InvalidArgumentError, match=MISSPELT):
            await client.complete("hi", max_token=5)  # type: ignore[call-arg]
        with pytest.raises(InvalidArgumentError, match=MISSPELT):
            client.decide("hi", "chat", max_token=5)  # type: ignore[call-arg]
    assert err.value.argument == "max_token" and err.value.value == 5
    assert not local.requests


def test_a_misspelt_keyword_is_refused_by_name_in_the_blocking_forms() -> None:
    local = ScriptedEngine("local", tokens=["a"])
    with HybridClient(local=local) as client:
        with pytest.raises(InvalidArgumentError, match=MISSPELT):
            client.complete_sync("hi", max_token=5)  # type: ignore[call-arg]
        with pytest.raises(InvalidArgumentError, match=MISSPELT):
            list(client.stream_sync("hi", max_token=5))  # type: ignore[call-arg]
        assert client.complete_sync("hi", max_tokens=1).text == "a"
    assert len(local.requests) == 1
