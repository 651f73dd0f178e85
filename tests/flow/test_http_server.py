"""The built-in HTTP/1.1 server (``agui_adapter.http.server``) over real loopback sockets.

Two kinds of tests: the server around a tiny WSGI application of this file (framing,
timeouts, limits, shutdown), and the server around the real adapter on the scripted
kernel (keep-alive across the adapter's answers, a client that stops reading has its
kernel task cancelled). Requests are written by hand on raw sockets so that every byte
on the wire is the test's choice.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.cli import build_app
from agui_adapter.config import Settings
from agui_adapter.http.connection import CLIENT_WATCH_KEY, INLINE_CARRY_KEY
from agui_adapter.http.server import ServerLimits, WSGIServer
from agui_adapter.kernel_client.launch import KernelProcess

# ---------------------------------------------------------------------- a raw HTTP client


def _tcp_queues(local_port: int, remote_port: int) -> tuple[int, int] | None:
    """(send queue, receive queue) in bytes of the loopback TCP socket between these ports
    (Linux ``/proc/net/tcp``), or None when there is none."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            tx, rx = queues.split(":")
            return int(tx, 16), int(rx, 16)
    return None


def _backed_up(server_port: int, client_port: int) -> bool:
    """Whether the server has bytes the client has not taken while the client's receive queue
    holds bytes it does not read: a writer on that connection is stuck (Linux ``/proc``)."""
    if not Path("/proc/net/tcp").exists():
        return True  # no way to look: the cancel below is tested all the same
    server_side = _tcp_queues(server_port, client_port)
    client_side = _tcp_queues(client_port, server_port)
    return bool(server_side and client_side and server_side[0] > 0 and client_side[1] > 0)


