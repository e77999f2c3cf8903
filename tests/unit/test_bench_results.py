"""`hybridllm bench` without a model: the results, JSON, tables and plots from canned figures;
the machine's description, the sized prompts, and bad options as clean errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from hybridllm.cli.bench import machine, results as res
from hybridllm.cli.bench.options import QUICK
from hybridllm.cli.bench.plots import write_plots
from hybridllm.cli.bench.workload import mixed, sized_prompt
from hybridllm.cli.main import main
from hybridllm.cli.plotting import pyplot
from hybridllm.errors import InvalidArgumentError, MissingExtraError
from hybridllm.telemetry.stats import Counts, GroupStats, Percentiles

PNG = b"\x89PNG\r\n\x1a\n"
LOCAL = machine.ModelInfo("qwen2.5-coder-0.5b-instruct", "Q4_K_M", "llama.cpp in-process")
CLOUD = machine.ModelInfo("smollm2-135m-instruct", "Q4_1", "stand-in cloud")
MACHINE = machine.MachineInfo(
    "AMD EPYC 7B12", 2, "x86_64", "0.3.36 [AVX2]", LOCAL, CLOUD, "2026-12-02 06:00 UTC"
)


def _sample(
    part: res.Part,
    label: str,
    n_in: int,
    ttft: float,
    tokens: int = 8,
    tpot: float = 20.0,
    c: int = 1,
) -> res.Sample:
    total = ttft + tpot * (tokens - 1) + 5.0
    engine = label if label in ("local", "cloud") else "cloud"
    return res.Sample(part, label, engine, n_in, tokens, ttft, tpot, total, c)


def _group(p50: float, p95: float, p99: float, n: int, cloud: int) -> GroupStats:
    ttft = Percentiles(n, p50, p95, p99, p99)
    tpot = Percentiles(n, 20.0, 25.0, 26.0, 26.0)
    none = Percentiles(0, None, None, None, None)
    return GroupStats(Counts(requests=n, cloud_answers=cloud), ttft, tpot, none, none)


def canned() -> res.BenchResults:
    samples = [
        _sample("input", "local", 60, 300.0),
        _sample("input", "local", 500, 2100.0),
        _sample("input", "local", 2000, 9800.0),
        _sample("input", "cloud", 60, 150.0),
        _sample("input", "cloud", 500, 900.0),
        _sample("input", "cloud", 2000, 3900.0),
        *[_sample("concurrency", "cloud", 55, 200.0 * c, 16, 15.0, c) for c in (1, 2, 2)],
        *[
            _sample("mixed", name, 80, t)
            for name in ("cloud only", "local only", "policy chat")
            for t in (120.0, 250.0, 900.0)
        ],
    ]
    points = [
        res.ConcurrencyPoint(1, 0.5, 16, 15.0, 200.0),
        res.ConcurrencyPoint(2, 0.8, 32, 16.0, 400.0),
    ]
    runs = [
        res.StrategyRun("cloud only", _group(250.0, 880.0, 900.0, 3, 3)),
        res.StrategyRun("local only", _group(250.0, 880.0, 900.0, 3, 0)),
        res.StrategyRun("policy chat", _group(250.0, 880.0, 900.0, 3, 1)),
    ]
    return res.BenchResults(MACHINE, QUICK, 150.0, 30.0, samples, points, runs, 61.0)


def test_the_floor_is_at_the_best_prefill_rate_measured() -> None:
    r = canned()
    assert r.prefill_tps == pytest.approx(500 / 2.1)  # 60/0.3, 500/2.1, 2000/9.8 tokens/s
    assert r.floor_ms(2000) == pytest.approx(2000 / (500 / 2.1) * 1000)
    for s in r.part("input"):
        if s.label == "local":
            assert r.floor_ms(s.input_tokens or 0) <= (s.ttft_ms or 0) + 1e-9
    no_sweep = res.BenchResults(MACHINE, QUICK, 150.0, 30.0, [], [], [], 1.0)
    assert no_sweep.prefill_tps == 150.0 and no_sweep.floor_ms(300) == pytest.approx(2000.0)


def test_the_json_holds_every_part_and_names_the_machine() -> None:
    data = json.loads(json.dumps(canned().to_dict(), allow_nan=False))
    assert data["machine"]["cpu"] == "AMD EPYC 7B12" and data["machine"]["cores"] == 2
    assert data["machine"]["local"]["quantization"] == "Q4_K_M"
    assert data["machine"]["llama_cpp"] and data["machine"]["date"]
    assert data["config"]["lengths"] == [50, 500, 1000]
    rows = data["ttft_vs_input"]
    assert [(r["engine"], r["input_tokens"]) for r in rows][:2] == [("local", 60), ("local", 500)]
    assert all((r["floor_ms"] is None) == (r["engine"] == "cloud") for r in rows)
    assert data["concurrency"][1]["throughput_tps"] == pytest.approx(40.0)
    assert set(data["strategies"]) == {"cloud only", "local only", "policy chat"}
    assert data["strategies"]["cloud only"]["ttft_ms"]["p99"] == 900.0
    assert data["strategies"]["policy chat"]["counts"]["cloud_share"] == pytest.approx(1 / 3)
    check = data["total_time_check"]
    assert check["requests"] == 18 and check["max_abs_error"] == pytest.approx(5 / 265)
    assert len(data["samples"]) == 18 and data["local_rates"]["warm_up_prefill_tps"] == 150.0


def test_total_time_is_checked_against_ttft_plus_tpot_times_the_later_tokens() -> None:
    s = _sample("input", "local", 60, 300.0, tokens=11, tpot=20.0)
    assert s.predicted_total_ms == pytest.approx(300.0 + 20.0 * 10)
    one = res.Sample("input", "local", "local", 60, 1, 300.0, None, 310.0)
    assert one.predicted_total_ms is None
    assert res.total_check([one])["requests"] == 0


def test_the_tables_show_each_part() -> None:
    r = canned()
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for table in (res.input_table(r), res.concurrency_table(r), res.strategy_table(r)):
        console.print(table)
    text = console.export_text()
    assert "TTFT against input length" in text and "local floor ms" in text
    assert "9800.0" in text and "8400.0" in text  # 2000 tokens / 238.1 tokens/s
    assert "policy chat" in text and "33%" in text and "880.0" in text
    assert "cloud started" in text
    assert "median error" in res.check_line(r)


def test_the_plots_are_pngs(tmp_path: Path) -> None:
    written = write_plots(canned(), tmp_path / "plots")
    names = {p.name for p in written}
    assert names == {"ttft_vs_input.png", "concurrency.png", "total_time_check.png", "ttft_cdf.png"}
    for path in written:
        assert path.read_bytes()[:8] == PNG and path.stat().st_size < 200_000


def test_no_matplotlib_is_a_typed_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"hybridllm\[bench\]") as err:
        pyplot("hybridllm bench --plots")
    assert err.value.extra == "bench" and err.value.module == "matplotlib"


def test_the_machine_is_described_from_cpuinfo_and_manifests() -> None:
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: avx avx2\n"
    assert machine.cpu_model(cpuinfo) == "AMD EPYC 7B12"
    assert machine.quantization("qwen2.5-coder-0.5b-instruct") == "Q4_K_M"
    assert machine.quantization("smollm2-135m-instruct:q8_0") == "q8_0"
    assert machine.quantization("/models/foo-q5_k_m.gguf") == "Q5_K_M"
    assert machine.quantization("/models/plain.gguf") is None
    caption = MACHINE.caption()
    for part in ("AMD EPYC 7B12", "2 cores", "0.3.36", "Q4_K_M", "Q4_1", "2026-12-02"):
        assert part in caption


def test_prompts_are_sized_and_unique() -> None:
    def count(text: str) -> int:
        return len(text.split())

    a, b = sized_prompt(300, 1, count), sized_prompt(300, 2, count)
    assert count(a) >= 300 and count(a) < 300 + 20 and a != b
    assert a.startswith("Request 1.") and b.startswith("Request 2.")
    with pytest.raises(InvalidArgumentError, match="target"):
        sized_prompt(0, 1, count)
    mix = list(mixed(7, 0.5))
    assert len(mix) == 7 and all(m.max_tokens >= 4 for m in mix)


def test_bad_options_are_clean_cli_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["bench", "--api-key", "sk-x"]) == 2
    err = capsys.readouterr().err
    assert "--api-key must be given with --cloud-url" in err and "sk-x" not in err
    assert main(["bench", "--policy", "no-such-policy"]) == 2
    assert "no-such-policy" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--threads", "0"])
    assert exit_.value.code == 2
