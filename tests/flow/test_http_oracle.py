"""h11 as the oracle of the built-in server's parser (issue 19), the way jsonschema checks fastschema.

Every request of a corpus of the test's own (framing, header syntax, smuggling vectors,
pipelining, HTTP/1.0, ``Expect: 100-continue``, huge heads) and of hypothesis-generated
heads is sent over a real socket to the built-in server (``agui_adapter.http.server``) around a
recording WSGI application, and the same bytes are fed to ``h11.Connection(h11.SERVER)``.
What the server accepted (each request's method, target and body length, in order) must be
what h11 accepted from the same bytes, request for request; when the server accepts fewer
requests than h11, it must have refused the next one itself (a 4xx or 5xx of its own):
stricter than h11 is fine, more lenient is not. Any disagreement fails the test.

The oracle allows exactly two things h11 does not do, both RFC 9112's: empty lines (CRLF or
LF) before a request line are skipped (section 2.2, "SHOULD ignore at least one empty
line"), and an HTTP/1.0 request with ``Connection: keep-alive`` keeps the connection
(appendix C.2.2; h11 closes every HTTP/1.0 connection). For each request of a connection
the oracle takes a fresh ``h11.Connection`` fed what the previous one left unread.

The default suite sends the corpus and a few hundred generated heads (a few seconds);
``-m soak`` sends thousands more.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_adapter.http.server import ServerLimits, WSGIServer
from tests.support.mutation import mutate

Seen = tuple[str, str, int]
"""A request as accepted: method, target, body length."""

LIMITS = ServerLimits(request_timeout=10.0, keepalive_timeout=5.0, linger_seconds=0.5)
EXCHANGE_DEADLINE = 20.0
_EMPTY_LINES = re.compile(rb"(?:\r?\n)*")
_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


# ---------------------------------------------------------------------- the server under test
class Recorder:
    """A WSGI application that reads every body and records each request by client port."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, list[Seen]] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = environ["wsgi.input"].read()  # a framing error raises: the server answers it
        with self.lock:
            self.seen.setdefault(environ["REMOTE_PORT"], []).append(
                (environ["REQUEST_METHOD"], environ["RAW_URI"], len(body))
            )
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    def take(self, port: int) -> list[Seen]:
        with self.lock:
            return self.seen.pop(str(port), [])


@pytest.fixture(scope="module")
def oracle_server() -> Iterator[tuple[WSGIServer, Recorder]]:
    recorder = Recorder()
    server = WSGIServer("127.0.0.1", 0, recorder, LIMITS)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, recorder
    server.shutdown()
    server.server_close()


def exchange(port: int, data: bytes) -> tuple[int, bytes]:
    """Send ``data``, half-close, read until the server closes; the client port and the answer."""
    deadline = time.monotonic() + EXCHANGE_DEADLINE
    with socket.create_connection(("127.0.0.1", port), timeout=EXCHANGE_DEADLINE) as sock:
        local = sock.getsockname()[1]
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server refused and closed before reading everything
        answer = b""
        while True:
            assert time.monotonic() < deadline, "the server did not close in time"
            try:
                piece = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            answer += piece
    return local, answer


# ---------------------------------------------------------------------- the oracle
def h11_accepts(data: bytes) -> list[Seen]:
    """The requests h11 reads from ``data`` (then EOF), in order, up to the first it refuses."""
    accepted: list[Seen] = []
    rest = data
    while True:
        rest = rest[_EMPTY_LINES.match(rest).end() :]  # type: ignore[union-attr]
        if not rest:
            return accepted
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=LIMITS.max_header_bytes)
        conn.receive_data(rest)
        conn.receive_data(b"")
        try:
            event = conn.next_event()
            if not isinstance(event, h11.Request):
                return accepted
            length = 0
            while True:
                part = conn.next_event()
                if isinstance(part, h11.Data):
                    length += len(part.data)
                elif isinstance(part, h11.EndOfMessage):
                    break
                else:  # NEED_DATA or ConnectionClosed: the body never ended
                    return accepted
        except h11.ProtocolError:
            return accepted
        accepted.append((event.method.decode("latin-1"), event.target.decode("latin-1"), length))
        connection = [
            item.strip(b" \t").lower()
            for name, value in event.headers
            if name == b"connection"
            for item in value.split(b",")
        ]
        if b"close" in connection or (event.http_version == b"1.0" and b"keep-alive" not in connection):
            return accepted
        rest = conn.trailing_data[0]


