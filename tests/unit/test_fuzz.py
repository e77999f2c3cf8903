"""Fuzzing with hypothesis: what the cloud serves, and policy files.

- The OpenAI engine's stream: the openai SDK parses the SSE, so the fuzzed thing is the bytes a
  server sends. A tiny loopback HTTP server (a thread, one canned answer per connection) plays a
  generated answer: a status line, then a body of SSE events, valid or not (chunks with odd
  types, error events, truncated JSON, comments, raw bytes, `[DONE]` or not). Whatever it sends,
  `OpenAIEngine.stream()` ends with a `Finish` (every delta a string) or a typed `HybridError`
  (a `CloudError`), within the engine's timeout: never another exception, never a hang.
- Policy files: generated TOML-ish bodies (the real fields with values of any type, `extends`
  chains between sibling files, tables, garbage lines) through `hybridllm.policy.resolve_policy`:
  a valid `Policy` or a `PolicyError`, nothing else.
"""

from __future__ import annotations

import json
import math
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.openai_engine import OpenAIEngine
from hybridllm.errors import CloudError, HybridError, PolicyError
from hybridllm.events import Delta, Finish
from hybridllm.policy import MOVED, TABLES, Policy, resolve_policy

ENGINE_TIMEOUT_S = 1.0  # the engine's timeout: a silent or keep-alive-only server hits it
HANG_S = 5.0  # an answer not ended by then has hung


# ---- a loopback server that plays one canned answer per connection -----------------------------


class CannedServer:
    def __init__(self) -> None:
        self.answer = b""
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="fuzz-canned-server", daemon=True)
        self._stop = False

    def _serve(self) -> None:
        self._sock.settimeout(0.1)  # so that a stop is seen at once
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2.0)
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        got = conn.recv(65536)
                        if not got:
                            break
                        data += got
                    conn.sendall(self.answer)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def __enter__(self) -> CannedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join(5.0)
        self._sock.close()


@pytest.fixture(scope="module")
def canned() -> Iterator[CannedServer]:
    with CannedServer() as server:
        yield server


# ---- what the server sends ---------------------------------------------------------------------

_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_any = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_content = st.one_of(st.text(max_size=10), _json_any)
_choice = st.fixed_dictionaries(
    {},
    optional={
        "index": st.one_of(st.integers(-2, 3), _json_any),
        "delta": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"content": _content, "role": st.sampled_from(["assistant", 3])}
            ),
            _json_any,
        ),
        "finish_reason": st.one_of(st.sampled_from(["stop", "length", None, ""]), _json_any),
    },
)
_chunk = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=5),
        "object": st.just("chat.completion.chunk"),
        "choices": st.one_of(st.lists(_choice, max_size=2), _json_any),
        "usage": st.one_of(
            st.fixed_dictionaries(
                {"prompt_tokens": _json_scalar, "completion_tokens": _json_scalar}
            ),
            _json_any,
        ),
        "error": st.one_of(st.fixed_dictionaries({"message": _content}), _json_any),
    },
)
# close to what a server sends, with a wrong type here and there
_near_valid = st.fixed_dictionaries(
    {
        "choices": st.lists(
            st.fixed_dictionaries(
                {
                    "index": st.just(0),
                    "delta": st.fixed_dictionaries({"content": _content}),
                    "finish_reason": st.one_of(
                        st.sampled_from(["stop", "length", None]), _json_scalar
                    ),
                }
            ),
            min_size=1,
            max_size=1,
        )
    },
    optional={
        "usage": st.fixed_dictionaries(
            {"prompt_tokens": _json_scalar, "completion_tokens": _json_scalar}
        )
    },
)
_event = st.one_of(
    _near_valid.map(lambda c: b"data: " + json.dumps(c).encode() + b"\n\n"),
    _chunk.map(lambda c: b"data: " + json.dumps(c).encode() + b"\n\n"),
    _chunk.map(lambda c: b"data: " + json.dumps(c).encode()[:-3] + b"\n\n"),  # truncated
    st.just(b"data: [DONE]\n\n"),
    st.just(b": keep-alive\n\n"),
    st.just(b'event: error\ndata: {"error": {"message": "boom"}}\n\n'),
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda t: f"data: {t}\n\n".encode()),
)
_status = st.sampled_from([200, 200, 200, 200, 201, 204, 301, 400, 401, 404, 429, 500, 503])
_ctype = st.sampled_from(["text/event-stream", "application/json", "text/plain", ""])


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    status = draw(_status)
    ctype = draw(_ctype)
    body = b"".join(draw(st.lists(_event, max_size=8)))
    head = f"HTTP/1.1 {status} X\r\nConnection: close\r\n"
    if ctype:
        head += f"Content-Type: {ctype}\r\n"
    if draw(st.booleans()):
        head += f"Content-Length: {len(body) + draw(st.sampled_from([0, 0, 5, -3]))}\r\n"
    return head.encode() + b"\r\n" + body


async def _play(port: int) -> tuple[HybridError | None, list[Any]]:
    engine = OpenAIEngine(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="m", timeout=ENGINE_TIMEOUT_S
    )
    chunks: list[Any] = []
    try:
        with anyio.fail_after(HANG_S):
            async for chunk in engine.stream(
                GenerationRequest([{"role": "user", "content": "hi"}])
            ):
                chunks.append(chunk)
        return None, chunks
    except HybridError as exc:
        return exc, chunks
    finally:
        await engine.aclose()


