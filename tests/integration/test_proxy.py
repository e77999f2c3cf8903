"""FaultProxy against tiny loopback upstreams (raw TCP and stdlib HTTP)."""

from __future__ import annotations

import http.client
import http.server
import json
import math
import random
import socket
import socketserver
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from hybridllm.testing import FaultProxy, Faults
from hybridllm.testing.proxy import heavy_tail


class _Upstream(socketserver.ThreadingTCPServer):
    """Raw TCP upstream. The first line of each connection picks a mode:

    ``echo``: echo every chunk back; ``send N``: send N bytes of ``x`` then wait;
    ``hold``: send nothing. In every mode it reads until EOF and records when it saw it.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        self.eof_at: list[float] = []
        self.eof_event = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)


class _UpstreamHandler(socketserver.BaseRequestHandler):
    server: _Upstream

    def handle(self) -> None:
        sock: socket.socket = self.request
        buf = b""
        while b"\n" not in buf:
            data = sock.recv(4096)
            if not data:
                return self._eof()
            buf += data
        line, rest = buf.split(b"\n", 1)
        mode, *args = line.decode().split()
        if mode == "send":
            sock.sendall(b"x" * int(args[0]))
        if mode == "echo" and rest:
            sock.sendall(rest)
        try:
            while data := sock.recv(4096):
                if mode == "echo":
                    sock.sendall(data)
        except OSError:
            pass
        self._eof()

    def _eof(self) -> None:
        self.server.eof_at.append(time.monotonic())
        self.server.eof_event.set()


@pytest.fixture
def upstream() -> Iterator[_Upstream]:
    server = _Upstream()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def proxy(upstream: _Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=upstream.address) as p:
        yield p


def _connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            break
        buf += data
    return buf


def _echo_rtt(sock: socket.socket, payload: bytes) -> float:
    t0 = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - t0


def test_passthrough_raw(proxy: FaultProxy) -> None:
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        assert _echo_rtt(sock, b"hello") < 0.5
        big = bytes(range(256)) * 4096  # 1 MiB, both ways
        sock.sendall(big)
        assert _recv_exactly(sock, len(big)) == big
    assert proxy.wait_client_closed(timeout=2.0) is not None
    (rec,) = proxy.connections
    assert rec.id == 1
    assert rec.closed_by == "client"
    assert rec.bytes_up == len(b"echo\nhello") + len(big)
    assert rec.bytes_down == len(b"hello") + len(big)
    assert rec.first_byte_down_at is not None and rec.first_byte_down_at >= rec.opened_at


def test_passthrough_http() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b"hello " + self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with FaultProxy(upstream=("127.0.0.1", server.server_address[1])) as proxy:
            with urllib.request.urlopen(proxy.url + "/a/b", timeout=5.0) as resp:
                assert resp.status == 200
                assert resp.read() == b"hello /a/b"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_latency_and_jitter(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        assert _echo_rtt(sock, b"warm") < 0.1
        proxy.faults = Faults(latency_ms=150)  # applies to the open connection too
        assert 0.15 <= _echo_rtt(sock, b"a") < 0.5
        proxy.faults = Faults(latency_ms=50, jitter_ms=100, seed=7)
        rtts = [_echo_rtt(sock, b"b") for _ in range(4)]
    assert all(0.05 <= r < 0.4 for r in rtts), rtts


def test_latency_is_pipelined_not_cumulative(proxy: FaultProxy) -> None:
    # 20 chunks, each delayed 100 ms one way: the whole stream shifts by ~100 ms, not 2 s.
    proxy.faults = Faults(latency_ms=100)
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        t0 = time.monotonic()
        for _ in range(20):
            sock.sendall(b"y" * 10)
            time.sleep(0.005)
        assert _recv_exactly(sock, 200) == b"y" * 200
        elapsed = time.monotonic() - t0
    assert 0.1 <= elapsed < 0.8


def test_first_byte_stall_each_request(proxy: FaultProxy) -> None:
    proxy.faults = Faults(first_byte_stall_ms=200)
    with _connect(proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"echo\nfirst")
        assert _recv_exactly(sock, 5) == b"first"
        assert time.monotonic() - t0 >= 0.2
        # a second request on the same (keep-alive) connection is stalled too
        assert _echo_rtt(sock, b"again") >= 0.2
    rec = proxy.connections[0]
    assert rec.first_byte_down_at is not None
    assert rec.first_byte_down_at - rec.opened_at >= 0.2


def test_stall_probability_zero_means_no_stall(proxy: FaultProxy) -> None:
    proxy.faults = Faults(first_byte_stall_ms=500, stall_probability=0.0)
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        assert _echo_rtt(sock, b"quick") < 0.3


@pytest.mark.parametrize("limit", [0, 1000])
def test_reset_after_bytes(proxy: FaultProxy, upstream: _Upstream, limit: int) -> None:
    proxy.faults = Faults(reset_after_bytes=limit)
    with _connect(proxy) as sock:
        sock.sendall(b"send 100000\n")
        received = b""
        with pytest.raises(ConnectionResetError):
            while data := sock.recv(65536):
                received += data
    assert received == b"x" * limit
    rec = proxy.connections[0]
    assert rec.closed_by == "proxy-reset"
    assert rec.bytes_down == limit
    assert rec.client_closed_at is None
    assert upstream.eof_event.wait(2.0), "upstream was not closed after the reset"


def test_refuse(proxy: FaultProxy) -> None:
    proxy.faults = Faults(refuse=True)
    # The RST can even beat connect() on loopback; otherwise send or recv sees it.
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        with _connect(proxy) as sock:
            sock.sendall(b"echo\nhello")
            sock.recv(100)
    (rec,) = proxy.connections
    assert rec.refused and rec.closed_by == "proxy-reset"
    # turning the fault off applies to the next connection
    proxy.faults = Faults()
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        assert _echo_rtt(sock, b"ok") < 0.5


def test_client_close_recorded_and_propagated(proxy: FaultProxy, upstream: _Upstream) -> None:
    sock = _connect(proxy)
    sock.sendall(b"hold\n")
    time.sleep(0.05)
    assert not upstream.eof_event.is_set()
    t_close = time.monotonic()
    sock.close()
    closed_at = proxy.wait_client_closed(timeout=2.0)
    assert closed_at is not None and t_close <= closed_at < t_close + 0.5
    assert upstream.eof_event.wait(2.0)
    assert upstream.eof_at[0] - closed_at < 0.5
    rec = proxy.connections[-1]
    assert rec.closed_by == "client" and rec.client_closed_at == closed_at


def test_client_close_during_delayed_stream(proxy: FaultProxy, upstream: _Upstream) -> None:
    # Data is still queued in the proxy (latency) when the client leaves: close is still seen.
    proxy.faults = Faults(latency_ms=1000)
    sock = _connect(proxy)
    sock.sendall(b"send 5000\n")
    time.sleep(0.05)
    sock.close()
    assert proxy.wait_client_closed(timeout=0.5) is not None
    assert upstream.eof_event.wait(1.0)
    assert proxy.connections[0].bytes_down == 0


def test_upstream_close(upstream: _Upstream) -> None:
    # An upstream that answers and closes: the client gets everything, then EOF.
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(100)
            conn.sendall(b"bye")

    thread = threading.Thread(target=serve_once)
    thread.start()
    try:
        with FaultProxy(upstream=("127.0.0.1", listener.getsockname()[1])) as proxy:
            proxy.faults = Faults(latency_ms=50)
            with _connect(proxy) as sock:
                sock.sendall(b"hi")
                assert _recv_exactly(sock, 10) == b"bye"
            rec = proxy.connections[0]
            assert proxy.wait_client_closed(rec.id, timeout=2.0) is None
            rec = proxy.connections[0]
            assert rec.closed_by == "upstream"
            assert rec.upstream_closed_at is not None and rec.client_closed_at is None
    finally:
        thread.join()
        listener.close()


def test_upstream_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with FaultProxy(upstream=("127.0.0.1", dead_port)) as proxy:
        with pytest.raises((ConnectionResetError, BrokenPipeError)), _connect(proxy) as sock:
            sock.sendall(b"x")
            sock.recv(10)
        rec = proxy.connections[0]
        assert rec.closed_by == "upstream" and rec.error is not None


def test_stop_closes_connections_and_joins_thread(upstream: _Upstream) -> None:
    proxy = FaultProxy(upstream=upstream.address).start()
    sock = _connect(proxy)
    sock.sendall(b"hold\n")
    time.sleep(0.05)
    proxy.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("FaultProxy")]
    assert sock.recv(10) == b""  # the proxy closed the client side
    sock.close()
    assert upstream.eof_event.wait(2.0)
    assert proxy.connections[0].closed_by == "proxy"
    proxy.stop()  # idempotent
    with pytest.raises(RuntimeError):
        _ = proxy.port


def test_wait_client_closed_times_out(proxy: FaultProxy) -> None:
    assert proxy.wait_client_closed(timeout=0.05) is None  # no connection yet
    with _connect(proxy) as sock:
        sock.sendall(b"hold\n")
        assert proxy.wait_client_closed(timeout=0.05) is None


def test_faults_validation() -> None:
    with pytest.raises(ValueError):
        Faults(latency_ms=-1)
    with pytest.raises(ValueError):
        Faults(stall_probability=1.5)
    with pytest.raises(ValueError):
        Faults(reset_after_bytes=-1)
    with pytest.raises(ValueError):
        Faults(http_status=200)
    with pytest.raises(ValueError):
        Faults(http_status=500, sse_garbage=True)
    with pytest.raises(ValueError):
        Faults(retry_after_s=1.0)  # needs http_status
    with pytest.raises(ValueError):
        Faults(keepalive_only_s=1.0, keepalive_interval_ms=0)
    with pytest.raises(ValueError):
        Faults(http_status=500, fail_first=-1)
    with pytest.raises(ValueError):
        heavy_tail(median_ms=200, p99_ms=100)
    assert Faults().http_fault is None
    assert Faults(http_status=429).http_fault == "HTTP 429"
    assert Faults(sse_garbage=True).http_fault == "sse_garbage"
    assert Faults(keepalive_only_s=1).http_fault == "keepalive"


# ---- per-request stall distributions ------------------------------------------------------


def test_first_byte_stall_dist(proxy: FaultProxy) -> None:
    draws: list[float] = []

    def dist(rng: random.Random) -> float:
        draws.append(rng.random())
        return 250.0

    proxy.faults = Faults(first_byte_stall_dist=dist, first_byte_stall_ms=5000, seed=3)
    with _connect(proxy) as sock:
        t0 = time.monotonic()
        sock.sendall(b"echo\nping")
        assert _recv_exactly(sock, 4) == b"ping"
        assert 0.25 <= time.monotonic() - t0 < 1.0  # the distribution replaces the fixed stall
        assert 0.25 <= _echo_rtt(sock, b"again") < 1.0  # one draw per response
    assert len(draws) == 2


def test_heavy_tail_quantiles() -> None:
    dist = heavy_tail(median_ms=150, p99_ms=3000)
    rng = random.Random(1)
    xs = sorted(dist(rng) for _ in range(20000))
    assert 135 < xs[10000] < 165
    assert 2400 < xs[19800] < 3700
    spiky = heavy_tail(median_ms=150, p99_ms=3000, spike_probability=0.03, spike_ms=5000)
    ys = [spiky(rng) for _ in range(20000)]
    assert 0.025 < sum(y == 5000 for y in ys) / len(ys) < 0.035


# ---- HTTP-level faults --------------------------------------------------------------------


class _HTTPUpstream(http.server.ThreadingHTTPServer):
    daemon_threads = True
    requests: list[tuple[str, bytes]]


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPUpstream

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.requests.append((self.path, body))
        out = b"upstream:" + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_proxy() -> Iterator[tuple[FaultProxy, _HTTPUpstream]]:
    server = _HTTPUpstream(("127.0.0.1", 0), _EchoHandler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with FaultProxy(upstream=("127.0.0.1", server.server_address[1])) as p:
            yield p, server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _post(
    proxy: FaultProxy,
    body: bytes = b'{"model": "m"}',
    conn: http.client.HTTPConnection | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5.0)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"X-Test": "1"})
    resp = conn.getresponse()
    return resp, resp.read()


def test_http_status_canned_response(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, upstream = http_proxy
    proxy.faults = Faults(http_status=429, retry_after_s=2)
    resp, body = _post(proxy, b'{"model": "m", "pad": "' + b"x" * 100_000 + b'"}')
    assert resp.status == 429
    assert resp.getheader("Retry-After") == "2"
    assert resp.getheader("Content-Type") == "application/json"
    assert resp.getheader("Connection") == "close"
    err = json.loads(body)["error"]
    assert err["type"] == "rate_limit_error" and "429" in err["message"]
    assert upstream.requests == []  # answered without contacting the upstream
    assert proxy.wait_client_closed(timeout=2.0) is None  # the proxy closed it after answering
    (rec,) = proxy.connections
    assert rec.http_fault == "HTTP 429" and rec.closed_by == "proxy-answer"
    assert rec.request_head is not None
    assert rec.request_head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert rec.bytes_up > 100_000  # the whole body was read before answering
    resp, _ = _post(proxy)
    assert resp.status == 429 and resp.getheader("Retry-After") == "2"  # every request


def test_http_status_5xx_without_retry_after(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, _ = http_proxy
    proxy.faults = Faults(http_status=503, first_byte_stall_ms=200)
    t0 = time.monotonic()
    resp, body = _post(proxy)
    assert time.monotonic() - t0 >= 0.2  # stalls apply to canned answers too
    assert resp.status == 503 and resp.reason == "Service Unavailable"
    assert resp.getheader("Retry-After") is None
    assert json.loads(body)["error"]["type"] == "server_error"


def test_fail_first_then_the_real_upstream(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, upstream = http_proxy
    proxy.faults = Faults(http_status=500, fail_first=2)
    assert [_post(proxy)[0].status for _ in range(2)] == [500, 500]
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5.0)
    resp, body = _post(proxy, b"one", conn)
    assert (resp.status, body) == (200, b"upstream:one")
    resp, body = _post(proxy, b"two", conn)  # keep-alive on the forwarded connection
    assert (resp.status, body) == (200, b"upstream:two")
    conn.close()
    assert [b for _, b in upstream.requests] == [b"one", b"two"]
    recs = proxy.connections
    assert [r.http_fault for r in recs] == ["HTTP 500", "HTTP 500", None]
    assert recs[2].bytes_down > 0
    # setting faults again starts a new count
    proxy.faults = Faults(http_status=502, fail_first=1)
    assert [_post(proxy)[0].status for _ in range(2)] == [502, 200]


def test_sse_garbage(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, upstream = http_proxy
    proxy.faults = Faults(sse_garbage=True)
    resp, body = _post(proxy)
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert body.startswith(b"data: {not json\n\n")
    assert upstream.requests == []
    assert proxy.connections[0].closed_by == "proxy-answer"


def test_keepalive_only_then_end(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, upstream = http_proxy
    proxy.faults = Faults(keepalive_only_s=0.35, keepalive_interval_ms=100)
    t0 = time.monotonic()
    resp, body = _post(proxy)
    elapsed = time.monotonic() - t0
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert body == b": ping\n\n" * 4  # at 0, 100, 200, 300 ms; the stream ends at 350 ms
    assert 0.33 <= elapsed < 1.0
    assert upstream.requests == []


def test_keepalive_forever_until_the_client_leaves(
    http_proxy: tuple[FaultProxy, _HTTPUpstream],
) -> None:
    proxy, _ = http_proxy
    proxy.faults = Faults(keepalive_only_s=math.inf, keepalive_interval_ms=20)
    with _connect(proxy) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        got = b""
        while got.count(b": ping") < 5:
            got += sock.recv(4096)
        assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    closed = proxy.wait_client_closed(timeout=2.0)
    assert closed is not None
    rec = proxy.connections[0]
    assert rec.closed_by == "client" and rec.http_fault == "keepalive"


def test_client_leaves_before_a_full_request(http_proxy: tuple[FaultProxy, _HTTPUpstream]) -> None:
    proxy, upstream = http_proxy
    proxy.faults = Faults(http_status=500)
    with _connect(proxy) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    assert proxy.wait_client_closed(timeout=2.0) is not None
    assert proxy.connections[0].http_fault is None and upstream.requests == []


def test_refuse_first_connection_only(proxy: FaultProxy) -> None:
    proxy.faults = Faults(refuse=True, fail_first=1)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        with _connect(proxy) as sock:
            sock.sendall(b"echo\nhello")
            sock.recv(100)
    with _connect(proxy) as sock:
        sock.sendall(b"echo\n")
        assert _echo_rtt(sock, b"ok") < 0.5
    assert [r.refused for r in proxy.connections] == [True, False]
