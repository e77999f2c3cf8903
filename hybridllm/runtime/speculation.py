"""What the speculative plan knows between requests: each endpoint's verifier (probed once and
remembered), and the measured acceptance, local drafting time and verification round trip that
choose k and say whether speculation pays.

The expected gain. With a per-token acceptance rate a, a round that drafts k tokens commits E(k) =
(1 - a^(k+1)) / (1 - a) tokens (the accepted prefix and the cloud's own token) and takes k *
t_draft + t_verify (drafting ahead during verification, `plans._ahead`: a wholly accepted round's
successor costs only what its drafting outruns the round trip). Plain cloud streaming commits 1 /
t_cloud tokens per second. k is the one that maximises E(k) / (k * t_draft + t_verify); speculation
pays while that rate is at least `PAYS_SHARE` of the plain rate (the cloud's measured time per
token, or the latency model's prior before the cloud has streamed; a policy's fixed `speculative_k`
skips the pay test). vLLM's prompt log-probabilities recompute the whole prefill on every round (no
prefix cache for such requests), which the measured t_verify holds; the money is counted by the
guard (each round bills the whole context as prompt tokens), and `max_prompt_overhead` caps the
billed prompt tokens per committed token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2

from hybridllm.engines._llama_draft import LocalDrafter
from hybridllm.engines.base import prompt_token_bound
from hybridllm.engines.verify import Around, Post, Probed
from hybridllm.engines.verify_probe import probe
from hybridllm.guard.budget import TokenUsage

Guarded = Callable[
    [Iterable[tuple[str, str]], int, int, Callable[[], Awaitable[tuple[Any, TokenUsage | None]]]],
    Awaitable[Any],
]
K_MIN, K_MAX, K_START = 1, 16, 8
PAYS_SHARE = 0.95  # speculate while the expected rate is at least this share of plain streaming
MIN_ROUNDS = 3  # rounds seen before the plan may decide it does not pay
EXPLORE_EVERY = 10  # a request that would not pay still speculates once in this many (to re-judge)


def expected_tokens(a: float, k: int) -> float:
    """Tokens a round of k drafts commits at per-token acceptance a (the cloud's own included)."""
    if a >= 0.999:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class Outlook:
    """The measured figures (exponential averages over rounds, across requests)."""

    acceptance: float = 0.7  # per drafted token (a prior until rounds are seen)
    draft_s: float | None = None  # local seconds per drafted token
    verify_s: float | None = None  # seconds per verification round (round trip included)
    rounds: int = 0
    skipped: int = 0  # requests since the last one that speculated
    pipelined: bool = False  # rounds draft ahead during verification (`plans._ahead`)

    def observe(
        self, drafted: int, accepted: int, draft_s: float, verify_s: float, *,
        pipelined: bool = False,
    ) -> None:  # fmt: skip
        self.pipelined = pipelined
        if not drafted:  # a round without drafts (round 0, a cloud step) is a prefill or a
            return  # plain step: it says nothing of the acceptance or the round trip
        w = 0.3 if self.rounds >= 3 else 0.6
        wa = w * min(1.0, drafted / K_START)  # a round of few drafts says little of a
        self.acceptance = (1 - wa) * self.acceptance + wa * accepted / drafted
        per = draft_s / drafted
        self.draft_s = per if self.draft_s is None else (1 - w) * self.draft_s + w * per
        self.verify_s = (
            verify_s if self.verify_s is None else (1 - w) * self.verify_s + w * verify_s
        )
        self.rounds += 1

    def rate(self, k: int) -> float | None:
        """Expected committed tokens per second at k (None: not measured yet)."""
        if self.draft_s is None or self.verify_s is None:
            return None
        a, d, v = self.acceptance, k * self.draft_s, self.verify_s
        if not self.pipelined:
            return expected_tokens(a, k) / (d + v)
        # drafted ahead: after a wholly accepted round (and a matching guess, taken as a)
        # the next draft is ready when the verdict is, less what outran the round trip
        whole = a ** (k + 1)
        return expected_tokens(a, k) / (v + (1 - whole) * d + whole * max(0.0, d - v))

    def best_k(self) -> int:
        rates = {k: self.rate(k) for k in range(K_MIN, K_MAX + 1)}
        if any(r is None for r in rates.values()):
            return K_START
        return max(rates, key=lambda k: rates[k] or 0.0)

    def pays(self, cloud_tpot_s: float | None) -> tuple[bool, str]:
        """Whether speculation is expected to beat plain cloud streaming, and why."""
        if self.rounds < MIN_ROUNDS or cloud_tpot_s is None:
            return True, f"acceptance {self.acceptance:.2f} (too few rounds to judge the pay)"
        k = self.best_k()
        rate = self.rate(k)
        if rate is None:
            return True, f"acceptance {self.acceptance:.2f} (drafting not measured yet)"

        plain = 1.0 / cloud_tpot_s
        words = (
            f"expected {rate:.1f} tok/s at k={k} (acceptance {self.acceptance:.2f}, "
            f"verify {1e3 * (self.verify_s or 0):.0f} ms) vs plain cloud {plain:.1f} tok/s"
        )
        return rate >= PAYS_SHARE * plain, words

    def explore(self) -> bool:
        """For a request that is not expected to pay: speculate anyway this time (once in
        `EXPLORE_EVERY`, so a changed acceptance or round trip is seen), else stream plainly."""
        self.skipped += 1
        if self.skipped >= EXPLORE_EVERY:
            self.skipped = 0
            return True
        return False


@dataclass
class SpeculationState:
    """Per client: verifiers by endpoint (probed once), and the outlook by endpoint."""

    verifiers: dict[tuple[str, str], Probed] = field(default_factory=dict)
    outlooks: dict[tuple[str, str], Outlook] = field(default_factory=dict)
    _locks: dict[tuple[str, str], anyio.Lock] = field(default_factory=dict)
    clients: dict[tuple[str, str], httpx2.AsyncClient] = field(default_factory=dict)

    def outlook(self, key: tuple[str, str]) -> Outlook:
        return self.outlooks.setdefault(key, Outlook())

    def known(self, key: tuple[str, str]) -> Probed | None:
        return self.verifiers.get(key)

    async def verifier(
        self,
        key: tuple[str, str],
        api_key: str | None,
        drafter: LocalDrafter,
        guarded: Guarded | None = None,
    ) -> Probed:
        """The endpoint's verifier, probed on first use (one probe at a time per endpoint);
        each probe request goes through `guarded` (the cloud guard: its fixed text is scanned,
        its tokens reserved and settled). A guard's refusal is raised, not remembered."""
        found = self.verifiers.get(key)
        if found is not None:
            return found
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            found = self.verifiers.get(key)
            if found is None:
                base_url, model = key
                client = self.clients.get(key)
                if client is None:
                    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
                    client = httpx2.AsyncClient(
                        base_url=base_url.rstrip("/") + "/",
                        headers=headers,
                        timeout=httpx2.Timeout(120.0, connect=5.0),
                    )
                    self.clients[key] = client
                ids = drafter.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")
                pieces = [drafter.piece([t], ids[:i]).decode("utf-8", "ignore")
                          for i, t in enumerate(ids)]  # fmt: skip
                found = await probe(client, model, ids, pieces,
                                    _through(guarded) if guarded else None)  # fmt: skip
                self.verifiers[key] = found
        return found

    async def aclose(self) -> None:
        clients, self.clients = self.clients, {}
        for client in clients.values():
            await client.aclose()


def _through(guarded: Guarded) -> Around:
    """Each probe request through the guard: its outgoing text, a bound of its prompt tokens
    and its `max_tokens` reserved, the usage it reports settled."""

    async def around(path: str, body: dict[str, Any], post: Post) -> dict[str, Any]:
        prompt = body.get("prompt")
        messages = body.get("messages")
        if isinstance(messages, list):
            texts = [str(m.get("content", "")) for m in messages]
            bound = prompt_token_bound(messages)
        elif isinstance(prompt, str):
            texts, bound = [prompt], prompt_token_bound([{"role": "user", "content": prompt}])
        else:  # token ids (of the same fixed probe text)
            texts, bound = [], len(prompt) if isinstance(prompt, list) else 64
        max_out = int(body.get("max_tokens", 16))
        predicted = body.get("prediction")  # Predicted Outputs: rejected ones bill as output
        if isinstance(predicted, dict):
            max_out += len(str(predicted.get("content", "")).encode("utf-8"))

        async def call() -> tuple[dict[str, Any], TokenUsage | None]:
            data = await post(path, body)
            u = data.get("usage") or {}
            p, c = u.get("prompt_tokens"), u.get("completion_tokens")
            ok = isinstance(p, int) and isinstance(c, int)
            return data, TokenUsage(p, c) if ok else None  # type: ignore[arg-type]

        result: dict[str, Any] = await guarded(
            [("verification.probe", t) for t in texts], bound, max_out, call
        )
        return result

    return around
