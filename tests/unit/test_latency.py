"""The latency model on synthetic request sequences: learning, heavy tails, drift, traces."""

from __future__ import annotations

import random

import pytest

from hybridllm.runtime.latency import BACKUP_MARGIN, CLOUD_PRIOR, LatencyModel, Prior
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import Trace


def test_priors_then_warm_up_figures_before_any_request() -> None:
    model = LatencyModel()
    p = model.predict("local", 117, 11)
    assert p.samples == 0 and p.ttft_s == pytest.approx(0.05 + 1.0)
    model.seed("local", prefill_tps=200.0, tpot_s=0.02, overhead_s=0.02)
    p = model.predict("local", 200, 11, queue_s=0.5)
    assert p.ttft_s == pytest.approx(0.5 + 0.02 + 1.0)
    assert p.total_s == pytest.approx(p.ttft_s + 10 * 0.02)
    assert p.ttft_p95_s > p.ttft_s


def test_learns_overhead_and_prefill_rate_from_noisy_requests() -> None:
    rng = random.Random(1)
    model = LatencyModel()  # the prior (117 tok/s, 50 ms) is wrong on purpose
    for _ in range(40):
        n = rng.randint(20, 800)
        model.engine("local").observe(n, 0.03 + n / 300.0 + rng.gauss(0, 0.01), tpot_s=0.04)
    c = model.engine("local").components()
    assert c["prefill_tps"] == pytest.approx(300.0, rel=0.05)
    assert c["overhead_s"] == pytest.approx(0.03, abs=0.01)
    p = model.predict("local", 600, 101)
    assert p.ttft_s == pytest.approx(2.03, rel=0.03)
    assert p.tpot_s == pytest.approx(0.04) and p.total_s == pytest.approx(p.ttft_s + 100 * 0.04)


def test_heavy_tail_widens_the_p95_not_the_median() -> None:
    rng = random.Random(2)
    model = LatencyModel()
    samples = [rng.lognormvariate(-1.9, 1.0) for _ in range(48)]  # median ~150 ms
    for s in samples:
        model.engine("cloud").observe(30, s)
    p = model.predict("cloud", 30, 1)
    true_median = sorted(samples)[24]
    assert p.ttft_s == pytest.approx(true_median, rel=0.35)
    assert p.ttft_p95_s > 3 * p.ttft_s


def test_one_stall_does_not_move_the_prediction() -> None:
    model = LatencyModel()
    cloud = model.engine("cloud")
    for i in range(30):
        cloud.observe(30, 0.2 + 0.01 * (i % 3))
    before = model.predict("cloud", 30, 1).ttft_s
    cloud.observe(30, 5.0)
    after = model.predict("cloud", 30, 1)
    assert after.ttft_s == pytest.approx(before, abs=0.02) and after.drift_s == 0.0


def test_a_cloud_getting_slower_is_noticed_within_three_requests() -> None:
    rng = random.Random(3)
    model = LatencyModel()
    cloud = model.engine("cloud")
    for _ in range(40):
        cloud.observe(rng.randint(10, 200), rng.uniform(0.25, 0.35))
    assert model.predict("cloud", 100, 1).ttft_s < 0.4
    seen = []
    for _ in range(6):
        cloud.observe(rng.randint(10, 200), rng.uniform(1.4, 1.6))
        seen.append(model.predict("cloud", 100, 1).ttft_s)
    assert seen[2] > 1.0, seen  # by the third slow request
    assert all(s > 1.0 for s in seen[2:])
    assert cloud.regime_changes == 1  # the old regime was dropped after the short window


def test_and_recovers_when_it_gets_fast_again() -> None:
    model = LatencyModel()
    cloud = model.engine("cloud")
    for _ in range(30):
        cloud.observe(50, 1.5)
    for _ in range(5):
        cloud.observe(50, 0.3)
    assert model.predict("cloud", 50, 1).ttft_s < 0.5


