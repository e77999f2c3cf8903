"""Shared by both kinds of test. `unit/` needs no model, no network and no server; everything
under `integration/` (the real llama-cpp-python engine on a real GGUF, the real loopback server)
is marked `integration`, so `pytest -m "not integration"` or `pytest tests/unit` runs the fast
part alone."""

from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).parent / "integration"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
