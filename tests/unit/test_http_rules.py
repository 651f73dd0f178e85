"""The HTTP/1.1 wire rules (``agui_adapter.http.rules``) on bytes and values: no sockets, no clock.

The same rules run over real sockets in ``tests/flow/test_http_server.py``; here every case is
a function call: request heads good and bad, the body framing, chunked bodies fed in
pieces, response heads for each framing, and the server's JSON errors.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agui_adapter.http import rules
from agui_adapter.http.rules import (
    LAST_CHUNK,
    MAX_CHUNK_LINE,
    MAX_REQUEST_LINE,
    BodyFraming,
    ChunkedDecoder,
    ProtocolError,
    Request,
    body_framing,
    encode_chunk,
    error_body,
    error_response,
    http_date,
    parse_chunk_size,
    parse_request_head,
    plan_response,
    take_head,
    wants_keep_alive,
)

DATE = "Wed, 02 Dec 2026 19:00:00 GMT"


def with_host(head: bytes) -> bytes:
    """``head`` with a ``Host`` line after its request line unless it has one (HTTP/1.1 needs
    it: the tests of the Host rules call ``parse_request_head`` themselves)."""
    line, sep, rest = head.partition(b"\n")
    if not sep or b"\nhost:" in head.lower():
        return head
    return line + sep + b"Host: t" + (b"\r\n" if line.endswith(b"\r") else b"\n") + rest


def request(head: bytes, max_headers: int = 100) -> Request:
    return parse_request_head(with_host(head), max_headers)


def refusal(head: bytes, max_headers: int = 100) -> tuple[int, str]:
    with pytest.raises(ProtocolError) as caught:
        parse_request_head(with_host(head), max_headers)
    return caught.value.status, caught.value.code


def split_response(raw: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, [(n, v) for n, _, v in (line.partition(": ") for line in lines)], body


# ====================================================================== where the head ends
def test_take_head_returns_the_head_and_keeps_the_next_bytes() -> None:
    head, rest = take_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST /next", 1024)
    assert head == b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" and rest == b"POST /next"


def test_take_head_skips_empty_lines_before_a_request_and_accepts_bare_lf() -> None:
    head, rest = take_head(b"\r\n\r\nGET / HTTP/1.1\nHost: a\n\nrest", 1024)
    assert head == b"GET / HTTP/1.1\nHost: a\n\n" and rest == b"rest"


def test_take_head_waits_for_the_blank_line_across_feeds() -> None:
    buf = b""
    scanned = 0
    pieces = [b"\r\nGET / HT", b"TP/1.1\r\nHost: a\r", b"\n\r", b"\nbody"]
    for piece in pieces:
        head, buf = take_head(buf + piece, 1024, scanned)
        if head is not None:
            break
        scanned = len(buf)
    assert head == b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" and buf == b"body"


@pytest.mark.parametrize(
    "buf,limit,status",
    [
        (b"GET /" + b"a" * MAX_REQUEST_LINE, 64 * 1024, 414),  # a request line with no end in sight
        (b"GET /" + b"a" * 200, 100, 431),  # beyond the head limit, on a request line of legal length
        (b"GET /" + b"a" * 9000, 100, 414),  # beyond both
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 50, 100, 431),
    ],
    ids=["long-line", "over-limit-in-line", "long-line-over-limit", "headers-over-limit"],
)
def test_take_head_refuses_heads_beyond_the_limits(buf: bytes, limit: int, status: int) -> None:
    with pytest.raises(ProtocolError) as caught:
        take_head(buf, limit)
    assert caught.value.status == status


def test_take_head_of_an_incomplete_head_within_limits_is_none() -> None:
    assert take_head(b"GET / HTTP/1.1\r\nHost", 1024) == (None, b"GET / HTTP/1.1\r\nHost")
    assert take_head(b"\r\n", 1024) == (None, b"")


# ====================================================================== the request head
def test_a_request_head_is_parsed() -> None:
    req = request(b"POST /a%20b/c?x=1&y=2 HTTP/1.1\r\nHost: t\r\nX-Multi:  one \r\nContent-Length: 5\r\n\r\n")
    assert (req.method, req.target, req.path, req.query, req.version) == (
        "POST",
        "/a%20b/c?x=1&y=2",
        "/a%20b/c",
        "x=1&y=2",
        "HTTP/1.1",
    )
    assert req.headers == [("Host", "t"), ("X-Multi", "one"), ("Content-Length", "5")]
    assert req.keep_alive and req.body == BodyFraming(length=5) and req.body.kind == "length"


@pytest.mark.parametrize(
    "target,path,query",
    [
        ("http://example.com/p?q=1", "/p", "q=1"),
        ("HTTPS://example.com", "/", ""),
        ("*", "*", ""),
    ],
)
def test_absolute_and_asterisk_targets(target: str, path: str, query: str) -> None:
    req = request(f"OPTIONS {target} HTTP/1.1\r\n\r\n".encode())
    assert (req.path, req.query, req.target) == (path, query, target)


@pytest.mark.parametrize(
    "head,status,code",
    [
        (b"GARBAGE\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET  / HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"G(T / HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /\x00 HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET / HTTP/2.0\r\n\r\n", 505, "HTTP_VERSION_NOT_SUPPORTED"),
        (b"GET / HTTQ/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET relative HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /" + b"a" * MAX_REQUEST_LINE + b" HTTP/1.1\r\n\r\n", 414, "URI_TOO_LONG"),
    ],
    ids=[
        "garbage",
        "two-spaces",
        "bad-method",
        "nul",
        "http2",
        "not-http",
        "relative-target",
        "space-in-name",
        "no-colon",
        "obs-fold",
        "nul-in-value",
        "long-line",
    ],
)
def test_bad_request_heads_are_refused_with_their_status(head: bytes, status: int, code: str) -> None:
    assert refusal(head) == (status, code)


def test_more_headers_than_allowed_is_431() -> None:
    head = b"GET / HTTP/1.1\r\nHost: t\r\n" + b"X-A: b\r\n" * 3 + b"\r\n"
    assert request(head, max_headers=4).headers == [("Host", "t")] + [("X-A", "b")] * 3
    assert refusal(head, max_headers=3) == (431, "HEADERS_TOO_LARGE")


@pytest.mark.parametrize(
    "version,connection,keep_alive",
    [
        ("HTTP/1.1", None, True),
        ("HTTP/1.1", "close", False),
        ("HTTP/1.1", "Keep-Alive, Close", False),
        ("HTTP/1.0", None, False),
        ("HTTP/1.0", "keep-alive", True),
        ("HTTP/1.0", "close", False),
        ("HTTP/1.0", "keep-alive, close", False),  # kept alive before issue 19 (found by the h11 oracle)
    ],
)
def test_keep_alive_follows_the_version_and_the_connection_header(
    version: str, connection: str | None, keep_alive: bool
) -> None:
    headers = [] if connection is None else [("Connection", connection)]
    assert wants_keep_alive(version, headers) is keep_alive
    extra = b"" if connection is None else f"Connection: {connection}\r\n".encode()
    assert request(f"GET / {version}\r\n".encode() + extra + b"\r\n").keep_alive is keep_alive


# ====================================================================== the body framing
@pytest.mark.parametrize(
    "version,headers,framing",
    [
        ("HTTP/1.1", [], BodyFraming()),
        ("HTTP/1.1", [("Content-Length", "0")], BodyFraming(length=0)),
        ("HTTP/1.1", [("content-length", "12")], BodyFraming(length=12)),
        ("HTTP/1.1", [("Content-Length", "7, 7"), ("Content-Length", "7")], BodyFraming(length=7)),
        ("HTTP/1.1", [("Transfer-Encoding", "Chunked")], BodyFraming(chunked=True)),
        ("HTTP/1.1", [("Transfer-Encoding", "\tchunked ")], BodyFraming(chunked=True)),
        ("HTTP/1.0", [("Content-Length", "3")], BodyFraming(length=3)),
    ],
)
def test_body_framing(version: str, headers: list[tuple[str, str]], framing: BodyFraming) -> None:
    assert body_framing(version, headers) == framing


def test_framing_kinds() -> None:
    assert [BodyFraming().kind, BodyFraming(length=0).kind, BodyFraming(chunked=True).kind] == [
        "none",
        "length",
        "chunked",
    ]


@pytest.mark.parametrize(
    "version,headers,status,message",
    [
        ("HTTP/1.1", [("Content-Length", "1"), ("Content-Length", "2")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "-1")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "1e3")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "١٢")], 400, "Content-Length"),  # digits, but not ASCII
        ("HTTP/1.1", [("Content-Length", "9" * 19)], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "3"), ("Transfer-Encoding", "chunked")], 400, "both"),
        ("HTTP/1.1", [("Transfer-Encoding", "gzip")], 501, "chunked"),
        ("HTTP/1.1", [("Transfer-Encoding", "gzip, chunked")], 501, "chunked"),
        ("HTTP/1.1", [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")], 501, "chunked"),
        ("HTTP/1.0", [("Transfer-Encoding", "chunked")], 400, "HTTP/1.1"),
        # empty list elements were dropped before issue 19: now refused, as h11 does
        ("HTTP/1.1", [("Transfer-Encoding", "chunked, ")], 400, "malformed"),
        ("HTTP/1.1", [("Transfer-Encoding", ", chunked")], 400, "malformed"),
        ("HTTP/1.1", [("Transfer-Encoding", "")], 400, "malformed"),
        ("HTTP/1.1", [("Transfer-Encoding", "\x0bchunked")], 400, "malformed"),  # VT is no whitespace
        ("HTTP/1.1", [("Transfer-Encoding", "chunked\xa0")], 400, "malformed"),  # nor is NBSP
        ("HTTP/1.1", [("Transfer-Encoding", "chunked;x=1")], 400, "malformed"),
        ("HTTP/1.1", [("Transfer-Encoding", "chunked, gzip")], 501, "chunked"),
        ("HTTP/1.1", [("Content-Length", "5\xa0")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "\x0c5")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "5, ")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "+5")], 400, "Content-Length"),
        ("HTTP/1.1", [("Content-Length", "\xb2")], 400, "Content-Length"),  # a digit to str.isdigit
    ],
)
def test_conflicting_or_invalid_framing_is_refused(
    version: str, headers: list[tuple[str, str]], status: int, message: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        body_framing(version, headers)
    assert caught.value.status == status and message in caught.value.message


def test_framing_errors_come_after_malformed_headers_in_a_head() -> None:
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nBad Header: x\r\n\r\n"
    assert refusal(head) == (400, "BAD_REQUEST")


@pytest.mark.parametrize(
    "head,expects",
    [
        (b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n", True),
        (b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n", True),
        (b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", False),
        (b"POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", False),
        (b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", False),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n", False),
        (b"POST / HTTP/1.1\r\nEXPECT: 100-continue\r\nContent-Length: 3\r\n\r\n", True),
        (b"POST / HTTP/1.1\r\nExpect: x\r\nExpect:  100-continue \r\nContent-Length: 3\r\n\r\n", True),
        (b"POST / HTTP/1.1\r\nExpect: 100-continue-not\r\nContent-Length: 3\r\n\r\n", False),
        (b"POST / HTTP/1.1\r\nX-Expect: 100-continue\r\nContent-Length: 3\r\n\r\n", False),
    ],
)
def test_100_continue_only_for_an_http11_request_with_a_body(head: bytes, expects: bool) -> None:
    assert request(head).expects_continue is expects


# ====================================================================== chunked request bodies
def decode(data: bytes, piece: int, size: int = -1) -> tuple[bytes, ChunkedDecoder, int]:
    """Feed ``data`` ``piece`` bytes at a time, reading ``size`` at a time, until the end:
    the body, the decoder, and how many bytes were fed."""
    decoder = ChunkedDecoder()
    out = []
    fed = 0
    while True:
        got = decoder.read(size)
        if got is None:
            assert fed < len(data), "the decoder asked for more than the whole body"
            decoder.feed(data[fed : fed + piece])
            fed += piece
        elif not got:
            return b"".join(out), decoder, fed
        else:
            assert size < 0 or len(got) <= size
            out.append(got)


BODY = b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 2, 7, len(BODY)])
@pytest.mark.parametrize("size", [-1, 1, 4, 100])
def test_a_chunked_body_is_decoded_whatever_the_pieces(piece: int, size: int) -> None:
    data = BODY + b"GET / HTTP/1.1\r\n"
    body, decoder, fed = decode(data, piece, size)
    assert body == b"hello" + b"z" * 26 and decoder.done
    assert decoder.unused == data[len(BODY) : fed]  # what was fed past the body: the next request's


def test_the_bytes_past_the_body_are_handed_back() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n")
    assert decoder.unused == b""  # not over yet
    assert decoder.read() == b"abc"
    assert not decoder.done
    assert decoder.read() == b"" and decoder.done
    assert decoder.unused == b"GET / HTTP/1.1\r\n\r\n"
    assert decoder.read(10) == b""  # over: stays over


def test_the_decoder_needs_the_whole_line_before_it_decides() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"1")
    assert decoder.read() is None
    decoder.feed(b"0\r\n" + b"x" * 10)
    assert decoder.read() == b"x" * 10
    assert decoder.read() is None  # 6 more bytes of the chunk
    decoder.feed(b"y" * 6 + b"\r")
    assert decoder.read() == b"y" * 6
    assert decoder.read() is None  # a lone CR: the LF may still come
    decoder.feed(b"\n0\r\n\r\n")
    assert decoder.read() == b""


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\n",
        b"-1\r\n",
        b"\r\n",
        b";ext\r\n",
        b"0x5\r\n",
        b"1" * 16 + b"\r\n",
        b"1" * 40 + b"\r\n",
        b"5\r\nhelloXX0\r\n\r\n",
        b"5\r\nhello\rX\n",
        b"5 5\r\nhello\r\n",
        b"1" + b" " * 5000 + b"\r\n",
        b"0\r\nX-Trailer: " + b"a" * 9000 + b"\r\n\r\n",
        b"0\r\n" + b"X-T: 1\r\n" * 1200 + b"\r\n",
        # lenient forms accepted before issue 19, refused as h11 and waitress refuse them
        b"a\nhelloworld\r\n",
        b" 5\r\nhello\r\n",
        b"\t5\r\nhello\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\r\nhello\r\n",
        b"5 ;x\r\nhello\r\n",
        b"5;\x00\r\nhello\r\n",
        b"5;a\rb\r\nhello\r\n",
        b"\x0b5\r\nhello\r\n",
        b"0\r\n\n",
        b"0\r\nX-T: 1\n\r\n",
        b"0\r\nX-T: a\x0bb\r\n\r\n",
        b"0\r\nBad Name: 1\r\n\r\n",
        b"0\r\n folded\r\n\r\n",
    ],
    ids=[
        "not-hex",
        "negative",
        "empty-size",
        "only-extension",
        "0x-prefix",
        "16-digits",
        "too-long",
        "no-crlf-after-data",
        "cr-then-garbage",
        "space-inside",
        "size-line-too-long",
        "trailer-line-too-long",
        "trailers-too-large",
        "bare-lf-after-size",
        "space-before-size",
        "tab-before-size",
        "bare-lf-after-data",
        "cr-cr-lf",
        "space-before-extension",
        "nul-in-extension",
        "cr-in-extension",
        "vt-before-size",
        "bare-lf-ending-trailers",
        "bare-lf-after-trailer",
        "vt-in-trailer",
        "bad-trailer-name",
        "folded-trailer",
    ],
)
def test_bad_chunk_framing_is_a_400(body: bytes) -> None:
    decoder = ChunkedDecoder()
    decoder.feed(body)
    with pytest.raises(ProtocolError) as caught:
        for _ in range(10):  # a chunk's data, then its framing
            decoder.read()
    assert (caught.value.status, caught.value.code) == (400, "BAD_REQUEST")
    assert "chunked" in caught.value.message


def test_a_size_line_is_refused_as_soon_as_it_is_too_long() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"0" * (MAX_CHUNK_LINE - 1))
    assert decoder.read() is None  # the LF may still come
    decoder.feed(b"0")
    with pytest.raises(ProtocolError):
        decoder.read()


@pytest.mark.parametrize(
    "line,size",
    [
        (b"0\r\n", 0),
        (b"a\r\n", 10),
        (b"FfF; name=value\r\n", 0xFFF),
        (b"1f \t\r\n", 0x1F),  # trailing whitespace, as h11 takes it (never leading)
        (b"f" * 15 + b"\r\n", 16**15 - 1),
    ],
)
def test_chunk_size_lines(line: bytes, size: int) -> None:
    assert parse_chunk_size(line) == size


def test_a_chunk_size_line_met_before_gives_its_size_again_and_a_bad_one_is_refused_again() -> None:
    for _ in range(3):
        assert parse_chunk_size(b"1a3\r\n") == 0x1A3
        with pytest.raises(ProtocolError):
            parse_chunk_size(b"1a3\n")
    for size in range(5000):  # the sizes kept are bounded
        assert parse_chunk_size(b"%x\r\n" % size) == size
    assert len(rules._SIZES) <= 4096
    assert parse_chunk_size(b"FfF; name=value\r\n") == 0xFFF and b"FfF; name=value\r\n" not in rules._SIZES


def test_a_chunk_size_line_must_end_with_crlf() -> None:
    for line in (b"5\r", b"5\n", b" 5\r\n", b"5\r\r\n"):
        with pytest.raises(ProtocolError):
            parse_chunk_size(line)


def test_response_chunks() -> None:
    assert encode_chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert encode_chunk(b"hi", b"HEAD\r\n\r\n") == b"HEAD\r\n\r\n2\r\nhi\r\n"
    assert LAST_CHUNK == b"0\r\n\r\n"


# ====================================================================== response heads
def plan(
    status: str,
    headers: list[tuple[str, str]],
    method: str = "GET",
    version: str = "HTTP/1.1",
    extra: bytes = b"",
) -> tuple[str, list[tuple[str, str]], bytes, bool, str]:
    """The response head encoded, split: status line, headers, and the plan's framing."""
    req = request(f"{method} / {version}\r\n".encode() + extra + b"\r\n")
    head = plan_response(status, headers, req)
    line, sent, rest = split_response(head.encode(DATE))
    assert rest == b""
    return line, sent, head.framing.encode(), head.keep_alive, head.version


