"""Verification calls against `hybridllm serve-model` (the stand-in cloud): what a draft check
costs.

For prompts of about 26, 65, 130 and 260 tokens plus an 8-token draft, on Qwen2.5-Coder-1.5B:
one vLLM-dialect verification call (``/v1/completions``, token ids, ``prompt_logprobs: 1``,
``max_tokens: 1``, temperature 0), cold (no shared prefix in the server's cache) and warm (the
prompt cached, a new draft), against the server's plain decoding time per token. With
``--llama-cpp``, llama-cpp-python's own server (``--logits_all true``) answers the 26-token case
through its echo/logprobs path, for comparison.

    /tmp/quiet.sh python benchmarks/bench_verify_server.py [--quick] [-n 3] [--llama-cpp]

Both servers share this machine's cores with nothing else of ours; figures move between
machines, compare within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from typing import Any

from hybridllm.local.resolve import resolve_model
from hybridllm.testing import HybridServer, LlamaServer

MODEL = "qwen2.5-coder-1.5b-instruct"
SIZES = (26, 65, 130, 260)
DRAFT = 8
TEXT = (
    "import heapq\n\n\ndef dijkstra(graph, source):\n"
    '    """Shortest distances from source in a graph of non-negative edge weights.\n\n'
    "    graph maps a node to a list of (neighbour, weight) pairs.\n"
    '    """\n'
    "    dist = {source: 0}\n    queue = [(0, source)]\n    done = set()\n"
    "    while queue:\n        d, node = heapq.heappop(queue)\n        if node in done:\n"
    "            continue\n        done.add(node)\n        for nxt, w in graph.get(node, []):\n"
    "            nd = d + w\n            if nd < dist.get(nxt, float('inf')):\n"
    "                dist[nxt] = nd\n                heapq.heappush(queue, (nd, nxt))\n"
    "    return dist\n\n\n"
    "def test_dijkstra():\n    graph = {'a': [('b', 1), ('c', 4)], 'b': [('c', 2), ('d', 5)],\n"
    "             'c': [('d', 1)], 'd': []}\n"
    "    assert dijkstra(graph, 'a') == {'a': 0, 'b': 1, 'c': 3, 'd': 4}\n\n\n"
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n"
    "        self.items = {}\n\n    def get(self, key):\n        if key not in self.items:\n"
    "            return None\n        value = self.items.pop(key)\n"
    "        self.items[key] = value\n"
    "        return value\n\n    def put(self, key, value):\n        self.items.pop(key, None)\n"
    "        self.items[key] = value\n        if len(self.items) > self.capacity:\n"
    "            self.items.pop(next(iter(self.items)))\n"
)


def post(url: str, body: dict[str, Any], key: str | None) -> tuple[float, dict[str, Any], Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        out = json.loads(resp.read())
        return time.perf_counter() - t0, out, resp.headers


def bench_hybrid(path: Any, n: int, sizes: tuple[int, ...], threads: int | None) -> None:
    with HybridServer(path, alias="cloud", api_key="k", n_ctx=2048, n_threads=threads) as srv:
        url = srv.base_url + "/completions"
        _, out, _ = post(
            url, {"model": "cloud", "prompt": TEXT, "max_tokens": 0, "return_token_ids": True}, "k"
        )
        text_ids: list[int] = out["choices"][0]["prompt_token_ids"]
        assert len(text_ids) >= max(sizes) + 3 * DRAFT, len(text_ids)

        def verify(tokens: list[int]) -> tuple[float, int]:
            body = {"model": "cloud", "prompt": tokens, "max_tokens": 1, "temperature": 0}
            secs, _, headers = post(url, {**body, "prompt_logprobs": 1}, "k")
            return secs, int(headers["x-hybridllm-evaluated-tokens"])

        # plain decoding, per token: (33 tokens - 1 token) / 32, same prompt, warm cache
        plain = []
        for _ in range(n):
            body = {"model": "cloud", "prompt": text_ids[:26], "temperature": 0}
            one, _, _ = post(url, {**body, "max_tokens": 1}, "k")
            many, _, _ = post(url, {**body, "max_tokens": 33}, "k")
            plain.append((many - one) / 32)
        tpot = statistics.median(plain)
        print(f"plain decoding: {tpot * 1000:.1f} ms/token (median of {n})")
        print(
            f"{'prompt':>6} {'+draft':>6}  {'cold ms':>8} {'(eval)':>6}  "
            f"{'warm ms':>8} {'(eval)':>6}  {'cold/tok':>8} {'warm/tok':>8}"
        )
        for size in sizes:
            cold, warm = [], []
            ev_cold = ev_warm = 0
            for i in range(n):
                prompt = text_ids[:size]
                # cold: the cache holds a prompt that differs from the first token on
                verify([text_ids[1]] + prompt[1:8])
                secs, ev_cold = verify(prompt + text_ids[size : size + DRAFT])
                cold.append(secs)
                # warm: the prompt (and an older draft) cached, a new draft after it
                other = text_ids[size + DRAFT + i : size + 2 * DRAFT + i]
                secs, ev_warm = verify(prompt + other)
                warm.append(secs)
            c, w = statistics.median(cold) * 1000, statistics.median(warm) * 1000
            print(
                f"{size:>6} {DRAFT:>6}  {c:>8.0f} {ev_cold:>6}  {w:>8.0f} {ev_warm:>6}"
                f"  {c / tpot / 1000:>7.1f}x {w / tpot / 1000:>7.1f}x"
            )
        print("(cold/tok, warm/tok: the call's time in plain decoding steps)")


def bench_llama_cpp(path: Any, threads: int | None) -> None:
    extra = ["--logits_all", "true"]
    with LlamaServer(path, alias="cloud", n_ctx=2048, n_threads=threads, extra_args=extra) as srv:
        url = srv.base_url + "/completions"
        prompt = TEXT[:100]
        body = {"model": "cloud", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        secs, out, _ = post(url, {**body, "echo": True, "logprobs": 1}, None)
        n_tok = len(out["choices"][0]["logprobs"]["tokens"])
        print(f"llama_cpp.server echo+logprobs: {n_tok} tokens echoed, {secs * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="repetitions per figure (median)")
    ap.add_argument("--quick", action="store_true", help="one repetition, two prompt sizes")
    ap.add_argument("--threads", type=int, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--llama-cpp", action="store_true", help="also llama_cpp.server's echo path")
    args = ap.parse_args()
    path = resolve_model(MODEL)
    n = 1 if args.quick else args.n
    sizes = SIZES[:2] if args.quick else SIZES
    bench_hybrid(path, n, sizes, args.threads)
    if args.llama_cpp:
        bench_llama_cpp(path, args.threads)


if __name__ == "__main__":
    main()