def check(port: int, recorder: Recorder, data: bytes) -> str:
    """Send ``data`` to the server and to h11; fail on any disagreement. What happened:
    ``same`` (both accepted the same requests) or ``stricter`` (the server refused one h11 took)."""
    local, answer = exchange(port, data)
    server = recorder.take(local)
    oracle = h11_accepts(data)
    context = f"request {data[:300]!r}, answer {answer[:300]!r}"
    assert server == oracle[: len(server)], f"the server accepted what h11 did not: {server} vs {oracle}; {context}"
    if len(server) == len(oracle):
        return "same"
    statuses = [int(s) for s in _STATUS.findall(answer) if not s.startswith(b"1")]
    assert len(statuses) > len(server) and statuses[len(server)] >= 400, (
        f"the server stopped after {len(server)} requests without refusing the next; {context}"
    )
    return "stricter"


def test_the_oracle_can_fail(oracle_server: tuple[WSGIServer, Recorder]) -> None:
    """h11 refuses what the oracle is for, and ``check`` notices a server more lenient than h11."""
    assert h11_accepts(b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x0bb\r\n\r\n") == []
    assert h11_accepts(b"GET / HTTP/1.1\r\n\r\n") == []
    assert h11_accepts(
        b"\r\nGET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\nGET /c HTTP/1.0\r\n\r\n"
    ) == [
        ("GET", "/a", 0),
        ("GET", "/b", 0),
    ]

    class Lenient(Recorder):
        def take(self, port: int) -> list[Seen]:
            return [*super().take(port), ("GET", "/", 0)]  # as if it had accepted one more

    server, recorder = oracle_server
    lenient = Lenient()
    server.app = lenient
    try:
        with pytest.raises(AssertionError, match="accepted what h11 did not"):
            check(server.server_port, lenient, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    finally:
        server.app = recorder


# ---------------------------------------------------------------------- the corpus
def _req(
    head_lines: list[bytes],
    body: bytes = b"",
    line: bytes = b"POST / HTTP/1.1",
    end: bytes = b"\r\n",
) -> bytes:
    return end.join([line, *head_lines]) + end + end + body


def _chunked(*pieces: bytes, ext: bytes = b"", trailers: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in pieces) + b"0\r\n" + trailers + b"\r\n"


HOST = b"Host: oracle"
CONTROL = [bytes([b]) for b in (*range(0x00, 0x20), 0x7F)]
OTHER = [b"\x80", b"\xa0", b"\xc2\xa0", b"\xff", b"\xe2\x80\xa8", b"\xc2\x85"]
CL_VALUES = [
    b"5", b"05", b"00005", b" 5", b"5 ", b"\t5\t", b"+5", b"-5", b"5\xa0", b"\xa05", b"\x0b5", b"5\x0c",
    b"5\x00", b"5,5", b"5, 5", b"5,6", b"5,", b",5", b"0x5", b"5e0", b"5.0", b"", b" ", b"1" * 19, b"1" * 18,
    b"\xb2", b"\xd9\xa5", b"4 4", b"5;x", b"5\x1c", b"5\x85",
]  # fmt: skip
TE_VALUES = [
    b"chunked", b"Chunked", b"CHUNKED", b" chunked", b"chunked ", b"\tchunked", b"\x0bchunked", b"\x0cchunked",
    b"chunked\x0b", b"\x1cchunked", b"\x85chunked", b"\xa0chunked", b"chunked\xa0", b"chunked, ", b", chunked",
    b"chunked,,", b"gzip, chunked", b"chunked, gzip", b"identity", b"identity, chunked", b"chunked;q=1",
    b"xchunked", b"chunke", b"chunked, chunked", b"", b"\"chunked\"", b"chunked\x00", b"chunk\xe9d",
]  # fmt: skip
CHUNKED_BODIES = [
    _chunked(b"hello"),
    _chunked(b"hello", b"world"),
    _chunked(b"hello", ext=b";a=b"),
    _chunked(b"hello", ext=b';a="q;d"'),
    _chunked(b"hello", ext=b";"),
    _chunked(b"hello", trailers=b"X-T: 1\r\n"),
    _chunked(b"hello", trailers=b"X-T: caf\xe9\r\n"),
    b"5 \r\nhello\r\n0\r\n\r\n",  # trailing whitespace after the size (h11 takes it)
    b"5\t\r\nhello\r\n0\r\n\r\n",
    b"A\r\n0123456789\r\n0\r\n\r\n",
    b"0000005\r\nhello\r\n0\r\n\r\n",
    b"5\nhello\r\n0\r\n\r\n",  # bare LF after the size
    b" 5\r\nhello\r\n0\r\n\r\n",  # leading whitespace
    b"\t5\r\nhello\r\n0\r\n\r\n",
    b"\x0b5\r\nhello\r\n0\r\n\r\n",
    b"5\r\nhello\n0\r\n\r\n",  # bare LF after the data
    b"5\r\nhelloXX0\r\n\r\n",
    b"5\r\nhello\r\n0\n\n",  # bare LF after the last chunk
    b"5\r\nhello\r\n0\r\n\n",
    b"5\r\r\nhello\r\n0\r\n\r\n",
    b"5 ;a\r\nhello\r\n0\r\n\r\n",
    b"5;a\rb\r\nhello\r\n0\r\n\r\n",
    b"5;\x00\r\nhello\r\n0\r\n\r\n",
    b"0x5\r\nhello\r\n0\r\n\r\n",
    b"-5\r\nhello\r\n0\r\n\r\n",
    b"+5\r\nhello\r\n0\r\n\r\n",
    b"5_0\r\nhello\r\n0\r\n\r\n",
    b"g\r\nhello\r\n0\r\n\r\n",
    b"f" * 16 + b"\r\nhello\r\n0\r\n\r\n",
    b"\r\nhello\r\n0\r\n\r\n",
    b"5\r\nhello\r\n0\r\nX-T: a\x0bb\r\n\r\n",
    b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
    b"5\r\nhello\r\n0\r\nBad Name: 1\r\n\r\n",
    b"5\r\nhello\r\n0\r\n folded\r\n\r\n",
    b"5\r\nhello\r\n0\r\nX-T: 1\r\n folded\r\n\r\n",
    b"5\r\nhello\r\n",  # never ends
    b"5\r\nhel",
    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
]
HOST_LINES = [
    [], [HOST, HOST], [HOST, b"host: other"], [b"Host:"], [b"Host: "], [b"Host: a b"], [b"Host: a/b"],
    [b"Host: a@b"], [b"Host: a:b"], [b"Host: a:80"], [b"Host: [::1]"], [b"Host: [::1]:8080"], [b"Host: 127.0.0.1:1"],
    [b"Host: \xe9.example"], [b"Host: a\x0bb"], [b"Host: xn--e-ega.example"], [b"HOST: a"], [b"Host : a"],
    [b" Host: a"], [b"Host: a", b" b"],
]  # fmt: skip
TARGETS = [
    b"/", b"/a?b=c", b"/%20", b"*", b"http://oracle/x", b"HTTP://oracle", b"https://oracle:1/x?y", b"oracle:80",
    b"//", b"/a#frag", b"/\x0b", b"/\x7f", b"/\x00", b"/\xe9", b"/\xc3\xa9", b"/a\tb", b"?", b"a", b"/" + b"a" * 8000,
    b"/" + b"a" * 8300, b"/a/../b", b"/%", b"/\x1b[31m",
]  # fmt: skip
ODD_LINES = [
    b"X-V:a", b"X-V:  a  ", b"X-V:\ta\t", b"X-V:", b"X-V: a, b", b": a", b"X V: a", b"X-V a", b"X-V::a", b"(X): a",
    b"X-V\t: a", b"X-V: a\r", b" X-V: a", b"X-V: a\r\n b", b"X-V: a\r\n\tb", b"\x7fX: a",
]  # fmt: skip
REQUEST_LINES = [
    b"GET / HTTP/1.1", b"get / HTTP/1.1", b"GET  / HTTP/1.1", b"GET /  HTTP/1.1", b"GET / HTTP/1.1 ",
    b" GET / HTTP/1.1", b"GET\t/\tHTTP/1.1", b"GET / http/1.1", b"GET / HTTP/1.2", b"GET / HTTP/2.0",
    b"GET / HTTP/1", b"GET / HTTP/1.10",
    b"GET /", b"GET / HTTP/1.1\x00", b"G\x00T / HTTP/1.1", b"G(T / HTTP/1.1", b"X-CUSTOM / HTTP/1.1", b"PRI * HTTP/2.0",
    b"GET / HTTP/1.0", b"\x16\x03\x01\x02\x00",
]  # fmt: skip


def corpus() -> list[bytes]:
    requests: list[bytes] = []
    # header syntax: every control byte, and obs-text, in a value and in a name
    for byte in CONTROL + OTHER:
        requests.append(_req([HOST, b"X-V: a" + byte + b"b"], line=b"GET / HTTP/1.1"))
        requests.append(_req([HOST, b"X-V: " + byte + b"ab"], line=b"GET / HTTP/1.1"))
        requests.append(_req([HOST, b"X" + byte + b"V: ab"], line=b"GET / HTTP/1.1"))
    for line in ODD_LINES:
        requests.append(_req([HOST, line], line=b"GET / HTTP/1.1"))
    # the Host rules, on both versions
    for hosts in HOST_LINES:
        requests.append(_req(hosts, line=b"GET / HTTP/1.1"))
        requests.append(_req(hosts, line=b"GET / HTTP/1.0"))
    # request lines and targets
    for line in REQUEST_LINES:
        requests.append(_req([HOST], line=line))
    for target in TARGETS:
        requests.append(_req([HOST], line=b"GET " + target + b" HTTP/1.1"))
    requests.append(_req([HOST], line=b"OPTIONS * HTTP/1.1"))
    requests.append(_req([HOST], line=b"CONNECT oracle:443 HTTP/1.1"))
    # line ends
    requests.append(_req([HOST, b"X-V: a"], line=b"GET / HTTP/1.1", end=b"\n"))
    requests.append(b"GET / HTTP/1.1\nHost: a\r\nX: y\n\r\n")
    requests.append(b"GET / HTTP/1.1\rHost: a\r\n\r\n")
    requests.append(b"GET / HTTP/1.1\r\nHost: a\r\r\n\r\n")
    requests.append(b"GET / HTTP/1.1\r\nHost: a\r\n\r\r\n")
    requests.append(b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
    requests.append(b"\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
    requests.append(b"\r\rGET / HTTP/1.1\r\nHost: a\r\n\r\n")
    requests.append(b"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n")
    requests.append(b" \r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
    # Content-Length: every odd form, alone and repeated
    for value in CL_VALUES:
        requests.append(_req([HOST, b"Content-Length: " + value], b"hello"))
    for first, second in ((b"5", b"5"), (b"5", b"6"), (b"5", b"05"), (b"5", b" 5"), (b"5", b""), (b"5, 5", b"5")):
        requests.append(_req([HOST, b"Content-Length: " + first, b"Content-Length: " + second], b"hello"))
    # Transfer-Encoding: every odd form, with a well-formed chunked body
    for value in TE_VALUES:
        requests.append(_req([HOST, b"Transfer-Encoding: " + value], _chunked(b"hello")))
        requests.append(_req([HOST, b"Transfer-Encoding: " + value], _chunked(b"hello"), line=b"POST / HTTP/1.0"))
    requests.append(_req([HOST, b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"], _chunked(b"hello")))
    requests.append(_req([HOST, b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked"], _chunked(b"hello")))
    requests.append(_req([HOST, b"Transfer-Encoding: chunked", b"Transfer-Encoding: "], _chunked(b"hello")))
    # chunked bodies, well and badly framed
    for body in CHUNKED_BODIES:
        requests.append(_req([HOST, b"Transfer-Encoding: chunked"], body))
    # smuggling: both framings at once, in both orders, and a body that looks like a request
    inner = b"GET /smuggled HTTP/1.1\r\nHost: oracle\r\n\r\n"
    for te in (b"chunked", b" chunked", b"\x0bchunked", b"chunked\xa0", b"Chunked", b"chunked, identity"):
        body = b"0\r\n\r\n" + inner
        requests.append(_req([HOST, b"Content-Length: %d" % len(body), b"Transfer-Encoding: " + te], body))
        requests.append(_req([HOST, b"Transfer-Encoding: " + te, b"Content-Length: %d" % len(body)], body))
        requests.append(_req([HOST, b"Transfer-Encoding: " + te], body))
    small = b"5\r\nhello\r\n0\r\n\r\n"
    requests.append(_req([HOST, b"Content-Length: 4", b"Transfer-Encoding: chunked"], small + inner))
    requests.append(_req([HOST, b"Content-Length: %d" % len(inner)], inner))
    requests.append(_req([HOST, b"Content-Length: 0"], inner))
    requests.append(_req([HOST, b"Content-Length: 0\r\n"], inner))
    requests.append(_req([HOST, b"Content-Length:\x0b0"], inner))
    requests.append(_req([HOST, b"Content-Length: 0", b"Content-Length: %d" % len(inner)], inner))
    requests.append(_req([HOST, b"Transfer-Encoding: chunked"], b"0\n\r\n" + inner))
    requests.append(_req([HOST, b"Transfer-Encoding: chunked"], b"1\r\nZ\r\n0\r\n\r\n" + inner))
    # pipelining and keep-alive
    get = b"GET /p HTTP/1.1\r\nHost: oracle\r\n\r\n"
    post = b"POST /q HTTP/1.1\r\nHost: oracle\r\nContent-Length: 3\r\n\r\nabc"
    chunked_post = b"POST /r HTTP/1.1\r\nHost: oracle\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(b"ab", b"c")
    close = b"GET /close HTTP/1.1\r\nHost: oracle\r\nConnection: close\r\n\r\n"
    http10 = b"GET /ten HTTP/1.0\r\n\r\n"
    http10_keep = b"GET /ten-keep HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    bad = b"GET /bad HTTP/1.1\r\nHost: oracle\r\nX: a\x0bb\r\n\r\n"
    for sequence in (
        [get, get], [get, post, get], [post, chunked_post, post], [chunked_post] * 3, [get, close, get],
        [close, post], [http10, get], [http10_keep, get], [http10_keep, http10_keep, http10], [get, bad, get],
        [bad, get], [post, b"\r\n", get], [chunked_post, b"\r\n\r\n", get], [post, b"\n", get], [get, b"\r", get],
        [get] * 20, [post[:-1], get], [get, get[:20]],
        [b"GET /c HTTP/1.1\r\nHost: oracle\r\nConnection: keep-alive, close\r\n\r\n", get],
        [b"GET /c HTTP/1.1\r\nHost: oracle\r\nConnection: Close\r\n\r\n", get],
        [b"GET /c HTTP/1.1\r\nHost: oracle\r\nConnection: \x0bclose\r\n\r\n", get],
        [b"GET /c HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", get],
        [b"GET /c HTTP/1.0\r\nConnection: keep-alive\r\nHost: a\r\n\r\n", http10_keep, get],
        [b"GET /c HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n", get],  # found by the soak
        [b"GET /c HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", get],
    ):  # fmt: skip
        requests.append(b"".join(sequence))
    # Expect: 100-continue
    for expect in (b"100-continue", b"100-Continue", b"100-continue, x", b"", b"\x0b100-continue"):
        requests.append(_req([HOST, b"Expect: " + expect, b"Content-Length: 5"], b"hello"))
        requests.append(_req([HOST, b"Expect: " + expect, b"Transfer-Encoding: chunked"], _chunked(b"hello")))
        requests.append(_req([HOST, b"Expect: " + expect], b"", line=b"POST / HTTP/1.0"))
    # huge heads: one header near and beyond the limit, many headers, a long request line
    limit = LIMITS.max_header_bytes
    for size in (1000, 16 * 1024, limit - 200, limit + 10, 2 * limit):
        requests.append(_req([HOST, b"X-Big: " + b"v" * size], line=b"GET / HTTP/1.1"))
    for count in (50, 99, 100, 101, 500):
        requests.append(_req([HOST] + [b"X-H%d: v" % i for i in range(count)], line=b"GET / HTTP/1.1"))
    requests.append(_req([HOST] + [b"Cookie: " + b"c" * 4000] * 15, line=b"GET / HTTP/1.1"))
    requests.append(b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
    requests.append(b"\r\n" * 5000 + get)
    return requests


CORPUS = corpus()


def test_the_corpus_is_a_few_hundred_requests() -> None:
    assert len(set(CORPUS)) >= 300


def test_the_server_accepts_nothing_h11_refuses(oracle_server: tuple[WSGIServer, Recorder]) -> None:
    server, recorder = oracle_server
    outcomes = {"same": 0, "stricter": 0}
    stricter: list[bytes] = []
    for data in CORPUS:
        outcome = check(server.server_port, recorder, data)
        outcomes[outcome] += 1
        if outcome == "stricter":
            stricter.append(data)
    # the corpus really exercises both sides: most requests agree, and some are refused
    # by the server where h11 is more lenient (control bytes h11 allows, obs-fold, ...)
    assert outcomes["same"] > len(CORPUS) // 2, outcomes
    print(f"corpus: {len(CORPUS)} raw requests; {outcomes}")
    for data in stricter:
        print("  stricter than h11:", data[:120])


# ---------------------------------------------------------------------- generated heads
INTERESTING = [
    b"\r",
    b"\n",
    b"\r\n",
    b"\x00",
    b"\x0b",
    b"\x0c",
    b"\t",
    b" ",
    b",",
    b";",
    b":",
    b"\xa0",
    b"\x85",
    b"\x1c",
]
FRAMING = [
    (b"Content-Length", b"5"), (b"Content-Length", b"5, 5"), (b"Content-Length", b"0"), (b"Content-Length", b"50"),
    (b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"CHUNKED"), (b"Transfer-Encoding", b"gzip, chunked"),
    (b"Connection", b"close"), (b"Connection", b"keep-alive"), (b"Expect", b"100-continue"), (b"Host", b"oracle"),
    (b"X-A", b"b c"), (b"Origin", b"https://a.example"),
]  # fmt: skip
BODIES = [b"", b"hello", _chunked(b"hello"), _chunked(b"he", b"llo", ext=b";x=y"), b"0\r\n\r\n", b"5\r\nhel"]


def _mutate(draw: st.DrawFn, wire: bytearray) -> bytes:
    """``wire`` with a few bytes inserted, replaced or deleted, odd ones mostly."""
    return mutate(draw, wire, st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=2), [0, 1, 1, 1, 2, 3])


@st.composite
def mutated_corpus(draw: st.DrawFn) -> bytes:
    """A request of the corpus (or two, pipelined) with a few bytes changed."""
    picked = draw(st.lists(st.sampled_from([r for r in CORPUS if len(r) < 4096]), min_size=1, max_size=2))
    return _mutate(draw, bytearray(b"".join(picked)))


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """One to three requests, mostly well formed, each with a few of its bytes changed to odd ones."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        method = draw(st.sampled_from([b"GET", b"POST", b"POST", b"HEAD", b"OPTIONS", b"PUT"]))
        target = draw(st.sampled_from([b"/", b"/x?y=z", b"*", b"http://h/p", b"/a%20b"]))
        version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]))
        lines = [b"%s %s %s" % (method, target, version)]
        if draw(st.integers(0, 9)):
            lines.append(b"Host: oracle")
        lines += [name + b": " + value for name, value in draw(st.lists(st.sampled_from(FRAMING), max_size=3))]
        out.append(_mutate(draw, bytearray(b"\r\n".join(lines) + b"\r\n\r\n" + draw(st.sampled_from(BODIES)))))
    return b"".join(out)


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SOAK = settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(data=heads())
def test_generated_heads_agree_with_h11(oracle_server: tuple[WSGIServer, Recorder], data: bytes) -> None:
    server, recorder = oracle_server
    check(server.server_port, recorder, data)


@pytest.mark.soak
@SOAK
@given(data=heads())
def test_generated_heads_agree_with_h11_soak(oracle_server: tuple[WSGIServer, Recorder], data: bytes) -> None:
    server, recorder = oracle_server
    check(server.server_port, recorder, data)


@FAST
@given(data=mutated_corpus())
def test_mutated_corpus_requests_agree_with_h11(oracle_server: tuple[WSGIServer, Recorder], data: bytes) -> None:
    server, recorder = oracle_server
    check(server.server_port, recorder, data)


@pytest.mark.soak
@SOAK
@given(data=mutated_corpus())
def test_mutated_corpus_requests_agree_with_h11_soak(oracle_server: tuple[WSGIServer, Recorder], data: bytes) -> None:
    server, recorder = oracle_server
    check(server.server_port, recorder, data)