def test_a_response_with_a_length_keeps_the_connection() -> None:
    line, sent, framing, keep_alive, _ = plan("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "12")])
    assert line == "HTTP/1.1 200 OK" and framing == b"length" and keep_alive
    assert sent == [("Content-Type", "text/plain"), ("Content-Length", "12"), ("Date", DATE)]


def test_the_length_of_the_body_is_kept_on_the_head() -> None:
    req = request(b"GET / HTTP/1.1\r\n\r\n")
    assert plan_response("200 OK", [("Content-Length", " 12 ")], req).length == 12
    assert plan_response("200 OK", [], req).length == 0


def test_a_response_without_length_is_chunked_on_http11() -> None:
    _, sent, framing, keep_alive, _ = plan("200 OK", [("Content-Type", "text/event-stream")])
    assert framing == b"chunked" and keep_alive
    assert sent == [("Content-Type", "text/event-stream"), ("Date", DATE), ("Transfer-Encoding", "chunked")]


def test_an_invalid_length_is_dropped_and_the_body_chunked() -> None:
    _, sent, framing, _, _ = plan("200 OK", [("Content-Length", "12abc")])
    assert framing == b"chunked" and ("Content-Length", "12abc") not in sent


def test_a_response_without_length_on_http10_ends_with_the_connection() -> None:
    _, sent, framing, keep_alive, _ = plan("200 OK", [], version="HTTP/1.0", extra=b"Connection: keep-alive\r\n")
    assert framing == b"close" and not keep_alive
    assert sent == [("Date", DATE), ("Connection", "close")]


def test_http10_keep_alive_is_said_in_the_response() -> None:
    _, sent, framing, keep_alive, version = plan(
        "200 OK", [("Content-Length", "2")], version="HTTP/1.0", extra=b"Connection: keep-alive\r\n"
    )
    assert framing == b"length" and keep_alive and version == "HTTP/1.0"
    assert sent[-1] == ("Connection", "keep-alive")


def test_http10_without_keep_alive_closes() -> None:
    _, sent, _, keep_alive, _ = plan("200 OK", [("Content-Length", "2")], version="HTTP/1.0")
    assert not keep_alive and sent[-1] == ("Connection", "close")


@pytest.mark.parametrize(
    "method,status",
    [("HEAD", "200 OK"), ("GET", "204 No Content"), ("GET", "304 Not Modified"), ("GET", "101 Switching")],
)
def test_head_1xx_204_and_304_have_no_body(method: str, status: str) -> None:
    req = request(f"{method} / HTTP/1.1\r\n\r\n".encode())
    head = plan_response(status, [("Content-Length", "10")], req)
    assert head.framing == "none" and head.no_body and head.keep_alive
    assert b"Transfer-Encoding" not in head.encode(DATE)
    # HEAD of a response that would be chunked: no body and no chunking either
    assert plan_response(status, [], req).framing == "none"


def test_hop_by_hop_headers_are_the_servers() -> None:
    headers = [
        ("Connection", "keep-alive"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("TE", "trailers"),
        ("Trailer", "X"),
        ("Content-Length", "2"),
    ]
    _, sent, framing, keep_alive, _ = plan("200 OK", headers)
    assert sent == [("Content-Length", "2"), ("Date", DATE)] and framing == b"length" and keep_alive


def test_connection_close_from_the_application_or_the_client_closes() -> None:
    _, sent, _, keep_alive, _ = plan("200 OK", [("Connection", "Close"), ("Content-Length", "2")])
    assert not keep_alive and sent[-1] == ("Connection", "close")
    _, sent, _, keep_alive, _ = plan("200 OK", [("Content-Length", "2")], extra=b"Connection: close\r\n")
    assert not keep_alive and sent[-1] == ("Connection", "close")


def test_the_server_may_still_close_before_encoding() -> None:
    head = plan_response("200 OK", [("Content-Length", "2")], request(b"GET / HTTP/1.1\r\n\r\n"))
    head.keep_alive = False
    assert head.encode(DATE).endswith(b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("name,value", [("X-A", "a\r\nX-B: b"), ("X-A", "a\nb"), ("X-A\r\nX-B", "b")])
def test_a_line_break_in_a_response_header_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="line break"):
        plan_response("200 OK", [(name, value)], request(b"GET / HTTP/1.1\r\n\r\n"))


# ====================================================================== the server's own answers
def test_http_date() -> None:
    assert http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert http_date(1_796_240_400.9) == "Wed, 02 Dec 2026 19:40:00 GMT"


def test_error_responses_are_json_and_close() -> None:
    raw = error_response(503, "SERVER_BUSY", "retry", DATE, [("Retry-After", "1")])
    line, sent, body = split_response(raw)
    assert line == "HTTP/1.1 503 Service Unavailable"
    assert sent == [
        ("Content-Type", "application/json; charset=utf-8"),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        ("Date", DATE),
        ("Retry-After", "1"),
        ("Connection", "close"),
    ]
    assert json.loads(body) == {"error": {"code": "SERVER_BUSY", "message": "retry"}}
    assert body == error_body("SERVER_BUSY", "retry")
    assert split_response(error_response(408, "REQUEST_TIMEOUT", "late", DATE))[0] == "HTTP/1.1 408 Request Timeout"


@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=8),
    st.lists(st.integers(1, 30), min_size=1, max_size=20),
    st.booleans(),
)
def test_read_available_gives_every_chunk_at_hand(pieces: list[bytes], cuts: list[int], extension: bool) -> None:
    """``read_available`` returns what ``read`` would over several calls, however the bytes arrive."""
    end = b"\r\n"
    ext = b";n=v" if extension else b""
    wire = b"".join(b"%x%s%s%s%s" % (len(p), ext, end, p, end) for p in pieces) + b"0" + end + end + b"NEXT"
    decoder = ChunkedDecoder()
    got: list[bytes] = []
    offset = 0
    for cut in [*cuts, len(wire)]:
        decoder.feed(wire[offset : offset + cut])
        offset += cut
        data = decoder.read_available()
        if data:
            got.append(data)
        if decoder.done or offset >= len(wire):
            break
    assert decoder.done and decoder.read_available() == b""
    assert b"".join(got) == b"".join(pieces)
    assert decoder.unused == wire[len(wire) - 4 : offset]


