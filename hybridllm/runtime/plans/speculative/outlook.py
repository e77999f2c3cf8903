"""What the speculative plan knows between requests: each endpoint's verifier (probed once and
remembered), and the measured acceptance, local drafting time and verification round trip that
choose k and say whether speculation pays.

The expected gain. With a per-token acceptance rate a, a round that drafts k tokens commits E(k) =
(1 - a^(k+1)) / (1 - a) tokens (the accepted prefix and the cloud's own token) and takes k *
t_draft + t_verify (drafting ahead during verification, `ahead`: a wholly accepted round's
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

from dataclasses import dataclass, field

import anyio

from hybridllm.engines.capabilities import Drafter, Endpoint, VerificationPost
from hybridllm.runtime.plans.speculative.probe import probe
from hybridllm.runtime.plans.speculative.verifier import Probed

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
    pipelined: bool = False  # rounds draft ahead during verification (`ahead`)

    def observe(
        self,
        drafted: int,
        accepted: int,
        draft_s: float,
        verify_s: float,
        *,
        pipelined: bool = False,
    ) -> None:
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

    def outlook(self, key: tuple[str, str]) -> Outlook:
        return self.outlooks.setdefault(key, Outlook())

    def known(self, key: tuple[str, str]) -> Probed | None:
        return self.verifiers.get(key)

    async def verifier(self, key: Endpoint, post: VerificationPost, drafter: Drafter) -> Probed:
        """The endpoint's verifier, probed on first use (one probe at a time per endpoint);
        each probe request is sent by `post` (the cloud guard's `verification_post`: its fixed
        text is scanned, its tokens reserved and settled). A guard's refusal is raised, not
        remembered."""
        found = self.verifiers.get(key)
        if found is not None:
            return found
        async with self._locks.setdefault(key, anyio.Lock()):
            found = self.verifiers.get(key)
            if found is None:
                ids = drafter.tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")
                pieces = [
                    drafter.piece([t], ids[:i]).decode("utf-8", "ignore") for i, t in enumerate(ids)
                ]
                found = self.verifiers[key] = await probe(post, ids, pieces)
        return found

    async def aclose(self) -> None:
        """Nothing to close: verification goes through the cloud engine's own client."""
