"""Each defect of issue 19 items 3-5 as a request over a real socket to the adapter.

The adapter runs with ``--cors-origins '*'`` (the setting under which an ``Origin`` is
reflected) on the built-in server. Each request gets its expected status (400, the
connection closed after it), never a 500, and the server's log about it stays bounded:
no traceback, no line longer than a couple of KB. ``/health`` answers afterwards. The CORS
rule is also checked without the parser in front (as another WSGI server could pass an
``Origin`` through): only a serialized origin is ever reflected.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import pytest
from werkzeug.test import EnvironBuilder

from agui_adapter.web.app import CorsPolicy

MAX_LOG_LINE = 2048
CHUNKED_JSON = b"2\r\n{}\r\n0\r\n\r\n"


def raw_exchange(url: str, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes, bool]:
    """Send ``data``; the status, headers and body of the answer, and whether the server closed."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            assert piece, f"closed without an answer: {answer!r}"
            answer += piece
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {n.strip().lower(): v.strip() for n, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            piece = sock.recv(65536)
            assert piece, "closed mid-body"
            body += piece
        closed = False
        if headers.get("connection") == "close":  # else the server keeps it: nothing to wait for
            try:
                closed = sock.recv(65536) == b""
            except ConnectionResetError:
                closed = True
    return int(lines[0].split(" ")[1]), headers, body, closed


def assert_bounded_log(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        message = record.getMessage()
        assert not record.exc_info and record.levelno < logging.ERROR, message[:500]
        assert len(message) <= MAX_LOG_LINE, f"a log line of {len(message)} characters: {message[:300]}"


@pytest.fixture
def cors_any(make_adapter: Any, caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.DEBUG)
    return make_adapter(cors_origins="*")


DEFECTS = {
    "bare-cr-in-origin": b"GET /health HTTP/1.1\r\nHost: a\r\nOrigin: https://a.example\rX-Evil: 1\r\n\r\n",
    "vt-before-chunked": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Transfer-Encoding: \x0bchunked\r\n\r\n" + CHUNKED_JSON
    ),
    "nbsp-after-content-length": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 2\xa0\r\n\r\n{}"
    ),
    "no-host": b"GET /health HTTP/1.1\r\n\r\n",
    "two-hosts": b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "two-equal-hosts": b"GET /health HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
    "control-byte-in-target": b"GET /health?\x1b[2J HTTP/1.1\r\nHost: a\r\n\r\n",
    "non-ascii-in-target": b"GET /health?\xe9 HTTP/1.1\r\nHost: a\r\n\r\n",
    "nul-in-value": b"GET /health HTTP/1.1\r\nHost: a\r\nX-A: \x00\r\n\r\n",
    "bare-lf-after-chunk-size": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n"
    ),
    "space-before-chunk-size": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n 2\r\n{}\r\n0\r\n\r\n"
    ),
    "empty-transfer-coding": (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Transfer-Encoding: chunked, \r\n\r\n" + CHUNKED_JSON
    ),
}


