"""The live latency model: how long each engine will take, learned online from traces.

Per engine, the time from the engine's start to its first token, minus any local queue wait, is
modelled as `overhead + prompt_tokens / prefill_rate` (prompt tokens not already in the local
engine's KV cache) (the overhead is the network RTT and
server queue for a cloud, the first decode step for the local engine), fitted robustly
(Theil-Sen: the median of pairwise slopes, the median intercept) over the last `window`
requests. The p95 adds the 95th percentile of the residuals, so a cloud's heavy tail widens its
p95 and not its median. TPOT is the median (and p95) of the observed decode speeds.

Before any request the figures come from a prior: the local engine's warm-up (prefill rate and
step time) or a stated guess. Drift: the median residual of the last `short` requests shifts the
prediction once it leaves the normal spread (so a cloud getting slower shows within about three
requests); when all of them lie on the same side, the old regime is dropped.

`Prediction.ttft_samples` is the empirical TTFT distribution for this request (the fit plus
each residual in the window, sorted): the automatic hedge (`routing.hedging`) needs the shape
of the tail, not only its p95.

`LatencyModel.unmeasured` counts, per engine, the finished requests since it last served a first
token: an engine the predictions keep out gets no new sample, so routing probes it past a bound
(`routing.decide.PROBE_AFTER`) rather than trust a stale figure for good.

`LatencyModel.predict(engine, prompt_tokens, max_tokens, queue_s=...)` -> `Prediction`.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hybridllm.events import EngineName
from hybridllm.routing.inputs import Prediction
from hybridllm.runtime.trace import Trace


@dataclass(frozen=True, slots=True)
class Prior:
    """What an engine is assumed to do before it has been observed."""

    overhead_s: float  # fixed time to the first token (network RTT for a cloud)
    prefill_tps: float  # prompt tokens per second
    tpot_s: float  # seconds per output token after the first
    tail: float = 1.5  # p95 / expected, until the residuals say otherwise


# a backup's own TTFT against its prediction: the factor a rescue's lead assumes until
# BACKUP_SEEN backups were measured (then the worst of the last BACKUP_WINDOW), times
# BACKUP_MARGIN for the next one's noise, at most BACKUP_MAX
BACKUP_PRIOR, BACKUP_SEEN, BACKUP_WINDOW, BACKUP_MAX, BACKUP_MARGIN = 1.5, 3, 10, 3.0, 1.15

# Rough figures from DESIGN.md (Qwen2.5-Coder-0.5B on 2 CPU cores) and a typical hosted API.
LOCAL_PRIOR = Prior(overhead_s=0.05, prefill_tps=117.0, tpot_s=0.051, tail=1.3)
CLOUD_PRIOR = Prior(overhead_s=0.35, prefill_tps=3000.0, tpot_s=0.02, tail=3.0)


@dataclass(frozen=True, slots=True)
class _Obs:
    tokens: float
    service_s: float  # engine start (after any queue) to first token


def _quantile(xs: Sequence[float], q: float) -> float:
    """numpy's default ("linear", Hyndman-Fan type 7): interpolates between the sorted values
    at position `q * (n - 1)`; 0.0 for no values."""
    return float(np.quantile(xs, q)) if len(xs) else 0.0


class EngineLatency:
    """The online estimate for one engine."""

    def __init__(self, prior: Prior, *, window: int = 48, short: int = 5) -> None:
        self.prior = prior
        self.window = window
        self.short = short
        self.obs: deque[_Obs] = deque(maxlen=window)
        self.tpots: deque[float] = deque(maxlen=window)
        self.queue_waits: deque[float] = deque(maxlen=window)
        self.rtts: deque[float] = deque(maxlen=window)
        self.regime_changes = 0
        self._intercept = prior.overhead_s
        self._slope = 1.0 / prior.prefill_tps
        self._resid_p95 = 0.0
        self._resid: tuple[float, ...] = ()
        self._spread = 0.0  # robust scale of the residuals (1.4826 * MAD)
        # started as a backup (a rescue, a failover): its own TTFT / the TTFT predicted for it
        self.backups: deque[float] = deque(maxlen=BACKUP_WINDOW)

    # ---- learning -------------------------------------------------------------------------

    def seed(self, prior: Prior) -> None:
        """Replace the prior (e.g. with warm-up figures); observations are kept."""
        self.prior = prior
        self._refit()

    def observe(
        self,
        prompt_tokens: float,
        service_s: float,
        *,
        tpot_s: float | None = None,
        queue_s: float | None = None,
        rtt_s: float | None = None,
    ) -> None:
        """One request: `service_s` from the engine's start (after queueing) to its first
        token. A lower bound (a loser cancelled before its first token) may be observed too."""
        if service_s < 0 or prompt_tokens < 0:
            return
        self.obs.append(_Obs(float(prompt_tokens), service_s))
        if tpot_s is not None and tpot_s > 0:
            self.tpots.append(tpot_s)
        if queue_s is not None and queue_s >= 0:
            self.queue_waits.append(queue_s)
        if rtt_s is not None and rtt_s >= 0:
            self.rtts.append(rtt_s)
        self._refit()
        self._maybe_new_regime()

    def _refit(self) -> None:
        obs = list(self.obs)
        slope = 1.0 / self.prior.prefill_tps
        slopes = [
            (b.service_s - a.service_s) / (b.tokens - a.tokens)
            for i, a in enumerate(obs)
            for b in obs[i + 1 :]
            if abs(b.tokens - a.tokens) >= 8
        ]
        if len(slopes) >= 3:
            slope = min(max(statistics.median(slopes), 0.0), 0.1)  # 10 tokens/s at the slowest
        self._slope = slope
        if not obs:
            self._intercept, self._resid_p95, self._spread = self.prior.overhead_s, 0.0, 0.0
            self._resid = ()
            return
        # unclamped: with the prior's slope the fit must still pass through the observed points
        self._intercept = statistics.median(o.service_s - slope * o.tokens for o in obs)
        resid = [o.service_s - self._fit(o.tokens) for o in obs]
        self._resid = tuple(sorted(resid))
        self._resid_p95 = max(0.0, _quantile(resid, 0.95))
        self._spread = 1.4826 * statistics.median(abs(r) for r in resid)

    def _fit(self, tokens: float) -> float:
        return self._intercept + self._slope * tokens

    def _recent_resid(self) -> list[float]:
        recent = list(self.obs)[-self.short :]
        return [o.service_s - self._fit(o.tokens) for o in recent]

    def _threshold(self) -> float:
        level = statistics.median(o.service_s for o in self.obs) if self.obs else 0.0
        return max(3.0 * self._spread, 0.25 * level, 0.01)

    def drift_s(self) -> float:
        """The shift recent requests show against the long window (0 while within its spread)."""
        if len(self.obs) < self.short + 3:
            return 0.0
        shift = statistics.median(self._recent_resid())
        return shift if abs(shift) > self._threshold() else 0.0

    def _maybe_new_regime(self) -> None:
        """All of the last `short` requests far on one side: the engine changed; forget the rest."""
        if len(self.obs) <= self.short + 3:
            return
        resid, limit = self._recent_resid(), self._threshold()
        if all(r > limit for r in resid) or all(r < -limit for r in resid):
            recent = list(self.obs)[-self.short :]
            self.obs.clear()
            self.obs.extend(recent)
            self.regime_changes += 1
            self._refit()

    def observe_backup(self, own_ttft_s: float, predicted_s: float) -> None:
        """A backup (started after another engine) took `own_ttft_s` from its start to its first
        token, where `predicted_s` was expected. A backup starts while a request is in flight
        (cold, another prompt, the other engine's client at work): its turns can run slower
        than the ones the fit learnt from."""
        if own_ttft_s > 0 and predicted_s > 0:
            self.backups.append(own_ttft_s / predicted_s)

    @property
    def backup_factor(self) -> float:
        """How much longer than predicted a backup may take: the worst of the recent ratios
        with a margin, at least `BACKUP_PRIOR` until `BACKUP_SEEN` were measured, within
        [1, BACKUP_MAX]."""
        worst = max(self.backups, default=1.0) * BACKUP_MARGIN
        if len(self.backups) < BACKUP_SEEN:
            worst = max(worst, BACKUP_PRIOR)
        return min(max(worst, 1.0), BACKUP_MAX)

    # ---- predicting -----------------------------------------------------------------------

    @property
    def samples(self) -> int:
        return len(self.obs)

    def tpot(self) -> tuple[float, float]:
        """(median, p95) seconds per output token."""
        if len(self.tpots) < 2:
            t = self.tpots[-1] if self.tpots else self.prior.tpot_s
            return t, t * self.prior.tail
        return statistics.median(self.tpots), _quantile(list(self.tpots), 0.95)

    def predict(
        self, name: EngineName, prompt_tokens: float, max_tokens: int, queue_s: float = 0.0
    ) -> Prediction:
        drift = self.drift_s()
        service = max(0.0, self._fit(prompt_tokens) + drift)
        tail = self._resid_p95
        if len(self.obs) < 5:  # too few residuals for a tail: keep the prior's ratio
            tail = max(tail, service * (self.prior.tail - 1.0))
        ttft = queue_s + service
        ttft_p95 = ttft + tail
        tpot, tpot_p95 = self.tpot()
        more = max(0, max_tokens - 1)
        samples = tuple(queue_s + max(0.0, service + r) for r in self._resid)
        return Prediction(
            engine=name,
            ttft_s=ttft,
            ttft_p95_s=ttft_p95,
            total_s=ttft + more * tpot,
            total_p95_s=ttft_p95 + more * tpot_p95,
            tpot_s=tpot,
            queue_s=queue_s,
            samples=len(self.obs),
            drift_s=drift,
            ttft_samples=samples,
            rescue_ttft_s=queue_s + service * self.backup_factor,
        )

    def components(self) -> dict[str, float | None]:
        """The learned parts, for people: RTT, queue wait, overhead, prefill rate, TPOT."""
        tpot, tpot_p95 = self.tpot()

        def med(xs: Iterable[float]) -> float | None:
            xs = list(xs)
            return statistics.median(xs) if xs else None

        return {
            "rtt_s": med(self.rtts),
            "rtt_p95_s": _quantile(list(self.rtts), 0.95) if self.rtts else None,
            "queue_s": med(self.queue_waits),
            "overhead_s": self._intercept,
            "prefill_tps": 1.0 / self._slope if self._slope > 0 else None,
            "tpot_s": tpot,
            "tpot_p95_s": tpot_p95,
            "residual_p95_s": self._resid_p95,
        }


class LatencyModel:
    """One `EngineLatency` per engine name, fed from request traces."""

    def __init__(self, priors: dict[EngineName, Prior] | None = None) -> None:
        priors = priors or {"local": LOCAL_PRIOR, "cloud": CLOUD_PRIOR}
        self.engines: dict[EngineName, EngineLatency] = {
            name: EngineLatency(p) for name, p in priors.items()
        }
        self.seeded: set[EngineName] = set()
        # per engine, the finished requests since it last served a first token measured here
        # (routing probes an engine kept out too long: `LiveState.unmeasured`)
        self.unmeasured: dict[EngineName, int] = {}
        self.device: EngineName = "local"  # the engine on the device (its prior: LOCAL_PRIOR)

    def engine(self, name: EngineName) -> EngineLatency:
        if name not in self.engines:
            local = name == self.device
            self.engines[name] = EngineLatency(LOCAL_PRIOR if local else CLOUD_PRIOR)
        return self.engines[name]

    def seed(
        self,
        name: EngineName,
        *,
        prefill_tps: float | None = None,
        tpot_s: float | None = None,
        overhead_s: float | None = None,
    ) -> None:
        """Warm-up figures (an engine's measured prefill rate and step time) as its prior."""
        est = self.engine(name)
        p = est.prior
        est.seed(
            Prior(
                overhead_s=p.overhead_s if overhead_s is None else overhead_s,
                prefill_tps=p.prefill_tps if not prefill_tps else prefill_tps,
                tpot_s=p.tpot_s if not tpot_s else tpot_s,
                tail=p.tail,
            )
        )
        self.seeded.add(name)

    def knows(self, name: EngineName) -> bool:
        """Seeded from a warm-up or observed at least once."""
        return name in self.seeded or (name in self.engines and self.engines[name].samples > 0)

    def probed(self, name: EngineName) -> None:
        """A request probes `name` (routing left it its place although its prediction said
        no): count its unmeasured requests afresh, so the next probe comes `PROBE_AFTER` later."""
        self.unmeasured[name] = 0

    def predict(
        self, name: EngineName, prompt_tokens: float, max_tokens: int, *, queue_s: float = 0.0
    ) -> Prediction:
        """`prompt_tokens`: the tokens to prefill (for the local engine, those not already in
        its KV cache). A rescue's longer lead (`Prediction.rescue_ttft_s`) is the device's
        only: an early local start costs device work, an early cloud start a paid request."""
        p = self.engine(name).predict(name, prompt_tokens, max_tokens, queue_s)
        return p if name == self.device else replace(p, rescue_ttft_s=None)

    def observe_trace(self, trace: Trace, prompt_tokens: float) -> None:
        """Learn from one finished request: the serving engine's first-token time (and decode
        speed), and a lower bound for an engine that lost the race before its first token.
        `prompt_tokens` is the estimate the prediction used; the share the local engine found
        in its KV cache (`trace.cached_prompt_tokens`) is taken off it."""
        served = trace.engine
        ttft_ms = trace.produced_ttft_ms  # the engines' own times, not the app's reading
        if served is None or ttft_ms is None or trace.error is not None:
            return
        for name in {*self.engines, *trace.started}:
            self.unmeasured[name] = 0 if name == served else self.unmeasured.get(name, 0) + 1
        if trace.handoff is not None:
            self._observe_handoff(trace, prompt_tokens)
            return
        if trace.speculation is not None:  # rounds of drafts and verification, not the cloud's
            return  # own first token or decode speed (the plan keeps its own figures)
        marks = trace.marks
        ttft = ttft_ms / 1000.0
        if "rescue_first_token" in marks:  # a held rescue: its engine's own first token
            ttft = min(ttft, marks["rescue_first_token"] - trace.t_start)
        if "call_opened" in marks:  # a tool call: the answer started once its name was chosen
            ttft = min(ttft, marks["call_opened"] - trace.t_start)
        offset = {e: self._start_offset(trace, e) for e in trace.started}
        start = offset.get(served, 0.0)
        queue = None
        if "queued" in marks and "started" in marks:
            queue = max(0.0, marks["started"] - marks["queued"])
        rtt = None
        if "request_sent" in marks and "first_byte" in marks:
            rtt = max(0.0, marks["first_byte"] - marks["request_sent"])
        tpot = None
        resumed = "rescue_resumed" in marks  # a gap at the release: not a decode step
        if not trace.switches and not resumed and trace.n_tokens >= 3 and trace.produced_tpot_ms:
            tpot = trace.produced_tpot_ms / 1000.0
        fresh = prompt_tokens
        if trace.cached_prompt_tokens and trace.prompt_tokens:
            fresh *= max(0.0, 1.0 - trace.cached_prompt_tokens / trace.prompt_tokens)
        self.engine(served).observe(
            fresh, ttft - start - (queue or 0.0), tpot_s=tpot, queue_s=queue, rtt_s=rtt
        )
        predicted = trace.predicted_ttft_ms.get(served)
        if start > 0 and predicted:  # a backup: its own TTFT against what was expected of it
            self.engine(served).observe_backup(ttft - start, predicted / 1e3)
        for loser, off in offset.items():
            if loser == served or trace.switches:
                continue
            bound = ttft - off
            est = self.engine(loser)
            if bound > est.predict(loser, prompt_tokens, 1).ttft_s:  # informative: slower
                est.observe(prompt_tokens, bound)

    def _observe_handoff(self, trace: Trace, prompt_tokens: float) -> None:
        """A handoff: the first token is the local engine's; the cloud's continuation gives its
        time to a first token (from the ask) and its decode speed."""
        rec = trace.handoff
        assert rec is not None and trace.produced_ttft_ms is not None
        times = trace.token_times
        local = [t for t in times if rec.switched_t is None or t < rec.switched_t]
        tpot = (local[-1] - local[0]) / (len(local) - 1) if len(local) >= 3 else None
        local_name = trace.device or "local"
        self.engine(local_name).observe(prompt_tokens, trace.produced_ttft_ms / 1e3, tpot_s=tpot)
        if rec.switched_t is None:
            return
        cloud_name = next((e for e in trace.started if trace.on_cloud(e)), "cloud")
        cloud = [t for t in times if t >= rec.switched_t]
        tpot = (cloud[-1] - cloud[0]) / (len(cloud) - 1) if len(cloud) >= 3 else None
        self.engine(cloud_name).observe(prompt_tokens, rec.switched_t - rec.asked_t, tpot_s=tpot)

    @staticmethod
    def _start_offset(trace: Trace, engine: EngineName) -> float:
        """Seconds from the call to this engine's start (0 for the first one started)."""
        if trace.started and trace.started[0] == engine:
            return 0.0
        at = trace.marks.get("fallback_started")
        return 0.0 if at is None else max(0.0, at - trace.t_start)
