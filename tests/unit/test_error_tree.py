"""The error tree reads as one design: each class has one parent, and every refusal (privacy,
budget, no engine allowed; at routing or at the guard) is one documented class, `RefusedError`,
which is not a `ConfigError` (with `ScriptedEngine` doubles: orchestration only)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

import pytest

from hybridllm import HybridClient, Policy, RefusedError, errors
from hybridllm.engines.base import GenerationRequest
from hybridllm.guard.budget import Cap
from hybridllm.guard.prices import ModelPrice, Prices
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

EMAIL = "bob.jones@corp-mail.org"
PRICES = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
NO_CAP_FITS = [Cap(None, "request", 1e-6)]


def tree(root: type[errors.HybridError]) -> list[type[errors.HybridError]]:
    """`root` and every class of the package under it (tests' own subclasses left out)."""
    found = [root]
    for sub in root.__subclasses__():
        if sub.__module__.startswith("hybridllm."):
            found += tree(sub)
    return found


def test_every_error_has_one_parent_in_the_tree() -> None:
    classes = tree(errors.HybridError)
    assert len(classes) > 30 and errors.RefusedError in classes
    for cls in classes[1:]:
        parents = [b for b in cls.__bases__ if issubclass(b, errors.HybridError)]
        assert len(parents) == 1, f"{cls.__name__} has {len(parents)} HybridError parents"
        chain = [c for c in cls.__mro__ if issubclass(c, errors.HybridError)]
        # the MRO inside the tree is one line: each class's parent is the next one
        assert all(a.__bases__[0] is b for a, b in zip(chain, chain[1:], strict=False)), chain


def test_the_module_docstring_draws_every_class() -> None:
    drawn = set(re.findall(r"\w+", errors.__doc__ or ""))
    assert {cls.__name__ for cls in tree(errors.HybridError)} <= drawn


def test_refusals_are_not_config_errors_and_never_retried() -> None:
    assert not issubclass(errors.RefusedError, errors.ConfigError | errors.EngineError)
    assert issubclass(errors.PrivacyBlockedError, errors.RefusedError)
    assert issubclass(errors.BudgetExceededError, errors.RefusedError)
    refused = errors.RefusedError("request refused", reasons=("no engine -> refused",))
    assert not refused.retryable and not refused.received_content and refused.engine is None
    assert str(refused) == "request refused (decision: no engine -> refused)"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("RequestRefusedError", "RefusedError"),
        ("PrivacyRefusedError", "PrivacyBlockedError"),
        ("BudgetRefusedError", "BudgetExceededError"),
    ],
)
def test_the_old_refusal_names_are_deprecated_aliases(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: it is {new}"):
        assert getattr(errors, old) is getattr(errors, new)
    with pytest.raises(AttributeError):
        errors.NoSuchError  # type: ignore[attr-defined]  # noqa: B018


async def _routing_privacy_block() -> None:
    block = Policy(name="b", routing={"prefer": "cloud"}, privacy={"mode": "block"})
    async with HybridClient(local=_local(), cloud=_cloud(), policy=block) as client:
        await client.complete(f"mail {EMAIL}")


async def _routing_forced_cloud_keep_local() -> None:
    async with HybridClient(local=_local(), cloud=_cloud(), privacy="keep-local") as client:
        await client.complete(f"mail {EMAIL}", engine="cloud")


async def _routing_budget() -> None:
    policy = Policy(name="c", routing={"prefer": "cloud"})
    async with HybridClient(
        cloud=_cloud(), policy=policy, prices=PRICES, budget_caps=NO_CAP_FITS
    ) as client:
        await client.complete("hello")


async def _routing_no_engine_allowed() -> None:
    never = Policy(name="device", routing={"prefer": "local", "allow_cloud": False})
    async with HybridClient(cloud=_cloud(), policy=never) as client:
        await client.complete("hello")


async def _guard_privacy() -> None:
    async with HybridClient(local=_local(), cloud=_cloud(), privacy="keep-local") as client:
        assert client.cloud is not None
        await _drain(client.cloud.stream(_request(f"mail {EMAIL}")))


async def _guard_budget() -> None:
    async with HybridClient(cloud=_cloud(), prices=PRICES, budget_caps=NO_CAP_FITS) as client:
        assert client.cloud is not None
        await _drain(client.cloud.stream(_request("hello")))


REFUSALS: dict[str, tuple[Callable[[], Awaitable[None]], type[RefusedError]]] = {
    "routing: privacy block": (_routing_privacy_block, errors.PrivacyBlockedError),
    "routing: engine=cloud under keep-local": (
        _routing_forced_cloud_keep_local,
        errors.PrivacyBlockedError,
    ),
    "routing: budget": (_routing_budget, errors.BudgetExceededError),
    "routing: no engine allowed": (_routing_no_engine_allowed, errors.RefusedError),
    "guard: privacy": (_guard_privacy, errors.PrivacyBlockedError),
    "guard: budget": (_guard_budget, errors.BudgetExceededError),
}


@pytest.mark.parametrize("path", sorted(REFUSALS))
async def test_every_refusal_is_one_class_whichever_layer_refuses(path: str) -> None:
    run, expected = REFUSALS[path]
    with pytest.raises(RefusedError) as info:
        await run()
    refused = info.value
    assert type(refused) is expected and not isinstance(refused, errors.ConfigError)
    assert not refused.retryable and EMAIL not in str(refused)
    assert bool(refused.reasons) == path.startswith("routing")  # routing says why


def _local() -> ScriptedEngine:
    return ScriptedEngine("local", tokens=["local"])


def _cloud() -> ScriptedEngine:
    return ScriptedEngine("cloud", tokens=["cloud"])


def _request(text: str) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": text},))


async def _drain(chunks: AsyncIterator[object]) -> None:
    async with aclosing(chunks) as stream:
        async for _ in stream:
            pass