@pytest.mark.parametrize("name", list(DEFECTS))
def test_each_defect_is_a_400_that_closes(cors_any: Any, caplog: pytest.LogCaptureFixture, name: str) -> None:
    status, headers, body, closed = raw_exchange(cors_any.url, DEFECTS[name])
    assert status == 400, (status, body)
    assert json.loads(body)["error"]["code"] == "BAD_REQUEST"
    assert headers["connection"] == "close" and closed
    assert "access-control-allow-origin" not in headers
    status, _, _, _ = raw_exchange(cors_any.url, b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert status == 200
    assert_bounded_log(caplog)


ROUTES = [
    b"GET /health",
    b"HEAD /health",
    b"GET /ready",
    b"GET /metrics",
    b"GET /nope",
    b"OPTIONS /",
    b"POST /",
    b"GET /threads/t/runs/r/events",
    b"POST /extensions/iac-code/v1/executions/e/cancel",
]


@pytest.mark.parametrize("origin", [b"https://a.example\rX", b"https://a\x0b.example", b"\r", b"https://a.example\r"])
def test_a_control_byte_in_origin_never_makes_a_route_500(
    cors_any: Any, caplog: pytest.LogCaptureFixture, origin: bytes
) -> None:
    for route in ROUTES:
        request = route + b" HTTP/1.1\r\nHost: a\r\nOrigin: " + origin + b"\r\nContent-Length: 0\r\n\r\n"
        status, headers, _, closed = raw_exchange(cors_any.url, request)
        assert status == 400 and closed, (route, status)
        assert "access-control-allow-origin" not in headers
    assert_bounded_log(caplog)


@pytest.mark.parametrize(
    "origin", ["https://a.example\xff", "null", "https://a.example/path", "a.example", "https://a.ex ample"]
)
def test_an_origin_the_parser_lets_through_is_reflected_only_when_serialized(cors_any: Any, origin: str) -> None:
    """obs-text (``\\xff``) is valid in a header value: it reaches CORS, which does not reflect it."""
    request = b"GET /health HTTP/1.1\r\nHost: a\r\nOrigin: " + origin.encode("latin-1") + b"\r\n\r\n"
    status, headers, _, _ = raw_exchange(cors_any.url, request)
    assert status == 200
    assert "access-control-allow-origin" not in headers and "Origin" in headers["vary"]
    good = b"GET /health HTTP/1.1\r\nHost: a\r\nOrigin: https://a.example:8443\r\n\r\n"
    status, headers, _, _ = raw_exchange(cors_any.url, good)
    assert status == 200 and headers["access-control-allow-origin"] == "https://a.example:8443"


@pytest.mark.parametrize(
    "origin",
    ["https://a.example\r", "https://a.example\rX-Evil: 1", "https://a\x0b.example", "https://a.example\xff", "\r"],
)
@pytest.mark.parametrize("path,method", [("/health", "GET"), ("/", "POST"), ("/", "OPTIONS"), ("/ready", "GET")])
def test_cors_without_the_parser_never_reflects_a_control_byte(
    cors_any: Any, origin: str, path: str, method: str
) -> None:
    """As under a WSGI server that passed the header through: no 500, nothing reflected."""
    environ = EnvironBuilder(path=path, method=method, headers={"Access-Control-Request-Method": "POST"}).get_environ()
    environ["HTTP_ORIGIN"] = origin
    got: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        got.append((status, headers))
        return lambda data: None

    body = cors_any.app(environ, start_response)
    b"".join(body)
    getattr(body, "close", lambda: None)()
    status, headers = got[0]
    assert not status.startswith("5"), status
    assert not any(name.lower() == "access-control-allow-origin" for name, _ in headers), headers
    assert all("\r" not in value and "\n" not in value and "\x0b" not in value for _, value in headers)


@pytest.mark.parametrize(
    "origin,allowed",
    [
        ("https://app.example", True),
        ("http://localhost:5173", True),
        ("https://[::1]:8443", True),
        ("HTTPS://APP.EXAMPLE", True),
        ("app-scheme+x://host", True),
        ("", False),
        ("null", False),
        ("*", False),
        ("https://", False),
        ("https://app.example/", False),
        ("https://app.example:123456", False),
        ("https://app.example:", False),
        ("https://user@app.example", False),
        ("https://app.example\r", False),
        ("https://app.example\n", False),
        ("https://app\x0b.example", False),
        ("https://app.example\xff", False),
        ("https://app.exämple", False),
        ("https://-app.example", False),
        ("https://app.example" + "x" * 600, False),
    ],
)
def test_only_a_serialized_origin_is_allowed_whatever_the_setting(origin: str, allowed: bool) -> None:
    assert CorsPolicy("*").allows(origin) is allowed
    assert CorsPolicy(origin.lower() or "https://x.example").allows(origin) is allowed
    assert CorsPolicy("https://other.example").allows(origin) is False
