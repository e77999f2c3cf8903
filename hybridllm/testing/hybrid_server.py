"""hybridllm's own server (`hybridllm serve-model`) on loopback, for tests, the demo and benchmarks.

::

    with HybridServer("/path/model.gguf", alias="cloud", api_key="sk-test") as server:
        client = OpenAI(base_url=server.base_url, api_key=server.api_key)

The same life cycle as :class:`LlamaServer` (a child process of ``sys.executable`` on a free
port of 127.0.0.1, ready once ``GET /v1/models`` answers, its output in a log file), serving
chat completions and vLLM's ``/v1/completions`` dialect with fast ``prompt_logprobs``
(`hybridllm.server`). ``extra_args`` are `hybridllm serve-model` options.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

from hybridllm.testing.server import LlamaServer

__all__ = ["HybridServer"]


class HybridServer(LlamaServer):
    label = "hybridllm serve-model"

    def command(self, port: int) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "hybridllm.server",
            str(self.model_path),
            "--port",
            str(port),
            "--n-ctx",
            str(self.n_ctx),
            "--alias",
            self.model,
        ]
        if self.api_key is not None:
            cmd += ["--api-key", self.api_key]
        if self.n_threads is not None:
            cmd += ["--n-threads", str(self.n_threads)]
        return cmd + self.extra_args

    def stats(self) -> dict[str, Any]:
        """``GET /debug/stats``: requests served, tokens evaluated and reused by scoring."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        req = urllib.request.Request(f"{self.url}/debug/stats", headers=headers)
        with urllib.request.urlopen(req, timeout=10.0) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
