"""The kernel client's own HTTP/1.1 (``kernel_client.connections``), with h11 as its oracle.

The streaming calls to an ``http://`` kernel no longer go through ``http.client``: the
request is written by ``connections.encode_request`` and the answer read by
``KernelConnection.read_head``/``body`` with ``http.rules.parse_response_head``. h11 says
what those bytes mean, the way it does for the server's parser (``test_http_oracle``):

- every request written is one h11 (as a server) reads back as the same method, target,
  headers and body, and a header value that could break the head is refused;
- every answer (a corpus and hypothesis-generated ones, cut into reads anywhere) is read
  as h11 (as a client) reads it: the same status, headers, body and end; where they
  differ, ours refused it (stricter than h11 is fine, more lenient is not), and most of
  the corpus is read alike.
"""

from __future__ import annotations

import socket
import time

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_adapter.http.rules import Framing, ResponseError, parse_response_head
from agui_adapter.kernel_client import connections
from tests.support.mutation import mutate


class Reads:
    """A socket whose ``recv`` hands out ``pieces`` one by one, then the end (``b""``)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def recv(self, size: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > size:
            self.pieces.insert(0, piece[size:])
            piece = piece[:size]
        return piece

    def close(self) -> None:
        pass


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a] or [b""]


def ours(data: bytes, cuts: list[int] = ()) -> tuple:
    connection = connections.KernelConnection(Reads(_cut(data, list(cuts))))  # type: ignore[arg-type]
    try:
        start = connection.read_head()
        body = b"".join(connection.body(start))
    except connections.WireError:
        return ("refused",)
    return ("read", start.status, _comparable([(n.lower(), v) for n, v in start.headers]), body)


def _comparable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The headers but the two h11 rewrites (``Content-Length: 2, 2`` as ``2``, a lower-case
    ``Transfer-Encoding``): what they decide, the body and its end, is compared instead."""
    return [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]


def oracle(data: bytes) -> tuple:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "kernel"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")  # the kernel closes after these bytes
    status, headers, body = None, None, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = _comparable([(n.decode("latin-1"), v.decode("latin-1")) for n, v in event.headers])
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return ("read", status, headers, body)
            else:  # NEED_DATA at the end, ConnectionClosed: the answer broke off
                return ("refused",)
    except h11.RemoteProtocolError:
        return ("refused",)


def check(data: bytes, cuts: list[int] = ()) -> str:
    mine, theirs = ours(data, cuts), oracle(data)
    if mine == theirs:
        return "same"
    assert mine == ("refused",), f"read what h11 reads otherwise: {data!r}\nours:  {mine}\nh11:   {theirs}"
    return "stricter"


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


SSE = b"data: {}\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CORPUS = [
    HEAD + _chunked(SSE, SSE * 3),
    HEAD + _chunked(SSE) + b"HTTP/1.1 200 OK\r\n",  # bytes past the body: read alike, the rest left
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{"a": 1}\n',
    b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"a": 1',  # short
    b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",  # no reason
    b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
    b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"until": "close"}',
    b"HTTP/1.1 200 OK\r\n\r\nup to the close",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + _chunked(b"x"),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n" + _chunked(b"x"),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n" + _chunked(b"x"),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + _chunked(b"x"),
    b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0x2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n: x\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",  # LF line ends
    b"HTTP/1.1 200 OK\r\nX: \x80\xff\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1  200 OK\r\n\r\n",
    b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK",  # no end of head
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"",
    HEAD + b"5\r\nhello\r\n",  # the last chunk never comes
    HEAD + b"5\r\nhelloXX0\r\n\r\n",  # no CRLF after the data
    HEAD + b"zz\r\nhello\r\n0\r\n\r\n",
    HEAD + b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n",
]


def test_the_corpus_is_read_as_h11_reads_it() -> None:
    outcomes = {"same": 0, "stricter": 0}
    for data in CORPUS:
        for cuts in ([], [1], [len(HEAD)], [len(HEAD) + 3, len(HEAD) + 9], list(range(0, len(data), 7))):
            outcomes[check(data, cuts)] += 1
    assert outcomes["same"] > 3 * outcomes["stricter"], outcomes


def test_the_oracle_can_fail() -> None:
    """A reader that took the rest of a chunked body as data would be caught."""
    data = HEAD + _chunked(b"abc")
    assert oracle(data) == ours(data)
    with pytest.raises(AssertionError):
        assert oracle(data) == ("read", 200, ours(data)[2], b"3\r\nabc\r\n0\r\n\r\n")