def test_read_available_refuses_a_broken_chunk() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"3\r\nabcX\r\n")
    with pytest.raises(ProtocolError):
        decoder.read_available()


_FRAMING_VALUES = ["300", "0", " 7", "3,3", "3, 4", "-1", "1" * 19, "١٢", "abc", "", "chunked", "close", "keep-alive"]


@given(
    st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    st.lists(
        st.tuples(
            st.sampled_from(["Content-Length", "content-length", "Transfer-Encoding", "Connection", "Host"]),
            st.sampled_from(_FRAMING_VALUES),
        ),
        max_size=3,
    ),
)
def test_the_head_s_framing_is_what_the_general_rules_say(version: str, headers: list[tuple[str, str]]) -> None:
    """``parse_request_head`` answers the common cases itself: as ``body_framing`` and
    ``wants_keep_alive`` would, refusals included."""
    head = (f"POST / {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n").encode("utf-8")
    parsed_headers = [(n, v.strip(" \t")) for n, v in headers]
    hosts = [v for n, v in parsed_headers if n == "Host"]
    try:
        expected: object = (wants_keep_alive(version, parsed_headers), body_framing(version, parsed_headers))
        if len(hosts) > 1 or (version == "HTTP/1.1" and not hosts) or not re.fullmatch(r"[!-~]*", "".join(hosts)):
            expected = 400  # after the framing's rules: no Host, two, or one spaced or non-ASCII
    except ProtocolError as err:
        expected = err.status
    try:
        request = parse_request_head(head, 100)
        got: object = (request.keep_alive, request.body)
    except ProtocolError as err:
        got = err.status
    assert got == expected