def _trace(engine: str = "local", *ran: str, **marks_ms: float) -> Recorder:
    """A recorder of a trace that started at 100 s on `engine` (`ran`: the engines that
    ran, in order; just `engine` where none are given), with these marks."""
    tr = Recorder(Trace(t_start=100.0, engine=engine, started=ran or (engine,)))
    for name, ms in marks_ms.items():
        if name != "first_token":
            tr.mark(name, 100.0 + ms / 1000.0)
    return tr


def test_observe_trace_reads_queue_rtt_and_decode_speed() -> None:
    model = LatencyModel()
    local = _trace("local", queued=2, started=402, prefill_done=900)
    for i in range(5):
        local.token(100.0 + (950 + 40 * i) / 1000.0)
    local.done("stop", 101.2)
    model.observe_trace(local.freeze(), 100)
    comp = model.engine("local").components()
    assert comp["queue_s"] == pytest.approx(0.4)
    assert model.engine("local").obs[-1].service_s == pytest.approx(0.95 - 0.4)
    assert comp["tpot_s"] == pytest.approx(0.04)

    cloud = _trace("cloud", request_sent=1, first_byte=121)
    cloud.token(100.3)
    cloud.done("stop", 100.4)
    model.observe_trace(cloud.freeze(), 40)
    assert model.engine("cloud").components()["rtt_s"] == pytest.approx(0.12)


def test_a_slow_loser_is_recorded_as_at_least_its_waiting_time() -> None:
    model = LatencyModel({"local": Prior(0.02, 200.0, 0.03), "cloud": CLOUD_PRIOR})
    # the cloud was primary, the local engine won at 700 ms
    tr = _trace("local", "cloud", "local", fallback_started=500)
    tr.token(100.7)
    tr.done("stop", 100.8)
    model.observe_trace(tr.freeze(), 30)
    cloud = model.engine("cloud")
    assert cloud.samples == 1 and cloud.obs[-1].service_s == pytest.approx(0.7)
    assert model.engine("local").obs[-1].service_s == pytest.approx(0.2)
    failed = _trace("cloud")
    failed.failed(RuntimeError("boom"))
    model.observe_trace(failed.freeze(), 30)
    assert cloud.samples == 1


def test_the_kv_cache_share_is_taken_off_the_prefill() -> None:
    from hybridllm.runtime.gather import uncached_share

    assert uncached_share("abcd", None) == 1.0
    assert uncached_share("abcdefgh", "abcdXYZ") == 0.5
    model = LatencyModel()
    tr = _trace("local", queued=0, started=0, prefill_done=40)
    tr.usage(600, 0, 540, False)  # 90% reused
    tr.token(100.05)
    tr.done("stop", 100.06)
    model.observe_trace(tr.freeze(), 500)
    assert model.engine("local").obs[-1].tokens == pytest.approx(50.0)


def test_quantile_is_numpys_linear_interpolation() -> None:
    from hybridllm.runtime.latency import _quantile

    assert _quantile([], 0.95) == 0.0
    assert _quantile([3.0], 0.95) == 3.0
    # position 0.95 * 4 = 3.8 between the sorted values 4 and 10: 4 + 0.8 * 6
    assert _quantile([10.0, 1.0, 4.0, 2.0, 3.0], 0.95) == pytest.approx(8.8)
    assert _quantile([1.0, 2.0], 0.5) == 1.5 and _quantile([5.0, 1.0], 1.0) == 5.0


def test_ttft_samples_are_the_prediction_plus_each_residual() -> None:
    model = LatencyModel()
    est = model.engine("cloud")
    for s in (0.1, 0.12, 0.15, 0.2, 3.0, 0.11):
        est.observe(40, s)
    p = model.predict("cloud", 40, 8, queue_s=0.05)
    assert len(p.ttft_samples) == 6 and list(p.ttft_samples) == sorted(p.ttft_samples)
    # the same prompt size as observed: the samples are the observations themselves, queued
    assert p.ttft_samples[-1] == pytest.approx(3.0 + 0.05)
    assert p.ttft_samples[0] == pytest.approx(0.1 + 0.05)


