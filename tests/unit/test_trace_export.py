"""Unit tests of the serialisable trace (`Trace.to_dict()` / `to_json()`): the attempts, the
spans of text, delivery against production times, and no content unless captured.

`ScriptedEngine` doubles (scripted test engines) on the virtual clock: times are exact."""

from __future__ import annotations

import json

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.errors import CloudConnectionError
from hybridllm.runtime.recorder import Recorder
from hybridllm.runtime.trace import Trace
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

FAILOVER = Policy(name="t", routing={"prefer": "cloud", "objective": "latency", "retries": 0})


async def test_a_failover_trace_names_each_attempt_and_each_span() -> None:
    cloud = ScriptedEngine(
        "cloud", script=[0.1, "Hel", 0.02, "lo", CloudConnectionError("reset")], model="big"
    )
    local = ScriptedEngine("local", tokens=[" wor", "ld"], ttft_s=0.05, tpot_s=0.01, model="s")
    async with HybridClient(local=local, cloud=cloud, router=None, policy=FAILOVER) as client:
        s = client.stream("hi")
        text = "".join([t async for t in s])
    d = s.trace.to_dict()
    assert text == "Hello world"
    assert [(a["engine"], a["model"], a["outcome"]) for a in d["attempts"]][:2] == [
        ("cloud", "big", "failed"),
        ("local", "s", "finished"),
    ]
    assert d["attempts"][0]["error_type"] == "CloudConnectionError"
    assert d["attempts"][0]["tokens"] == 2 and d["attempts"][1]["tokens"] == 2
    assert d["spans"] == [
        {"engine": "cloud", "first_token": 0},
        {"engine": "local", "first_token": 2},
    ]
    assert d["switches"][0]["from"] == "cloud" and d["switches"][0]["to"] == "local"
    assert d["ttft_ms"] == pytest.approx(100) and len(d["itl_ms"]) == 3
    assert d["policy"] == "t" and d["plan"] is not None and d["objective"] == "latency"
    assert json.loads(s.trace.to_json()) == json.loads(json.dumps(d))


async def test_no_prompt_or_answer_text_unless_captured() -> None:
    local = ScriptedEngine("local", tokens=["secret answer"])
    async with HybridClient(local=local) as client:
        s = client.stream("my private prompt")
        _ = [t async for t in s]
    text = s.trace.to_json()
    assert "secret answer" not in text and "private prompt" not in text
    assert "content" not in s.trace.to_dict()


def test_delivery_and_production_times_and_the_hop() -> None:
    rec = Recorder(Trace(t_start=10.0))
    rec.token(10.100, "local", delivered=10.104)
    rec.token(10.130, "local", delivered=10.131)
    rec.token(10.160, "local", delivered=10.170)
    tr = rec.freeze()
    assert tr.ttft_ms == pytest.approx(104) and tr.produced_ttft_ms == pytest.approx(100)
    assert tr.itl_ms == pytest.approx([27, 39]) and tr.itl_p99_ms == pytest.approx(39)
    assert tr.hop_ms == pytest.approx([4, 1, 10])
    d = tr.to_dict()
    assert d["hop_ms"]["max"] == pytest.approx(10) and d["hop_ms"]["n"] == 3
    assert d["produced_ms"] == pytest.approx([100, 130, 160])


def test_gaps_go_with_the_span_that_wrote_them() -> None:
    rec = Recorder(Trace(t_start=0.0))
    for i, engine in enumerate(["cloud", "cloud", "local", "local"]):
        rec.token(0.1 * (i + 1), engine)
    spans = rec.freeze().span_itl_ms()
    assert [e for e, _ in spans] == ["cloud", "local"]
    assert spans[0][1] == pytest.approx([100]) and spans[1][1] == pytest.approx([100, 100])


async def test_a_retried_stream_is_two_attempts() -> None:
    pol = Policy(name="r", routing={"prefer": "cloud", "objective": "latency", "retries": 1})
    cloud = ScriptedEngine("cloud", script=[0.01, CloudConnectionError("reset")])
    local = ScriptedEngine("local", tokens=["ok"])
    async with HybridClient(local=local, cloud=cloud, router=None, policy=pol) as client:
        s = client.stream("hi")
        _ = [t async for t in s]
    cloud_tries = [a for a in s.trace.attempts if a.engine == "cloud"]
    assert [a.attempt for a in cloud_tries][:2] == [1, 2]
    assert all(a.outcome == "failed" for a in cloud_tries)
