"""Two processes share one decision log on a real redis-server (issue 29, part 2): each runs a
`HybridClient` over scripted engines (a unit test of the client's logging, not of a model),
both write their requests into one `redis://` log, one of them gives feedback on requests the
other answered, and `hybridllm stats --log redis://...` counts both's requests. Marked
integration: it needs the `redis-server` that `redis_url` (tests/conftest.py) starts."""

from __future__ import annotations

import json
import multiprocessing
import uuid

import anyio
import pytest

from hybridllm.cli.main import main
from hybridllm.client import HybridClient
from hybridllm.policy import Policy
from hybridllm.routing.logs import decision_log_from_url
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.integration

EACH = 6  # requests per process


async def _serve(url: str, tag: str, feedback_on: list[str]) -> list[str]:
    """`EACH` requests through one client (every other one forced to the scripted cloud), then
    feedback on `feedback_on` (requests another process answered); their request ids."""
    local = ScriptedEngine("local", tokens=["lo", "cal"], ttft_s=0.002, tpot_s=0.001)
    cloud = ScriptedEngine("cloud", tokens=["clo", "ud"], ttft_s=0.002, tpot_s=0.001)
    ids = []
    # the patterns alone: a cloud request under keep-local would wait for the NER pipelines
    # to load in each fresh process (about 5 s here), which this test of the log does not need
    policy = Policy(privacy={"ner": False})
    async with HybridClient(
        local=local, cloud=cloud, router=None, decision_log=url, policy=policy
    ) as client:
        for i in range(EACH):
            engine = "cloud" if i % 2 else "local"
            done = await client.complete(f"{tag} question {i}", engine=engine)
            ids.append(done.trace.request_id)
        for rid in feedback_on:
            client.feedback(rid, good=False)
    return ids


def _process(url: str, tag: str, feedback_on: list[str], out: multiprocessing.Queue[str]) -> None:
    ids = anyio.run(_serve, url, tag, feedback_on)
    out.put(json.dumps(ids))


def _run(url: str, tag: str, feedback_on: list[str]) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[str] = ctx.Queue()
    proc = ctx.Process(target=_process, args=(url, tag, feedback_on, out))
    proc.start()
    ids: list[str] = json.loads(out.get(timeout=120))
    proc.join(timeout=60)
    assert proc.exitcode == 0
    return ids


def test_two_processes_share_one_redis_log(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{redis_url}?prefix=shared-{uuid.uuid4().hex[:8]}"
    first = _run(url, "a", [])
    second = _run(url, "b", first[:3])  # feedback on rows the first process wrote

    with decision_log_from_url(url) as log:
        rows = {r["request_id"]: r for r in log.rows()}
    assert set(rows) == set(first) | set(second) and len(rows) == 2 * EACH
    assert [rows[rid]["feedback"] for rid in first] == [0, 0, 0, None, None, None]
    assert all(rows[rid]["feedback"] is None for rid in second)
    assert {rows[rid]["engine"] for rid in first} == {"local", "cloud"}
    assert all(rows[rid]["trace"] and rows[rid]["ttft_ms"] for rid in rows)

    assert main(["stats", "--log", url, "--since", "1h", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["overall"]["counts"]["requests"] == 2 * EACH
    assert report["engines"]["local"]["counts"]["requests"] == EACH
    assert report["engines"]["cloud"]["counts"]["requests"] == EACH


def test_stats_of_a_redis_log_never_print_its_password(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's title names the log's URL with its password hidden (the session's server
    asks for none, and redis-py connects anyway); so does the error of an unreachable one."""
    shown = redis_url.replace("redis://", "redis://:hunter2@") + "?prefix=empty"
    assert main(["stats", "--log", shown]) == 0
    out = capsys.readouterr().out
    assert ":***@" in out and "0 requests" in out and "hunter2" not in out
    assert main(["stats", "--log", "redis://:hunter2@127.0.0.1:1/0"]) == 2  # nothing listens
    err = capsys.readouterr().err
    assert err.startswith("error: --log must be") and "hunter2" not in err and ":***@" in err