@given(st.binary(max_size=40).map(lambda b: bytes(b"a:\r\n"[x % 4] for x in b)), st.integers(0, 40))
def test_take_head_finds_the_first_end_of_a_head(buf: bytes, scanned: int) -> None:
    """The CRLF shortcut of ``take_head`` ends the head where the general pattern does."""
    head, rest = take_head(buf, 1 << 20, min(scanned, len(buf)))
    stripped = re.sub(rb"^(?:\r?\n)+", b"", buf)  # empty lines first, never a lone CR
    match = re.compile(rb"\r?\n\r?\n").search(stripped, max(0, min(scanned, len(buf)) - 3))
    if match is None:
        assert head is None and rest == stripped
    else:
        assert head == stripped[: match.end()] and rest == stripped[match.end() :]


# ====================================================================== issue 19: as strict as h11
@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n",  # a bare CR in a value
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\r\r\n\r\n",  # a bare CR before the CRLF
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x0bb\r\n\r\n",  # VT
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x0cb\r\n\r\n",  # FF
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x01b\r\n\r\n",  # SOH (h11 takes it: stricter is fine)
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x1fb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\x7fb\r\n\r\n",  # DEL
        b"GET / HTTP/1.1\r\nHost: t\r\nX: \x00\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX\x0b: a\r\n\r\n",  # a control byte in a name
        b"GET / HTTP/1.1\r\nHost: t\r\nX : a\r\n\r\n",  # whitespace before the colon
        b"GET / HTTP/1.1\r\nHost: t\r\n\xe9: a\r\n\r\n",  # a name that is no token
        b"GET / HTTP/1.1\r\nHost: t\r\n: a\r\n\r\n",  # an empty name
        b"GET / HTTP/1.1\r\n\tX: a\r\nHost: t\r\n\r\n",  # a continuation line first
        b"GET / HTTP/1.1\rHost: t\r\n\r\n",  # a bare CR ending the request line
        b"GET /\x0b HTTP/1.1\r\nHost: t\r\n\r\n",  # a control byte in the target
        b"GET /\x7f HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /\xe9 HTTP/1.1\r\nHost: t\r\n\r\n",  # non-ASCII in the target
        b"GET /a\tb HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET\x0b/ HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # no Host on HTTP/1.1
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",  # two different
        b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",  # two equal: still two (RFC 9112 3.2)
        b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",  # on HTTP/1.0 too
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",  # not a uri-host
        b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a:b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \xe9.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\xa0\r\n\r\n",  # NBSP is no whitespace
        b"GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: \x0bchunked\r\n\r\n",
    ],
)
def test_what_rfc_9110_and_h11_refuse_is_a_400(head: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_request_head(head, 100)
    assert (caught.value.status, caught.value.code) == (400, "BAD_REQUEST")


@pytest.mark.parametrize(
    "head,header",
    [
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: caf\xe9\r\n\r\n", ("X", "caf\xe9")),  # obs-text, as h11
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: \t a \t b \t\r\n\r\n", ("X", "a \t b")),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX:\r\n\r\n", ("X", "")),
        (b"GET / HTTP/1.1\nHost: t\nX: y\n\n", ("X", "y")),  # bare LF line ends, as h11 reads them
        (b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", ("Host", "[::1]:8080")),
        (b"GET / HTTP/1.1\r\nHost: \r\n\r\n", ("Host", "")),  # an empty Host is allowed
        (b"GET / HTTP/1.0\r\nX: y\r\n\r\n", ("X", "y")),  # HTTP/1.0 needs no Host
    ],
)
def test_what_rfc_9110_allows_is_accepted(head: bytes, header: tuple[str, str]) -> None:
    assert header in parse_request_head(head, 100).headers


def test_empty_lines_before_a_request_are_crlf_or_lf_never_a_lone_cr() -> None:
    assert take_head(b"\r\n\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n", 1024)[0] == b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
    head, _ = take_head(b"\r\rGET / HTTP/1.1\r\nHost: t\r\n\r\n", 1024)
    assert head is not None and head.startswith(b"\r\r")
    with pytest.raises(ProtocolError):
        parse_request_head(head, 100)
