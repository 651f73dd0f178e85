"""Property-based fuzzing of the HTTP edge over a real socket.

Thousands of generated envelopes and odd requests (wrong types in every field, huge and
deeply nested JSON, invalid UTF-8, NaN and 1e999, duplicate keys, lying Content-Length,
chunked bodies, long and odd Accept/Accept-Language, odd threadId/cwd): never a 5xx, never
a traceback in the log, never a hang (every exchange has a deadline), never a file outside
the state directory and the allowed workspaces. The default suite runs a few hundred
examples per property; ``-m soak`` runs many more.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.agui_client import run_body

EXCHANGE_DEADLINE = 30.0
FAST = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
SOAK = settings(
    max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
CANCEL = "/extensions/iac-code/v1/executions/e-1/cancel"

PROPS = (
    "schemaVersion rosInvocationId cwd model llmApiKey llmHeaders thinking userId channel preferredLanguage "
    "candidatePresentation runMode pipelineName cleanupOnly activeGuidance alibabaCloud"
).split()
PATHS: list[tuple[Any, ...]] = [
    ("threadId",),
    ("runId",),
    ("parentRunId",),
    ("state",),
    ("messages",),
    ("messages", 0),
    ("messages", 0, "role"),
    ("messages", 0, "content"),
    ("messages", 0, "id"),
    ("tools",),
    ("context",),
    ("resume",),
    ("forwardedProps",),
    ("forwardedProps", "iacCode"),
    *[("forwardedProps", "iacCode", key) for key in PROPS],
    ("forwardedProps", "iacCode", "thinking", "budget"),
    ("forwardedProps", "iacCode", "llmHeaders", "X-Odd"),
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "\ud800",
            "a\udfffb",
            "\udbff\udfff",
            "",
            "\x00",
            "../../etc",
            "~",
            "~root/x",
            "/",
            "/proc/self",
            "[SLOW]",
            "é" * 300,
            "x" * 5000,
        ]
    )
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)


def odd_cwd(root: Path) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            "relative",
            "",
            str(root / ".." / "escape"),
            str(root / "ws" / ".." / ".." / "up"),
            str(root / "a\x00b"),
            str(root / ("n" * 300)),
            "/" + "d/" * 2000,
            "~/x",
            "/etc",
            "/proc/self/cwd",
            str(root / "ws" / "new" / "deeper"),
        ]
    ) | st.text(max_size=30).map(lambda s: str(root / "ws") + "/" + s)


@st.composite
def envelopes(draw: st.DrawFn, root: Path) -> bytes:
    body = run_body(draw(st.text(max_size=30)), cwd=str(root / "ws"), thread_id=f"fz-{uuid.uuid4().hex[:10]}")
    good_cwd = st.just(str(root / "ws"))
    body["forwardedProps"]["iacCode"]["cwd"] = draw(st.one_of(good_cwd, good_cwd, odd_cwd(root)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(PATHS))
        node: Any = body
        for key in path[:-1]:
            if isinstance(node, dict):
                node = node.setdefault(key, {})
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                node = None
                break
        last = path[-1]
        if isinstance(node, dict):
            if draw(st.booleans()) and last in node:
                del node[last]
            else:
                node[last] = draw(json_values)
        elif isinstance(node, list) and isinstance(last, int) and last < len(node):
            node[last] = draw(json_values)
    data = json.dumps(body, allow_nan=True).encode()
    trick = draw(st.sampled_from(["none", "none", "dup", "1e999", "utf8", "deep", "nan", "truncate"]))
    if trick == "dup":
        data = b'{"threadId": 7, ' + data[1:]
    elif trick == "1e999":
        data = data.replace(b'"state": {}', b'"state": 1e999', 1)
    elif trick == "utf8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])) + data[at:]
    elif trick == "deep":
        depth = draw(st.integers(90, 3000))
        data = data.replace(b'"state": {}', b'"state": ' + b"[" * depth + b"]" * depth, 1)
    elif trick == "nan":
        data = data.replace(b'"state": {}', b'"state": [NaN, Infinity, -Infinity]', 1)
    elif trick == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    return data


accept_values = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "text/event-stream;q=inf",
            "text/event-stream;q=nan",
            "text/event-stream;q=0, */*",
            "*/*;q=0.5",
            "text/*",
            "application/json",
            ";;;,,,",
            "text/event-stream;" + "a=b;" * 500,
            "*/*, " * 1000,
        ]
    ),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
)
language_values = st.one_of(
    st.none(),
    st.sampled_from(["zh-CN,zh;q=0.9", "fr;q=nan", "de;q=inf, ja", "*", "x" * 5000, "en;q=1e999"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
)


@st.composite
def raw_requests(draw: st.DrawFn, root: Path) -> tuple[bytes, bool]:
    """A whole HTTP/1.1 request, framed honestly or not, and whether its framing ends it (a
    body shorter than its length, or a length the server may wait for, does not)."""
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "HEAD", "OPTIONS", "PUT", "DELETE"]))
    path = draw(st.sampled_from(["/", "/", CANCEL, "/health", "/ready", "/nope", "//", "/extensions/x/cancel"]))
    body = draw(envelopes(root) | st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
    headers = [b"Host: fuzz", b"Connection: close"]
    content_type = draw(st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]))
    if content_type:
        headers.append(b"Content-Type: " + content_type.encode())
    accept = draw(accept_values)
    if accept is not None:
        headers.append(b"Accept: " + accept.encode())
    language = draw(language_values)
    if language is not None:
        headers.append(b"Accept-Language: " + language.encode())
    framing = draw(st.sampled_from(["length", "length", "chunked", "bad-chunk", "short", "long", "odd-length"]))
    if framing == "chunked":
        size = draw(st.integers(1, 64))
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    elif framing == "bad-chunk":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"zz\r\n" + body + b"\r\n0\r\n\r\n"
    elif framing == "short":
        headers.append(b"Content-Length: %d" % max(0, len(body) - draw(st.integers(1, 50))))
        payload = body
    elif framing == "long":
        headers.append(b"Content-Length: %d" % (len(body) + draw(st.integers(1, 10**6))))
        payload = body
    elif framing == "odd-length":
        headers.append(
            b"Content-Length: " + draw(st.sampled_from([b"-1", b"abc", b"1e3", b" 5", b"99999999999999999999"]))
        )
        payload = body
    else:
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    ended = framing not in ("long", "odd-length")
    return f"{method} {path} HTTP/1.1\r\n".encode() + b"\r\n".join(headers) + b"\r\n\r\n" + payload, ended


def exchange(port: int, request: bytes, *, ended: bool = True) -> bytes:
    """Send a request (``Connection: close``), read the whole answer; fail if it takes too
    long. A request whose framing does not end it is half-closed after it, so that the server
    sees its end; one that ends is not: the adapter takes a half-close as a client that left
    (as nginx does), which ends an admitted run's stream at once."""
    deadline = time.monotonic() + EXCHANGE_DEADLINE
    with socket.create_connection(("127.0.0.1", port), timeout=EXCHANGE_DEADLINE) as sock:
        try:
            sock.sendall(request)
            if not ended:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer (and close) before reading everything
        data = b""
        while True:
            assert time.monotonic() < deadline, "the adapter did not finish answering in time"
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return data


