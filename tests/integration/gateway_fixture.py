"""A gateway in this process for the integration tests and the benchmark: `hybridllm.gateway`'s
app over a real `HybridClient` (the real local engine, the stand-in cloud reached through a
`FaultProxy`), run by uvicorn on its own event loop in a thread, on a free loopback port."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import uvicorn

from hybridllm import HybridClient, LlamaCppEngine
from hybridllm.gateway.app import create_app
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.local.resolve import resolve_model
from hybridllm.testing.server import free_port

# a local model whose template renders tools (SmolLM2's does not)
LOCAL_MODEL = "qwen2.5-coder-0.5b-instruct"


def local_engine() -> LlamaCppEngine:
    """The gateway tests' local engine: Qwen2.5-Coder 0.5B, one thread, a 2,048-token context."""
    path = resolve_model(LOCAL_MODEL, pull=True)
    return LlamaCppEngine(str(path), n_threads=1, n_ctx=2048, warm_up=False)


# a model here is a policy: these pin the engine, so a test knows which one answers
POLICIES = {
    "gw-local": '[sampling]\ntemperature = 0.0\nmax_tokens = 24\n[routing]\nprefer = "local"\n'
    'allow_cloud = false\nfallback_order = ["local"]\n',
    "gw-cloud": '[sampling]\ntemperature = 0.0\nmax_tokens = 24\n[routing]\nprefer = "cloud"\n'
    'fallback_order = ["cloud"]\n',
}


def write_policies(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in POLICIES.items():
        (directory / f"{name}.toml").write_text(text)
    return directory


class InProcessGateway:
    """uvicorn serving the gateway over `client` in a thread (its lifespan opens the client on
    that thread's event loop); `url` is the base URL of the API (…/v1)."""

    def __init__(
        self, client: HybridClient, limits: GatewayLimits, api_key: str | None = None
    ) -> None:
        self.client, self.port = client, free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = create_app(client, limits, api_key=api_key)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 120.0  # the local model loads in the lifespan
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process gateway did not start")
            time.sleep(0.05)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30.0)