def test_a_handoff_teaches_the_local_ttft_and_the_clouds_continuation() -> None:
    from hybridllm.runtime.trace import HandoffRecord

    model = LatencyModel()
    rec = Recorder(Trace(t_start=100.0, engine="cloud", started=("local", "cloud")))
    for i in range(4):  # local: first token at 50 ms, then 60 ms per token
        rec.token(100.05 + 0.06 * i)
    rec.plan_record(HandoffRecord(100.23, 8, 4, switched_t=100.53, outcome="switched"))
    for i in range(10):  # cloud: 10 ms per token from 100.53
        rec.token(100.53 + 0.01 * i)
    rec.done("stop", 100.7)
    model.observe_trace(rec.freeze(), 30)
    local, cloud = model.engine("local"), model.engine("cloud")
    assert local.obs[-1].service_s == pytest.approx(0.05)
    assert local.tpot()[0] == pytest.approx(0.06)
    assert cloud.obs[-1].service_s == pytest.approx(0.30)  # asked to first token
    assert cloud.tpot()[0] == pytest.approx(0.01)


def test_a_rescue_starts_early_enough_while_backups_are_few_then_as_they_ran() -> None:
    """Issue 45 item 3: a rescue's lead is measured by more than the p95 learnt on the engine's
    own turns: a backup starts while another request is in flight and ran up to 1.7x its
    prediction on a 2-core machine. Until 3 backups were measured the lead assumes 1.5x the
    expected TTFT; then the worst recent ratio, with a margin."""
    from hybridllm.routing.decision import Decision
    from hybridllm.routing.hedging import backup_ttft_s
    from hybridllm.runtime.latency import BACKUP_PRIOR

    model = LatencyModel({"local": Prior(0.1, 100.0, 0.03, tail=1.3), "cloud": CLOUD_PRIOR})
    before = model.predict("local", 20, 8)
    assert before.rescue_ttft_s == pytest.approx(before.ttft_s * BACKUP_PRIOR)
    assert backup_ttft_s(before, rescue=True) == pytest.approx(before.ttft_s * BACKUP_PRIOR)
    assert backup_ttft_s(before, rescue=False) == before.ttft_s  # a competitor: as expected
    for own_ms in (600, 800, 700):  # rescues predicted at 400 ms: 1.5x, 2x, 1.75x
        tr = _trace(
            "local", "cloud", "local", fallback_started=300, rescue_first_token=300 + own_ms
        )
        tr.decided(Decision("single", "cloud", "local", 1.2, None, ()), {"local": 400.0})
        tr.token(101.2)  # released at the deadline, after its own first token
        tr.done("stop", 101.3)
        model.observe_trace(tr.freeze(), 20)
    est = model.engine("local")
    assert list(est.backups) == pytest.approx([1.5, 2.0, 1.75])
    assert est.backup_factor == pytest.approx(2.0 * BACKUP_MARGIN)
    after = model.predict("local", 20, 8)
    assert after.rescue_ttft_s == pytest.approx(after.ttft_s * 2.0 * BACKUP_MARGIN)
    assert backup_ttft_s(after, rescue=True) >= after.ttft_p95_s


def test_a_backup_that_ran_as_predicted_keeps_the_p95_and_the_factor_is_bounded() -> None:
    model = LatencyModel()
    est = model.engine("local")
    for _ in range(5):
        est.observe_backup(0.5, 0.5)
    assert est.backup_factor == pytest.approx(BACKUP_MARGIN)
    est.observe_backup(10.0, 0.5)  # a stall: 20x
    assert est.backup_factor == 3.0
    est.observe_backup(0.0, 0.5)  # nothing measured
    est.observe_backup(0.5, 0.0)
    assert len(est.backups) == 6


def test_a_cloud_backup_keeps_the_p95_lead() -> None:
    """A rescue starts early only on the device: an early cloud start is a paid request."""
    from hybridllm.routing.hedging import backup_ttft_s

    model = LatencyModel()
    cloud = model.predict("cloud", 20, 8)
    assert cloud.rescue_ttft_s is None
    assert backup_ttft_s(cloud, rescue=True) == cloud.ttft_p95_s
    assert model.predict("local", 20, 8).rescue_ttft_s is not None