def check_answer(answer: bytes) -> None:
    if not answer:
        return  # closed without an answer (e.g. a request the server itself refused to parse)
    status_line = answer.split(b"\r\n", 1)[0]
    parts = status_line.split()
    assert len(parts) >= 2 and parts[0].startswith(b"HTTP/"), status_line
    status = int(parts[1])
    assert status < 500, answer[:600]
    if status == 200 and b"text/event-stream" in answer.split(b"\r\n\r\n", 1)[0]:
        assert b'"RUN_FINISHED"' in answer or b'"RUN_ERROR"' in answer, answer[-400:]
        for code in (b"A2A_UNAVAILABLE", b"STATE_PERSISTENCE_FAILED", b"INTERNAL_ERROR"):
            assert code not in answer, answer[-600:]


def snapshot(*roots: Path) -> set[str]:
    found: set[str] = set()
    for root in roots:
        for entry in os.scandir(root):
            found.add(entry.path)
    return found


@pytest.fixture
def fuzz_target(make_adapter: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[int, Path]]:
    caplog.set_level(logging.INFO)
    (tmp_path / "ws").mkdir()
    repo = Path(__file__).resolve().parents[2]
    outside = (tmp_path.parent, repo, Path(tmp_path.anchor) / "etc")
    before = snapshot(*outside)
    adapter = make_adapter(heartbeat_seconds=1.0)
    port = int(adapter.url.rstrip("/").rsplit(":", 1)[1])
    yield port, tmp_path
    assert snapshot(*outside) == before, "a file appeared outside the state dir and the workspaces"
    inside = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*")}
    assert inside <= {"ws", "state"}, inside
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()[:300]}" for r in bad[:5]]


def _envelope_property(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    port, root = fuzz_target
    body = data.draw(envelopes(root))
    headers = b"Host: fuzz\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
    check_answer(exchange(port, b"POST / HTTP/1.1\r\n" + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body))


def _request_property(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    port, root = fuzz_target
    request, ended = data.draw(raw_requests(root))
    check_answer(exchange(port, request, ended=ended))


@FAST
@given(data=st.data())
def test_generated_envelopes(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    _envelope_property(fuzz_target, data)


@FAST
@given(data=st.data())
def test_odd_requests(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    _request_property(fuzz_target, data)


@pytest.mark.soak
@SOAK
@given(data=st.data())
def test_generated_envelopes_soak(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    _envelope_property(fuzz_target, data)


@pytest.mark.soak
@SOAK
@given(data=st.data())
def test_odd_requests_soak(fuzz_target: tuple[int, Path], data: st.DataObject) -> None:
    _request_property(fuzz_target, data)


def test_the_checks_can_fail() -> None:
    with pytest.raises(AssertionError):
        check_answer(b"HTTP/1.1 500 Internal Server Error\r\n\r\n{}")
    with pytest.raises(AssertionError):
        check_answer(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n")