@pytest.mark.filterwarnings("ignore:the cloud engine is unavailable:RuntimeWarning")  # 401/403
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=answers())
def test_any_cloud_answer_ends_in_text_or_a_typed_error(
    canned: CannedServer, answer: bytes
) -> None:
    canned.answer = answer
    try:
        outcome, chunks = anyio.run(_play, canned.port)
    except TimeoutError:
        pytest.fail(f"the stream hung on {answer!r}")
    deltas = [c for c in chunks if isinstance(c, Delta)]
    assert all(isinstance(d.text, str) and d.text for d in deltas), deltas
    if outcome is None:
        assert isinstance(chunks[-1], Finish)
        assert isinstance(chunks[-1].reason, str)
        assert all(isinstance(n, int) for n in (chunks[-1].prompt_tokens,
                                                  chunks[-1].completion_tokens))  # fmt: skip
    else:  # an endpoint's failure, typed as one (with whether text had been delivered)
        assert isinstance(outcome, CloudError), repr(outcome)
        assert outcome.received_content == bool(deltas)


def test_the_canned_server_serves_a_real_answer(canned: CannedServer) -> None:
    """The fuzz harness itself: a well-formed answer comes through as text and a finish."""
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in (chunk, end))
    canned.answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        + body
        + b"data: [DONE]\n\n"
    )
    outcome, chunks = anyio.run(_play, canned.port)
    assert outcome is None
    assert [c.text for c in chunks if isinstance(c, Delta)] == ["Hi"]
    assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "stop"


# ---- policy files -----------------------------------------------------------------------------

FIELDS = [
    *Policy.model_fields,
    "extends",
    *(f"{t}.{f}" for t, model in TABLES.items() for f in model.model_fields),
    *MOVED,  # the old flat form: a PolicyError naming the new place
]
BUDGET_FIELDS = ["per_request_usd", "per_day_usd", "per_month_usd", "on_exceeded", "cap"]
_WORDS = st.sampled_from(
    ["local", "cloud", "auto", "single", "hedge", "off", "keep-local", "block", "fail", "chat",
     "a", "b", "c", "p", "", "speculative", "-1", "nan"]
)  # fmt: skip
_toml_scalar = st.one_of(
    _WORDS.map(json.dumps),
    st.text(max_size=8).map(json.dumps),
    st.integers(-5, 10**6).map(str),
    st.floats().map(lambda f: "nan" if math.isnan(f) else repr(f).replace("inf", "inf")),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.sampled_from(["1979-05-27", "0x10", "1_000", "'raw'", '"""x"""']),
)
_toml_value = st.one_of(
    _toml_scalar,
    st.lists(_toml_scalar, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.dictionaries(_WORDS.filter(bool), _toml_scalar, max_size=2).map(
        lambda d: "{ " + ", ".join(f'"{k}" = {v}' for k, v in d.items()) + " }"
    ),
)
_line = st.one_of(
    st.tuples(st.sampled_from(FIELDS), _toml_value).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    st.tuples(st.sampled_from(BUDGET_FIELDS), _toml_value).map(
        lambda kv: f"budget.{kv[0]} = {kv[1]}"
    ),
    st.sampled_from(["a", "b", "c", "chat", "p", "nowhere", "../x"]).map(
        lambda n: f'extends = "{n}"'
    ),
    st.text(max_size=20),  # garbage
)


@st.composite
def policy_files(draw: st.DrawFn) -> dict[str, str]:
    """p.toml and up to three siblings it may extend (a, b, c), with [budget] tables."""
    files = {}
    for name in draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3)) + ["p"]:
        lines = draw(st.lists(_line, max_size=7))
        if draw(st.booleans()):
            lines.append("[budget]")
            lines += [
                f"{k} = {v}"
                for k, v in draw(
                    st.lists(st.tuples(st.sampled_from(BUDGET_FIELDS), _toml_value), max_size=3)
                )
            ]
        files[name] = "\n".join(lines) + "\n"
    return files


@settings(max_examples=250, deadline=None)
@given(files=policy_files())
def test_any_policy_file_is_a_policy_or_a_policy_error(files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, body in files.items():
            (d / f"{name}.toml").write_text(body, encoding="utf-8")
        try:
            policy = resolve_policy(d / "p.toml", dirs=[d])
        except PolicyError as exc:
            assert str(exc)  # names what is wrong
            return
    assert isinstance(policy, Policy)
    Policy.model_validate(policy.model_dump())  # what it resolved to is valid as it stands


def test_the_policy_fuzz_reaches_valid_policies() -> None:
    """The generator's vocabulary can build a valid chained policy (so the property above is
    not only ever testing errors)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "a.toml").write_text(
            '[routing]\nprefer = "local"\n[sampling]\nmax_tokens = 10\n', encoding="utf-8"
        )
        (d / "p.toml").write_text(
            'extends = "a"\n[routing]\nretries = 1\n[budget]\nper_day_usd = 1.5\n', encoding="utf-8"
        )
        policy = resolve_policy(d / "p.toml", dirs=[d])
    assert (policy.routing.prefer, policy.sampling.max_tokens, policy.routing.retries) == (
        "local",
        10,
        1,
    )
    assert policy.budget.per_day_usd == 1.5