FIELDS = [
    b"Content-Length: 5", b"Content-Length: 0", b"Content-Length: 5, 5", b"Content-Length: 12",
    b"Transfer-Encoding: chunked", b"Transfer-Encoding: CHUNKED", b"Transfer-Encoding: gzip, chunked",
    b"Connection: close", b"Connection: keep-alive", b"Content-Type: text/event-stream", b"X-A: b c",
]  # fmt: skip
ODD = [b"\r", b"\n", b"\r\n", b"\x00", b"\x0b", b"\t", b" ", b",", b":", b"\x80", b"\x7f"]
BODIES = [b"", b"hello", _chunked(b"hello"), _chunked(b"he", b"llo"), b"0\r\n\r\n", b"5\r\nhel", b"hello world!"]


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]))
    status = draw(st.sampled_from([b"200", b"200", b"204", b"304", b"404", b"500", b"100", b"103"]))
    reason = draw(st.sampled_from([b" OK", b"", b" ", b" Odd\tone"]))
    lines = [version + b" " + status + reason, *draw(st.lists(st.sampled_from(FIELDS), max_size=3))]
    data = bytearray(b"\r\n".join(lines) + b"\r\n\r\n" + draw(st.sampled_from(BODIES)))
    if status in (b"100", b"103"):
        data += b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    return mutate(draw, data, st.sampled_from(ODD), [0, 0, 1, 2])


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOAK = settings(max_examples=20000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(data=answers(), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_generated_answers_are_read_as_h11_reads_them(data: bytes, cuts: list[int]) -> None:
    check(data, cuts)


@pytest.mark.soak
@SOAK
@given(data=answers(), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_generated_answers_are_read_as_h11_reads_them_soak(data: bytes, cuts: list[int]) -> None:
    check(data, cuts)


# ---------------------------------------------------------------------- what the client keeps
def test_a_connection_is_clean_only_when_nothing_was_read_past_the_answer() -> None:
    connection = connections.KernelConnection(Reads([HEAD + _chunked(SSE)]))  # type: ignore[arg-type]
    start = connection.read_head()
    assert b"".join(connection.body(start)) == SSE and connection.clean and start.keep_alive
    dirty = connections.KernelConnection(Reads([HEAD + _chunked(SSE) + b"junk"]))  # type: ignore[arg-type]
    start = dirty.read_head()
    assert b"".join(dirty.body(start)) == SSE and not dirty.clean


@pytest.mark.parametrize(
    ("head", "keep_alive", "framing"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True, Framing.LENGTH),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", False, Framing.LENGTH),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\n", False, Framing.CLOSE),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", False, Framing.LENGTH),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True, Framing.NONE),
    ],
)
def test_which_answers_leave_the_connection_usable(head: bytes, keep_alive: bool, framing: Framing) -> None:
    start = parse_response_head(head)
    assert (start.keep_alive, start.framing) == (keep_alive, framing)


def test_a_101_is_not_an_answer_to_wait_past() -> None:
    connection = connections.KernelConnection(Reads([b"HTTP/1.1 101 Switching\r\nUpgrade: x\r\n\r\n"]))  # type: ignore[arg-type]
    with pytest.raises(connections.WireError):
        connection.read_head()


def test_a_body_beyond_the_limit_is_refused() -> None:
    connection = connections.KernelConnection(Reads([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100]))  # type: ignore[arg-type]
    start = connection.read_head()
    with pytest.raises(connections.WireError):
        connection.read_body(start, limit=99)


def test_a_head_beyond_the_limit_is_refused() -> None:
    connection = connections.KernelConnection(Reads([b"HTTP/1.1 200 OK\r\n", b"X: " + b"y" * 70000 + b"\r\n\r\n"]))  # type: ignore[arg-type]
    with pytest.raises(connections.WireError):
        connection.read_head()


def test_parse_response_head_refuses_a_status_line_it_cannot_read() -> None:
    with pytest.raises(ResponseError):
        parse_response_head(b"HTTP/1.1 OK\r\n\r\n")


# ---------------------------------------------------------------------- what the client writes
def _served(request: bytes) -> tuple[h11.Request, bytes]:
    server = h11.Connection(h11.SERVER)
    server.receive_data(request)
    event = server.next_event()
    assert isinstance(event, h11.Request)
    body = b""
    while True:
        more = server.next_event()
        if isinstance(more, h11.EndOfMessage):
            return event, body
        assert isinstance(more, h11.Data)
        body += more.data


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=3000),
    extra=st.dictionaries(
        st.from_regex(r"X-[A-Za-z0-9-]{1,12}", fullmatch=True),
        st.from_regex(r"[\x21-\x7e]([\x20-\x7e]{0,30}[\x21-\x7e])?", fullmatch=True),
        max_size=3,
    ),
    port=st.sampled_from([80, 8080]),
    host=st.sampled_from(["127.0.0.1", "::1", "localhost"]),
)
def test_a_request_written_is_read_back_by_h11(body: bytes, extra: dict[str, str], port: int, host: str) -> None:
    fixed = {"A2A-Version": "1.0", "Content-Type": "application/json", "Authorization": "Bearer t0k3n"}
    request = connections.encode_request(connections.request_head("/rpc/", host, port, fixed), extra, body)
    event, received = _served(request)
    assert (event.method, event.target, received) == (b"POST", b"/rpc/", body)
    headers = [(n.decode(), v.decode()) for n, v in event.headers]
    authority = (f"[{host}]" if ":" in host else host) + ("" if port == 80 else f":{port}")
    expected = [("host", authority), ("accept-encoding", "identity"), ("content-length", str(len(body)))]
    expected += [(n.lower(), v) for n, v in {**fixed, **extra}.items()]  # X-A and X-a: both sent
    assert sorted(headers) == sorted(expected)


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b", "a\x7fb"])
def test_a_header_value_that_could_break_the_head_is_refused(value: str) -> None:
    with pytest.raises(ValueError) as caught:
        connections.encode_request(b"POST / HTTP/1.1\r\n", {"X-Request-ID": value}, b"")
    assert value not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        connections.request_head("/", "127.0.0.1", 80, {"Authorization": "Bearer " + value})
    assert value not in str(caught.value)


def test_a_silent_kernel_times_out_by_the_sockets_own_timeout_not_a_poll_per_read() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        pool = connections.StreamConnections("127.0.0.1", port, connect_timeout=5.0, read_timeout=0.3, size=1)
        connection, reused = pool.take()
        peer, _ = server.accept()
        with peer:
            assert not reused
            assert connection.sock.gettimeout() is None  # blocking: no poll before each recv
            assert connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) != bytes(16)
            peer.sendall(b"HTTP/1.1 200 OK\r\n")
            assert connection.recv() == b"HTTP/1.1 200 OK\r\n"
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                connection.recv()  # the kernel says nothing more
            assert time.monotonic() - started >= 0.2
            connection.close()