class Conn:
    """One client connection: write raw requests, read responses one at a time."""

    def __init__(self, port: int, timeout: float = 10.0, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: test"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError("closed mid-response")
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ConnectionError("closed mid-body")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def response(self, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        status = int(self._line().split(b" ")[1])
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if head or status in (204, 304) or 100 <= status < 200:
            return status, headers, b""
        if "content-length" in headers:
            return status, headers, self._exactly(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line().split(b";")[0], 16):
                body += self._exactly(size)
                assert self._exactly(2) == b"\r\n"
            assert self._line() == b""
            return status, headers, body
        while self._fill():
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def closed_by_server(self, within: float) -> bool:
        """True when the server closes (EOF or reset) within ``within`` seconds."""
        self.sock.settimeout(within)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------------- a tiny application


class DemoApp:
    """/health (JSON with a length), /echo (reads the body), /refuse (answers without
    reading), /stream (one chunk every 20 ms until closed), /fail (raises)."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.streams_closed = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ["PATH_INFO"]
        if path == "/stream":
            start_response("200 OK", [("Content-Type", "text/event-stream")])
            return self._stream()
        if path == "/echo":
            body = environ["wsgi.input"].read()
            return self._json(
                start_response, 200, {"length": len(body), "terminated": environ["wsgi.input_terminated"]}
            )
        if path == "/refuse":
            return self._json(start_response, 415, {"error": {"code": "UNSUPPORTED_MEDIA_TYPE", "message": "no"}})
        if path == "/fail":
            raise RuntimeError("boom")
        return self._json(start_response, 200, {"status": "ok"})

    @staticmethod
    def _json(start_response: Callable[..., Any], status: int, body: Any) -> list[bytes]:
        data = json.dumps(body).encode()
        start_response(f"{status} X", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def _stream(self) -> Iterator[bytes]:
        try:
            while True:
                yield b"data: tick\n\n"
                time.sleep(0.02)
        finally:
            self.streams_closed += 1
            self.closed.set()


Serve = Callable[..., WSGIServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a WSGIServer on a free loopback port: ``serve(app, **limits)``."""
    servers: list[WSGIServer] = []

    def start(app: Any, **limits: Any) -> WSGIServer:
        server = WSGIServer("127.0.0.1", 0, app, ServerLimits(**limits))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def health_within(port: int, seconds: float) -> float:
    """Time for GET /health on a new connection; fails beyond ``seconds``."""
    started = time.monotonic()
    conn = Conn(port, timeout=seconds)
    try:
        conn.request("GET", "/health")
        status, _, body = conn.response()
    finally:
        conn.close()
    assert status == 200 and json.loads(body)["status"] == "ok"
    return time.monotonic() - started


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# ---------------------------------------------------------------------- framing


def test_keep_alive_serves_many_requests_on_one_connection(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    for i in range(20):
        conn.request("POST", "/echo", b"x" * i)
        status, headers, body = conn.response()
        assert status == 200 and json.loads(body) == {"length": i, "terminated": True}
        assert headers.get("connection") != "close"
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
    assert [c.requests for c in server.connections()] == [40]
    conn.close()


def test_timeouts_of_years_are_served_like_any_other(serve: Serve) -> None:
    years = 1e12  # seconds: beyond what one poll() can wait (about 24 days), to which it is cut
    server = serve(DemoApp(), keepalive_timeout=years, request_timeout=years, send_timeout=years)
    conn = Conn(server.server_port)
    conn.sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n")
    time.sleep(0.05)  # the body comes later: the server waits for it
    conn.sock.sendall(b"abc")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body)["length"] == 3
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    conn.close()


def assert_closed_after_the_idle_timeout(conn: Conn, server: Any) -> None:
    """One more request, then the server closes the connection once it idled 0.5 s."""
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    started = time.monotonic()
    assert conn.closed_by_server(within=5.0)
    assert 0.3 < time.monotonic() - started < 3.0
    assert wait_for(lambda: not server.connections(), 2.0)


def test_idle_keep_alive_connection_is_closed_after_the_timeout(serve: Serve) -> None:
    server = serve(DemoApp(), keepalive_timeout=0.5)
    conn = Conn(server.server_port)
    assert_closed_after_the_idle_timeout(conn, server)


def test_connection_close_and_http_1_0(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.request("GET", "/health", headers={"Connection": "close"})
    status, headers, _ = conn.response()
    assert status == 200 and headers["connection"] == "close"
    assert conn.closed_by_server(within=2.0)
    conn = Conn(server.server_port)
    conn.send(b"GET /health HTTP/1.0\r\n\r\n")
    status, headers, _ = conn.response()
    assert status == 200 and headers["connection"] == "close"
    assert conn.closed_by_server(within=2.0)
    conn = Conn(server.server_port)  # HTTP/1.0 keep-alive when asked for
    for _ in range(3):
        conn.send(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, _ = conn.response()
        assert status == 200 and headers["connection"] == "keep-alive"
    conn.close()


def test_streams_are_chunked_one_write_per_chunk_and_keep_the_connection(serve: Serve) -> None:
    chunks = [b"a" * 5, b"", b"b" * 70000, b"c"]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        yield from chunks

    server = serve(app)
    conn = Conn(server.server_port)
    conn.request("GET", "/")
    status, headers, body = conn.response()
    assert status == 200 and headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert body == b"".join(chunks)
    conn.request("GET", "/")  # the terminating chunk left the connection usable
    assert conn.response()[2] == b"".join(chunks)
    conn.close()


def test_head_has_no_body(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.request("HEAD", "/health")
    status, headers, _ = conn.response(head=True)
    assert status == 200 and int(headers["content-length"]) == len(b'{"status": "ok"}')
    # had the body been sent, it would be read as the next status line
    conn.request("GET", "/health")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body) == {"status": "ok"}
    conn.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        conn.sock.recv(1)
    conn.close()


def test_post_without_length_is_an_empty_body_at_once(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port, timeout=3.0)
    started = time.monotonic()
    conn.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\r\n")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body) == {"length": 0, "terminated": True}
    assert time.monotonic() - started < 1.0
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    conn.close()


def test_chunked_request_bodies_are_decoded(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.send(
        b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    status, _, body = conn.response()
    assert status == 200 and json.loads(body) == {"length": 31, "terminated": True}
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    conn.close()


@pytest.mark.parametrize(
    "bad",
    [b"zz\r\n", b"-1\r\n", b"5\r\nhelloXX0\r\n\r\n", b"1" * 40 + b"\r\n"],
    ids=["not-hex", "negative", "no-crlf-after-data", "too-long"],
)
def test_bad_chunk_header_is_400_and_the_connection_closes(serve: Serve, bad: bytes) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n" + bad)
    status, headers, body = conn.response()
    assert status == 400 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "BAD_REQUEST"
    assert conn.closed_by_server(within=3.0)


@pytest.mark.parametrize(
    "head,status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
    ],
    ids=[
        "garbage",
        "http2",
        "space-in-name",
        "obs-fold",
        "two-lengths",
        "negative-length",
        "cl-and-te",
        "gzip-te",
        "long-line",
        "many-headers",
    ],  # fmt: skip
)
def test_malformed_requests_get_a_json_error_and_a_close(serve: Serve, head: bytes, status: int) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.send(head)
    got, headers, body = conn.response()
    assert got == status and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"]
    assert conn.closed_by_server(within=3.0)


def test_an_unread_small_body_is_drained_and_the_connection_kept(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.request("POST", "/refuse", b"{" * 1000)
    status, headers, _ = conn.response()
    assert status == 415 and headers.get("connection") != "close"
    conn.request("GET", "/health")  # the body was not taken for the next request
    assert conn.response()[0] == 200
    conn.close()


def test_an_unread_large_body_closes_the_connection_after_the_answer(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    body = b"{" * (4 * 1024 * 1024)
    conn.send(b"POST /refuse HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n" % len(body))
    sender = threading.Thread(target=lambda: conn.sock.sendall(body), daemon=True)
    sender.start()
    status, headers, _ = conn.response()
    assert status == 415 and headers["connection"] == "close"
    sender.join(10)
    assert conn.closed_by_server(within=5.0)


def test_application_failure_is_a_json_500(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.request("GET", "/fail")
    status, headers, body = conn.response()
    assert status == 500 and json.loads(body)["error"]["code"] == "INTERNAL_ERROR"
    assert headers["connection"] == "close"


# ---------------------------------------------------------------------- timeouts


def _trickle(conn: Conn, data: bytes, every: float, stop: threading.Event) -> None:
    for byte in data:
        if stop.is_set():
            return
        try:
            conn.send(bytes([byte]))
        except OSError:
            return
        time.sleep(every)


@pytest.mark.parametrize("part", ["headers", "body"])
def test_slow_loris_is_dropped_after_the_request_timeout(serve: Serve, part: str) -> None:
    server = serve(DemoApp(), request_timeout=1.0)
    conn = Conn(server.server_port)
    stop = threading.Event()
    if part == "headers":
        conn.send(b"GET /health HTTP/1.1\r\n")
        data = b"X-Slow: " + b"a" * 1000
    else:
        conn.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n")
        data = b"a" * 1000
    started = time.monotonic()
    trickler = threading.Thread(target=_trickle, args=(conn, data, 0.05, stop), daemon=True)
    trickler.start()
    try:
        # the trickle never pauses longer than 50 ms, yet /health keeps answering meanwhile
        assert health_within(server.server_port, 2.0) < 1.0
        status, headers, body = conn.response()
        elapsed = time.monotonic() - started
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "REQUEST_TIMEOUT"
        assert 0.8 < elapsed < 4.0, elapsed
        assert conn.closed_by_server(within=5.0)
    finally:
        stop.set()
        trickler.join(5)
    assert health_within(server.server_port, 2.0) < 1.0


def test_a_silent_new_connection_is_closed_after_the_request_timeout(serve: Serve) -> None:
    server = serve(DemoApp(), request_timeout=0.5)
    conn = Conn(server.server_port)
    started = time.monotonic()
    assert conn.closed_by_server(within=5.0)
    assert 0.3 < time.monotonic() - started < 3.0


def test_a_client_that_stops_reading_is_gone_after_the_send_timeout(serve: Serve) -> None:
    app = DemoApp()

    def big(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["PATH_INFO"] != "/stream":
            return app(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/event-stream")])

        def stream() -> Iterator[bytes]:
            try:
                while True:
                    yield b"x" * 65536
            finally:
                app.closed.set()

        return stream()

    server = serve(big, send_timeout=0.5)
    conn = Conn(server.server_port, rcvbuf=4096)
    conn.request("GET", "/stream")
    assert conn.sock.recv(100).startswith(b"HTTP/1.1 200")
    stopped_reading = time.monotonic()
    assert app.closed.wait(10), "the WSGI iterable was not closed"
    assert time.monotonic() - stopped_reading >= 0.4
    assert wait_for(lambda: not server.connections(), 3.0)
    conn.close()


# ---------------------------------------------------------------------- limits


def _busy(port: int) -> Conn:
    """A connection that holds its slot: a request head that never ends."""
    conn = Conn(port)
    conn.send(b"GET /health HTTP/1.1\r\nHost: test\r\n")
    return conn


def test_beyond_max_connections_503_server_busy_and_health_from_the_reserve(serve: Serve) -> None:
    server = serve(DemoApp(), max_connections=2, reserve_connections=2, request_timeout=30)
    port = server.server_port
    held = [_busy(port), _busy(port)]
    assert wait_for(lambda: len(server.connections()) == 2, 2.0)
    # a run-like request beyond the limit: 503 SERVER_BUSY with Retry-After, then close
    conn = Conn(port)
    conn.request("POST", "/echo", b"{}")
    status, headers, body = conn.response()
    assert status == 503 and headers["retry-after"].isdigit() and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "SERVER_BUSY"
    assert conn.closed_by_server(within=3.0)
    # /health answers from the reserve, promptly
    assert health_within(port, 2.0) < 1.0
    assert wait_for(lambda: all(not c.reserve for c in server.connections()), 2.0)  # reserve slots given back
    # beyond the reserve as well: an immediate 503 without reading the request
    reserve_held = [_busy(port), _busy(port)]
    assert wait_for(lambda: len(server.connections()) == 4, 2.0)
    conn = Conn(port)
    status, headers, body = conn.response()
    assert status == 503 and json.loads(body)["error"]["code"] == "SERVER_BUSY"
    for c in held + reserve_held:
        c.close()
    assert wait_for(lambda: not server.connections(), 3.0)
    assert health_within(port, 2.0) < 1.0


def test_at_the_limit_idle_keep_alive_connections_make_room(serve: Serve) -> None:
    server = serve(DemoApp(), max_connections=2)
    port = server.server_port
    idle = [Conn(port), Conn(port)]
    for conn in idle:
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
    assert wait_for(lambda: [c.state for c in server.connections()] == ["idle", "idle"], 2.0)
    fresh = Conn(port)
    fresh.request("POST", "/echo", b"abc")
    status, _, body = fresh.response()
    assert status == 200 and json.loads(body)["length"] == 3
    assert idle[0].closed_by_server(within=2.0)  # the oldest idle one was closed
    idle[1].request("GET", "/health")
    assert idle[1].response()[0] == 200


def test_a_burst_of_a_thousand_connects_is_not_reset(serve: Serve) -> None:
    server = serve(DemoApp(), max_connections=1024)
    port = server.server_port
    socks: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    try:
        for _ in range(1000):  # all at once: non-blocking connects, then wait for them
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        pending = set(socks)
        deadline = time.monotonic() + 20
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                selector.unregister(sock)
                pending.discard(sock)
        assert not pending, f"{len(pending)} connects did not complete"
        # none had to retry its SYN: the backlog took them all (a backlog of 128 makes hundreds retry)
        if hasattr(socket, "TCP_INFO"):
            retransmits = sum(
                struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 100)[0]
                for sock in socks
            )
            assert retransmits == 0
        # under the flood, /health answers promptly
        assert health_within(port, 5.0) < 2.0
        # and every one of the thousand is a live connection that the server answers
        for sock in socks:
            sock.setblocking(True)
            sock.settimeout(20)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answered = 0
        for sock in socks:
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            answered += data.startswith(b"HTTP/1.1 200")
        assert answered == 1000
    finally:
        selector.close()
        for sock in socks:
            sock.close()


# ---------------------------------------------------------------------- shutdown API


def test_shutdown_api(serve: Serve) -> None:
    app = DemoApp()
    server = serve(app)
    port = server.server_port
    idle = Conn(port)
    idle.request("GET", "/health")
    assert idle.response()[0] == 200
    stream = Conn(port)
    stream.request("GET", "/stream")
    assert stream.sock.recv(100).startswith(b"HTTP/1.1 200")
    assert wait_for(lambda: sorted(c.state for c in server.connections()) == ["active", "idle"], 2.0)

    server.stop_accepting()
    with pytest.raises(ConnectionRefusedError):
        Conn(port, timeout=2.0)
    assert idle.closed_by_server(within=2.0)  # idle keep-alive connections close at once
    assert not server.wait_idle(0.3)  # the stream is still open
    assert [c.state for c in server.connections()] == ["active"]
    assert stream.sock.recv(100)  # and still flowing

    server.close_all()
    assert app.closed.wait(5), "the WSGI iterable was not closed"
    assert server.wait_idle(5)
    assert stream.closed_by_server(within=2.0)


# ---------------------------------------------------------------------- the real adapter


@pytest.fixture
def adapter_on(tmp_path: Path, scripted_kernel: Any) -> Iterator[Callable[..., WSGIServer]]:
    """The real adapter app on the built-in server, with the given server limits."""
    servers: list[WSGIServer] = []

    def start(heartbeat_seconds: float = 15.0, **limits: Any) -> WSGIServer:
        (tmp_path / "ws").mkdir(exist_ok=True)
        settings = replace(Settings(), state_dir=str(tmp_path / "state"), allowed_cwds=str(tmp_path))
        settings = replace(settings, heartbeat_seconds=heartbeat_seconds)
        app = build_app(settings, KernelProcess(scripted_kernel.url, scripted_kernel.token, "scripted"))
        server = WSGIServer("127.0.0.1", 0, app, ServerLimits(**limits))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _run_body(text: str, cwd: Path, thread_id: str | None = None) -> bytes:
    return json.dumps(
        {
            "threadId": thread_id or f"thread-{uuid.uuid4().hex[:12]}",
            "runId": f"run-{uuid.uuid4().hex[:12]}",
            "state": {},
            "messages": [{"id": "m1", "role": "user", "content": text}],
            "tools": [],
            "context": [],
            "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": str(cwd)}},
        }
    ).encode()


SSE = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def test_adapter_answers_health_errors_and_cancel_on_one_connection(adapter_on: Any, tmp_path: Path) -> None:
    server = adapter_on()
    conn = Conn(server.server_port)
    cancel = "/extensions/iac-code/v1/executions/nope/cancel"
    for _ in range(5):
        conn.request("GET", "/health")
        status, _, body = conn.response()
        assert status == 200 and json.loads(body)["protocol"] == "ag-ui"
        conn.request("POST", "/", b"{not json", SSE)
        status, headers, body = conn.response()
        assert status == 400 and json.loads(body)["error"]["code"] == "INVALID_JSON"
        assert headers.get("connection") != "close"
        conn.request("POST", "/", _run_body("hi", tmp_path / "ws"), {"Content-Type": "text/plain"})
        assert conn.response()[0] == 415
        conn.request("POST", cancel, b'{"threadId": "t", "rosInvocationId": "r"}', SSE)
        status, _, body = conn.response()
        assert status == 404 and json.loads(body)["error"]["code"] == "EXECUTION_NOT_FOUND"
        conn.request("HEAD", "/health")
        assert conn.response(head=True)[0] == 200
    # a whole run on the same connection, then the connection is still usable
    conn.request("POST", "/", _run_body("hello", tmp_path / "ws"), SSE)
    status, headers, body = conn.response()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert b'"RUN_FINISHED"' in body
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    assert [c.requests for c in server.connections()] == [27]
    conn.close()


def test_adapter_post_without_length_is_answered_at_once(adapter_on: Any) -> None:
    server = adapter_on()
    conn = Conn(server.server_port, timeout=3.0)
    started = time.monotonic()
    conn.send(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n\r\n")
    status, _, body = conn.response()
    assert status == 400 and json.loads(body)["error"]["code"] == "INVALID_JSON"
    assert time.monotonic() - started < 1.5


def _task_cancelled(kernel: Any, task_id: str) -> bool:
    return any(r["method"] == "CancelTask" and r["params"].get("id") == task_id for r in list(kernel.requests))


def test_adapter_client_that_stops_reading_has_its_kernel_task_cancelled(
    adapter_on: Any, scripted_kernel: Any, tmp_path: Path
) -> None:
    server = adapter_on(send_timeout=1.0)
    conn = Conn(server.server_port, timeout=20, rcvbuf=4096)
    body = _run_body("[FAST 5000000]", tmp_path / "ws")
    conn.request("POST", "/", body, SSE)
    data = b""
    while b"iac-code.session.v1" not in data or b'"taskId":"' not in data.split(b"iac-code.session.v1")[1]:
        chunk = conn.sock.recv(4096)
        assert chunk, data
        data += chunk
    stopped_reading = time.monotonic()  # from here on the client reads nothing
    task_id = data.split(b"iac-code.session.v1")[1].split(b'"taskId":"')[1].split(b'"')[0].decode()
    assert wait_for(lambda: _task_cancelled(scripted_kernel, task_id), 30.0), "no CancelTask"
    assert time.monotonic() - stopped_reading >= 0.9  # only once no write made progress for 1 s
    assert wait_for(lambda: not server.connections(), 5.0)
    conn.close()
    # the conversation thread is free again
    thread_id = json.loads(body)["threadId"]
    nxt = Conn(server.server_port)
    nxt.request("POST", "/", _run_body("hello", tmp_path / "ws", thread_id=thread_id), SSE)
    status, _, raw = nxt.response()
    assert status == 200 and b'"RUN_FINISHED"' in raw
    nxt.close()


def test_cancel_frees_the_thread_of_a_client_that_stopped_reading_at_once(
    adapter_on: Any, scripted_kernel: Any, tmp_path: Path
) -> None:
    server = adapter_on()  # the default send timeout (60 s) is not what frees it
    conn = Conn(server.server_port, timeout=20, rcvbuf=4096)
    body = _run_body("[FAST 5000000]", tmp_path / "ws")
    conn.request("POST", "/", body, SSE)
    data = b""
    while b"iac-code.session.v1" not in data or b'"taskId":"' not in data.split(b"iac-code.session.v1")[1]:
        chunk = conn.sock.recv(4096)
        assert chunk, data
        data += chunk
    session = data.split(b"iac-code.session.v1")[1]
    task_id = session.split(b'"taskId":"')[1].split(b'"')[0].decode()
    execution_id = session.split(b'"executionId":"')[1].split(b'"')[0].decode()
    # the client reads nothing more: data backs up on both sides and the writer blocks on a full socket
    client_port = conn.sock.getsockname()[1]
    assert wait_for(lambda: _backed_up(server.server_port, client_port), 30)
    thread_id = json.loads(body)["threadId"]
    cancel = Conn(server.server_port)
    cancel_body = json.dumps({"threadId": thread_id, "rosInvocationId": "inv-1"}).encode()
    path = f"/extensions/iac-code/v1/executions/{execution_id}/cancel"
    cancel.request("POST", path, cancel_body, {"Content-Type": "application/json"})
    status, _, raw = cancel.response()
    assert status == 200 and json.loads(raw)["status"] == "cancelled"
    assert _task_cancelled(scripted_kernel, task_id)
    nxt = Conn(server.server_port)
    nxt.request("POST", "/", _run_body("hello", tmp_path / "ws", thread_id=thread_id), SSE)
    status, _, raw = nxt.response()
    assert status == 200 and b'"RUN_FINISHED"' in raw  # not 409 THREAD_BUSY
    for c in (conn, cancel, nxt):
        c.close()


def test_adapter_disconnect_is_still_noticed_through_heartbeats(
    adapter_on: Any, scripted_kernel: Any, tmp_path: Path
) -> None:
    server = adapter_on(heartbeat_seconds=0.2)
    conn = Conn(server.server_port)
    conn.request("POST", "/", _run_body("[SILENT 100] [SLOW]", tmp_path / "ws"), SSE)
    data = b""
    while b"iac-code.session.v1" not in data or b'"taskId":"' not in data.split(b"iac-code.session.v1")[1]:
        chunk = conn.sock.recv(65536)
        assert chunk, data
        data += chunk
    conn.close()
    task_id = data.split(b"iac-code.session.v1")[1].split(b'"taskId":"')[1].split(b'"')[0].decode()
    assert wait_for(lambda: _task_cancelled(scripted_kernel, task_id), 5.0), "no CancelTask after the disconnect"


def test_expect_100_continue_is_answered_when_the_body_is_read(serve: Serve) -> None:
    server = serve(DemoApp())
    conn = Conn(server.server_port)
    conn.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
    assert conn.response()[0] == 100
    conn.send(b"abc")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body)["length"] == 3
    # refused without reading: no 100, and the connection closes (the body may or may not come)
    conn.send(b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
    status, headers, _ = conn.response()
    assert status == 415 and headers["connection"] == "close"
    conn.close()


# ---------------------------------------------------------------------- settings


def test_server_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    from agui_adapter.cli import parse_args, server_limits
    from agui_adapter.config import ConfigError, load_settings

    defaults = server_limits(load_settings({}, env={}))
    assert (defaults.keepalive_timeout, defaults.request_timeout, defaults.send_timeout) == (5.0, 30.0, 60.0)
    assert defaults.max_connections == 1024 and defaults.backlog >= 1024
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nkeepalive-timeout-seconds = 7\nmax_connections = 10\n")
    env = {"IAC_CODE_AGUI_REQUEST_TIMEOUT_SECONDS": "12", "IAC_CODE_AGUI_SEND_TIMEOUT_SECONDS": "9"}
    flags = vars(parse_args(["--max-connections", "20", "--send-timeout-seconds", "3"]))
    limits = server_limits(load_settings(flags, env=env, config_path=str(conf)))
    assert (limits.keepalive_timeout, limits.request_timeout, limits.send_timeout) == (7.0, 12.0, 3.0)
    assert limits.max_connections == 20
    env = {"IAC_CODE_AGUI_MAX_CONNECTIONS": "25", "IAC_CODE_AGUI_KEEPALIVE_TIMEOUT_SECONDS": "0.5"}
    limits = server_limits(load_settings({}, env=env))
    assert limits.max_connections == 25 and limits.keepalive_timeout == 0.5
    for name, value in [
        ("max_connections", "0"),
        ("max_connections", "many"),
        ("keepalive_timeout_seconds", "0"),
        ("request_timeout_seconds", "-1"),
        ("send_timeout_seconds", "nan"),
    ]:
        with pytest.raises(ConfigError, match=name):
            load_settings({name: value}, env={})


def test_a_response_header_with_a_line_break_is_never_sent(serve: Serve) -> None:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("X-Evil", "a\r\nSet-Cookie: x=1"), ("Content-Length", "2")])
        return [b"{}"]

    server = serve(app)
    conn = Conn(server.server_port)
    conn.request("GET", "/")
    status, headers, _ = conn.response()
    assert status == 500 and "set-cookie" not in headers


def test_adapter_slow_body_gets_408_while_health_answers(adapter_on: Any, tmp_path: Path) -> None:
    server = adapter_on(request_timeout=1.0)
    conn = Conn(server.server_port)
    body = _run_body("hello", tmp_path / "ws")
    conn.send(
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(conn, body, 0.05, stop), daemon=True)
    trickler.start()
    try:
        assert health_within(server.server_port, 2.0) < 1.0
        status, headers, raw = conn.response()
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(raw)["error"]["code"] == "REQUEST_TIMEOUT"
    finally:
        stop.set()
        trickler.join(5)


def test_each_chunk_is_written_when_it_is_yielded(serve: Serve) -> None:
    received = threading.Event()
    nodelay: list[int] = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        for i in range(3):
            yield b"data: %d\n\n" % i
            # the next chunk is produced only once the client has this one: no buffering
            assert received.wait(5), "the chunk was not sent at once"
            received.clear()

    server = serve(app)
    conn = Conn(server.server_port)
    conn.request("GET", "/")
    assert wait_for(lambda: bool(server._connections), 2.0)
    for c in list(server._connections.values()):
        nodelay.append(c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    assert nodelay and all(nodelay)
    assert conn._line().startswith(b"HTTP/1.1 200")
    while conn._line():
        pass
    for i in range(3):
        size = int(conn._line(), 16)
        assert conn._exactly(size + 2) == b"data: %d\n\n\r\n" % i
        received.set()
    assert conn._line() == b"0"
    conn.close()


# ---------------------------------------------------------------------- the I/O thread


class InlineApp(DemoApp):
    """``DemoApp`` that answers ``/health``, ``/refuse``, ``/big`` and ``/fail-inline`` on the
    server's I/O thread (``answer_inline``) and declines the rest after reading the body,
    as the adapter declines a valid run; records which thread answered what."""

    BIG = b"x" * (4 * 1024 * 1024)

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[tuple[str, str]] = []  # (path, thread name)
        self.threaded: list[tuple[str, str]] = []

    def answer_inline(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ["PATH_INFO"]
        environ["wsgi.input"].read()  # declined or not, the body is read here first
        if path == "/big":
            self.inline.append((path, threading.current_thread().name))
            start_response("200 OK", [("Content-Length", str(len(self.BIG)))])
            return [self.BIG]
        if path == "/fail-inline":
            raise RuntimeError("boom")
        if path not in ("/health", "/refuse"):
            return None
        self.inline.append((path, threading.current_thread().name))
        return self(environ, start_response)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["PATH_INFO"] not in ("/health", "/refuse"):
            self.threaded.append((environ["PATH_INFO"], threading.current_thread().name))
        return super().__call__(environ, start_response)


@pytest.fixture
def serve_named() -> Iterator[Serve]:
    """``serve`` with the accept loop on a thread named ``serve-<port>``."""

    def start(app: Any, **limits: Any) -> WSGIServer:
        server = WSGIServer("127.0.0.1", 0, app, ServerLimits(**limits))
        thread = threading.Thread(target=server.serve_forever, name=f"serve-{server.server_port}", daemon=True)
        thread.start()
        started.append(server)
        return server

    started: list[WSGIServer] = []
    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def test_quick_answers_come_from_the_io_thread_and_the_rest_from_a_worker(serve_named: Serve) -> None:
    app = InlineApp()
    server = serve_named(app)
    conn = Conn(server.server_port)
    for _ in range(20):
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
        conn.request("POST", "/refuse", b"{}")
        assert conn.response()[0] == 415
    # a declined request is served by a worker with its whole body, on the same connection
    conn.request("POST", "/echo", b"abcdef")
    status, _, body = conn.response()
    assert status == 200 and json.loads(body)["length"] == 6
    conn.request("GET", "/health")
    assert conn.response()[0] == 200
    io_thread = f"serve-{server.server_port}"
    assert len(app.inline) == 41 and {name for _, name in app.inline} == {io_thread}
    assert app.threaded and all(name != io_thread for _, name in app.threaded)
    assert [c.requests for c in server.connections()] == [42]
    conn.close()


class CarryingApp:
    """Declines every request on the I/O thread; for ``/carry`` it leaves a note there, as the
    adapter leaves a run's checks; records what each call found in the environ."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []  # (path, where, carry found)

    def answer_inline(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        body = environ["wsgi.input"].read()
        self.seen.append((environ["PATH_INFO"], "inline", environ.get(INLINE_CARRY_KEY)))
        if environ["PATH_INFO"] == "/carry":
            environ[INLINE_CARRY_KEY] = ("checked", body)
        return None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        body = environ["wsgi.input"].read()
        self.seen.append((environ["PATH_INFO"], "worker", environ.get(INLINE_CARRY_KEY)))
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]


def test_what_an_app_left_when_declining_reaches_the_same_request_on_its_worker_only(serve_named: Serve) -> None:
    app = CarryingApp()
    server = serve_named(app)
    conn = Conn(server.server_port)
    for path, body in (("/carry", b"abc"), ("/plain", b"xyz"), ("/carry", b"defg")):
        conn.request("POST", path, body)
        status, _, answer = conn.response()
        assert status == 200 and answer == body
    assert app.seen == [
        ("/carry", "inline", None),
        ("/carry", "worker", ("checked", b"abc")),
        ("/plain", "inline", None),  # taken by the request it was left for, never the next one
        ("/plain", "worker", None),
        ("/carry", "inline", None),
        ("/carry", "worker", ("checked", b"defg")),
    ]
    conn.close()


def test_requests_pipelined_behind_a_quick_answer_are_all_answered_in_order(serve_named: Serve) -> None:
    server = serve_named(InlineApp())
    conn = Conn(server.server_port)
    requests = b"".join(
        [
            b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc",
            b"POST /refuse HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nz",
        ]
    )
    conn.send(requests)
    answers = [conn.response() for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 415, 200]
    assert json.loads(answers[1][2])["length"] == 3 and json.loads(answers[3][2])["length"] == 1
    conn.close()


def test_a_quick_answer_too_big_for_the_socket_is_finished_by_a_worker(serve_named: Serve) -> None:
    app = InlineApp()
    server = serve_named(app)
    conn = Conn(server.server_port, rcvbuf=4096)
    conn.request("GET", "/big")
    # the client does not read yet: the I/O thread is not held, /health answers meanwhile
    assert health_within(server.server_port, 2.0) < 1.0
    status, _, body = conn.response()
    assert status == 200 and body == InlineApp.BIG
    conn.request("GET", "/health")  # and the connection is kept
    assert conn.response()[0] == 200
    conn.close()


def test_a_failure_of_a_quick_answer_is_a_json_500_and_a_close(serve_named: Serve) -> None:
    server = serve_named(InlineApp())
    conn = Conn(server.server_port)
    conn.request("GET", "/fail-inline")
    status, headers, body = conn.response()
    assert status == 500 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "INTERNAL_ERROR"
    assert conn.closed_by_server(within=3.0)
    assert health_within(server.server_port, 2.0) < 1.0


def test_quick_answers_keep_the_keep_alive_timeout(serve_named: Serve) -> None:
    server = serve_named(InlineApp(), keepalive_timeout=0.5)
    conn = Conn(server.server_port)
    for _ in range(3):
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
        time.sleep(0.3)  # each request renews the 0.5 s: the connection stays (not a barrier)
    assert_closed_after_the_idle_timeout(conn, server)


def test_waiting_connections_hold_no_thread(serve: Serve) -> None:
    server = serve(InlineApp())
    before = threading.active_count()
    conns = [Conn(server.server_port) for _ in range(60)]
    for conn in conns[:30]:  # half of them made a request and wait for the next one
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
    assert wait_for(lambda: len(server.connections()) == 60, 5.0)
    assert threading.active_count() - before < 10
    for conn in conns:
        conn.close()
    assert wait_for(lambda: not server.connections(), 5.0)


def test_deadlines_of_quick_answers_do_not_pile_up(serve: Serve) -> None:
    server = serve(InlineApp(), keepalive_timeout=1e12)  # no deadline ever passes to clear them
    conn = Conn(server.server_port)
    for _ in range(500):
        conn.request("GET", "/health")
        assert conn.response()[0] == 200
    assert len(server._deadlines) < 100  # one current deadline per waiting connection, plus a bounded rest
    conn.close()


# ---------------------------------------------------------------------- a response watched for a hang-up


class WatchingApp(DemoApp):
    """/watch: takes the server's offer to tell of a hang-up (``CLIENT_WATCH_KEY``), writes one
    chunk, then writes nothing until told or released; what the server said is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[bool] = []
        self.words: list[tuple[bool, str]] = []
        self.wake = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["PATH_INFO"] != "/watch":
            return super().__call__(environ, start_response)
        watch = environ.get(CLIENT_WATCH_KEY)
        self.offered.append(bool(watch is not None and watch(self._word)))
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        return self._quiet_stream()

    def _word(self, gone: bool) -> None:
        self.words.append((gone, threading.current_thread().name))
        self.wake.set()

    def _quiet_stream(self) -> Iterator[bytes]:
        yield b"data: start\n\n"
        self.wake.wait(30)


def _watched(port: int) -> Conn:
    conn = Conn(port)
    conn.request("GET", "/watch")
    while b"data: start" not in conn.buf:
        assert conn._fill()
    return conn


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_watched_response_is_told_at_once_when_its_client_hangs_up(serve: Serve, how: str) -> None:
    app = WatchingApp()
    server = serve(app)
    conn = _watched(server.server_port)
    assert app.offered == [True]
    if how == "reset":
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    left = time.monotonic()
    conn.close()
    assert app.wake.wait(10), "the server never said the client hung up"
    told = time.monotonic() - left
    gone, thread = app.words[0]
    assert gone is True and len(app.words) == 1
    assert "serve_forever" in thread  # the I/O thread said it, not a worker asking
    assert wait_for(lambda: server.open_connections() == 0, 10)
    assert not server._watches
    print(f"\n[{how}] told {told * 1000:.1f} ms after the hang-up")


def test_bytes_pipelined_behind_a_watched_response_end_the_watch_without_a_hang_up(serve: Serve) -> None:
    app = WatchingApp()
    server = serve(app)
    conn = _watched(server.server_port)
    conn.request("GET", "/health")  # the next request, in the socket while the stream lasts
    assert app.wake.wait(10)
    assert [gone for gone, _ in app.words] == [False]  # not a hang-up: the app asks on its own now
    assert conn.response()[0] == 200  # the stream ended when woken...
    status, _, body = conn.response()  # ...and the pipelined request is served after it
    assert status == 200 and json.loads(body) == {"status": "ok"}
    conn.close()


def test_a_watch_ends_with_its_response_and_the_connection_is_kept(serve: Serve) -> None:
    app = WatchingApp()
    server = serve(app)
    conn = _watched(server.server_port)
    app.wake.set()  # the response ends by itself
    assert conn.response()[0] == 200
    assert wait_for(lambda: not server._watches, 10)
    conn.request("GET", "/health")  # the connection went back to waiting, and serves again
    status, _, body = conn.response()
    assert status == 200 and json.loads(body) == {"status": "ok"}
    conn.close()
    assert wait_for(lambda: server.open_connections() == 0, 10)
    assert app.words == []  # a hang-up after the response is nobody's news


def test_watched_responses_are_told_the_watch_lapsed_when_the_server_loop_ends(serve: Serve) -> None:
    app = WatchingApp()
    server = serve(app)
    conn = _watched(server.server_port)
    server.stop_accepting()  # the loop ends once no connection waits on it; the stream goes on
    assert app.wake.wait(10)
    assert [gone for gone, _ in app.words] == [False]
    conn.close()
