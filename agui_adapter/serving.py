"""The HTTP/1.1 server ``python run.py`` uses: a WSGI app, threaded, one thread per connection.

Why it exists: Werkzeug's development server closes the connection after every response,
has no timeout (a client that trickles its request holds a thread for ever), no bound on
connections, and a listen backlog of 128. This module serves the same WSGI application
(unchanged: it still runs under gunicorn, waitress or mod_wsgi) with keep-alive, a
deadline for the whole request, a send timeout, a connection limit with a reserve for
``/health``, and a shutdown API for graceful stops.

Why this base: the standard library's ``socket``, ``selectors`` and ``threading``, with
HTTP/1.1 framing written here. Werkzeug's ``WSGIRequestHandler.run_wsgi`` is one method
that hard-codes ``Connection: close`` and drains request bodies by reading until the
socket goes quiet, and ``http.server.BaseHTTPRequestHandler`` (its base, and
``wsgiref``'s) reads the request through a buffered file whose timeout is per ``recv``,
so a slow-loris client resets it with every byte; neither has a send timeout or a
connection limit. Keeping them would have meant overriding their core and living with
their private details; the protocol subset a WSGI server needs (request line, headers,
``Content-Length``/chunked bodies, chunked or length-framed responses) is small enough to
own, test over real sockets, and keep free of new runtime dependencies.

Threading model, as before: an accept loop hands every connection to its own thread, which
serves its requests in turn; an SSE stream holds its thread. Every chunk the application
yields is written at once (``TCP_NODELAY``, no buffering), so heartbeats and deltas leave
when they are produced, and a write that fails (the client went away) or cannot make
progress for ``send_timeout`` seconds ends the response: the WSGI iterable's ``close()``
always runs, which is how the application notices a client that left.

Framing: responses with a ``Content-Length`` keep the connection alive (``/health``, JSON
errors, cancel); a response without one is chunked on HTTP/1.1 (closed on HTTP/1.0);
``HEAD`` responses carry no body. Request bodies are always terminated
(``wsgi.input_terminated``): a request without ``Content-Length`` or ``Transfer-Encoding``
has an empty body, and chunked bodies are decoded. A body the application did not read is
drained when small, otherwise the connection is closed after a lingering read so that the
client still sees the answer.

Errors the server answers itself are JSON like the application's,
``{"error": {"code", "message"}}``: 400 ``BAD_REQUEST``, 408 ``REQUEST_TIMEOUT``, 414, 431,
501, 505, and 503 ``SERVER_BUSY`` (with ``Retry-After``) beyond the connection limit.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

log = logging.getLogger("agui_adapter.serving")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"))
_RECV = 65536
_MAX_REQUEST_LINE = 8 * 1024
_MAX_CHUNK_LINE = 4 * 1024
_MAX_TRAILERS = 8 * 1024

# connection states
IDLE = "idle"  # waiting for the next request of a keep-alive connection
READING = "reading"  # a request's line, headers (and body) are arriving
ACTIVE = "active"  # the application has the request


@dataclass(frozen=True)
class ServerLimits:
    """Timeouts and bounds of the server (the flags of ``python run.py`` set the first four)."""

    keepalive_timeout: float = 5.0
    """Seconds an idle keep-alive connection is kept open between requests."""
    request_timeout: float = 30.0
    """Deadline, from its first byte, for a request's line, headers and body to arrive."""
    send_timeout: float = 60.0
    """A write that cannot make progress for this long means the client is gone."""
    max_connections: int = 1024
    """Connections served at once; beyond, idle keep-alive connections are closed, then the reserve."""
    reserve_connections: int = 16
    """Extra connections beyond the limit that answer ``reserve_paths`` (else 503 SERVER_BUSY)."""
    reserve_paths: tuple[str, ...] = ("/health",)
    retry_after_seconds: int = 1
    backlog: int = max(1024, socket.SOMAXCONN)
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    drain_bytes: int = 64 * 1024
    """An unread request body up to this size is read and dropped to keep the connection."""
    linger_bytes: int = 16 * 1024 * 1024
    """When closing with a body unread, read and drop up to this much so the client sees the answer."""
    linger_seconds: float = 2.0


class BodyError(OSError):
    """Reading ``wsgi.input`` failed: the request timed out, the chunking is broken, or the
    client went away. The server answers the request itself (``status``) and closes."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _PeerGone(Exception):
    """The client closed the connection or it failed."""


class _Deadline(Exception):
    """The request's deadline passed."""


class _HTTPError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class ConnectionInfo:
    """A snapshot of one open connection (see ``WSGIServer.connections``)."""

    peer: str
    state: str
    reserve: bool
    opened: float
    requests: int
    path: str


class _Connection:
    """One accepted socket, owned by one thread (others may only ``abort`` it)."""

    __slots__ = ("sock", "peer", "reserve", "state", "opened", "requests", "path", "linger", "aborted", "_timeout")

    def __init__(self, sock: socket.socket, peer: Any, reserve: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.reserve = reserve
        self.state = READING
        self.opened = time.monotonic()
        self.requests = 0
        self.path = ""
        self.linger = False
        self.aborted = False
        self._timeout: float | None = -1.0

    def settimeout(self, timeout: float) -> None:
        if timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout

    def send(self, data: bytes, timeout: float) -> None:
        """Write everything; a write that makes no progress for ``timeout`` seconds fails."""
        self.settimeout(timeout)
        view = memoryview(data)
        try:
            while view:
                sent = self.sock.send(view)
                view = view[sent:]
        except OSError as exc:  # timeout, reset, broken pipe, or aborted by the server
            raise _PeerGone(str(exc) or type(exc).__name__) from None

    def abort(self) -> None:
        """Wake the owning thread out of any read or write; it closes the socket."""
        self.aborted = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def info(self) -> ConnectionInfo:
        peer = self.peer[0] if isinstance(self.peer, tuple) else str(self.peer)
        return ConnectionInfo(peer, self.state, self.reserve, self.opened, self.requests, self.path)


class _Reader:
    """Buffered reads from a connection, each bounded by an absolute deadline."""

    __slots__ = ("conn", "buf")

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.buf = b""

    def _recv(self, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline
        self.conn.settimeout(remaining)
        try:
            data = self.conn.sock.recv(_RECV)
        except TimeoutError:
            raise _Deadline from None
        except OSError as exc:
            raise _PeerGone(str(exc)) from None
        if not data:
            raise _PeerGone("closed by the client")
        return data

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for bytes; False when none came or the client closed."""
        if self.buf:
            return True
        try:
            self.buf = self._recv(time.monotonic() + timeout)
        except (_Deadline, _PeerGone):
            return False
        return True

    def head(self, deadline: float, limit: int) -> bytes | None:
        """The request line and headers, through the blank line; None on a clean close."""
        scanned = 0
        while True:
            buf = self.buf.lstrip(b"\r\n") if self.buf[:1] in (b"\r", b"\n") else self.buf
            self.buf = buf
            match = _HEAD_END.search(buf, max(0, scanned - 3))
            if match:
                self.buf = buf[match.end() :]
                return buf[: match.end()]
            scanned = len(buf)
            if scanned > limit:
                first = buf.split(b"\n", 1)
                if len(first) == 1 and scanned > _MAX_REQUEST_LINE:
                    raise _HTTPError(414, "URI_TOO_LONG", "The request line is too long.")
                raise _HTTPError(431, "HEADERS_TOO_LARGE", "The request headers are too large.")
            if len(buf) > _MAX_REQUEST_LINE and b"\n" not in buf:
                raise _HTTPError(414, "URI_TOO_LONG", "The request line is too long.")
            try:
                data = self._recv(deadline)
            except _PeerGone:
                if not buf:
                    return None
                raise
            self.buf = buf + data

    def some(self, size: int, deadline: float) -> bytes:
        """Between 1 and ``size`` bytes."""
        if not self.buf:
            self.buf = self._recv(deadline)
        data, self.buf = self.buf[:size], self.buf[size:]
        return data

    def line(self, limit: int, deadline: float) -> bytes:
        """Up to and including the next LF; at most ``limit`` bytes."""
        while b"\n" not in self.buf and len(self.buf) < limit:
            self.buf += self._recv(deadline)
        end = self.buf.find(b"\n")
        end = limit if end < 0 else min(end + 1, limit)
        data, self.buf = self.buf[:end], self.buf[end:]
        return data


class RequestBody:
    """``wsgi.input``: exactly the request's body (``Content-Length`` or chunked), then EOF.

    Reads are bounded by the request's deadline; a failure raises ``BodyError`` and is
    remembered, so that the server answers it (408, 400) whatever the application does.
    """

    __slots__ = (
        "_reader",
        "_deadline",
        "_remaining",
        "_chunked",
        "_chunk_left",
        "_send_continue",
        "done",
        "error",
        "_consumed",
        "_pushback",
    )

    def __init__(
        self,
        reader: _Reader | None,
        deadline: float,
        length: int | None,
        chunked: bool,
        send_continue: Callable[[], None] | None,
    ) -> None:
        self._reader = reader
        self._deadline = deadline
        self._remaining = length or 0
        self._chunked = chunked
        self._chunk_left = 0
        self._send_continue = send_continue
        self.done = not chunked and not length
        self.error: BodyError | None = None
        self._consumed = 0
        self._pushback = b""

    @property
    def continue_pending(self) -> bool:
        """``Expect: 100-continue`` was asked and not answered: the client may not send the body."""
        return self._send_continue is not None

    @property
    def pending(self) -> int | None:
        """Bytes of a ``Content-Length`` body not read yet; None for an unfinished chunked body."""
        if self.done:
            return 0
        return None if self._chunked else self._remaining

    # ------------------------------------------------------------------ file API
    def read(self, size: int | None = -1) -> bytes:
        want = -1 if size is None or size < 0 else size
        if self._pushback:
            if want < 0:
                data, self._pushback = self._pushback, b""
                return data + self.read(-1)
            data, self._pushback = self._pushback[:want], self._pushback[want:]
            return data
        if self.done or want == 0:
            return b""
        if self.error is not None:
            raise self.error
        return self._guard(self._read_chunked if self._chunked else self._read_length, want)

    def readline(self, size: int | None = -1) -> bytes:
        limit = -1 if size is None or size < 0 else size
        parts: list[bytes] = []
        total = 0
        while limit < 0 or total < limit:
            chunk = self.read(8192 if limit < 0 else min(8192, limit - total))
            if not chunk:
                break
            newline = chunk.find(b"\n")
            if newline >= 0:
                parts.append(chunk[: newline + 1])
                self._pushback = chunk[newline + 1 :] + self._pushback
                break
            parts.append(chunk)
            total += len(chunk)
        return b"".join(parts)

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines = []
        total = 0
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                return lines

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def drain(self, limit: int) -> bool:
        """Read and drop up to ``limit`` bytes; True when the body is then complete."""
        if self.done:
            return True
        if self.error is not None or self.continue_pending:
            return False
        if not self._chunked and self._remaining > limit:
            return False
        start = self._consumed
        try:
            while not self.done and self._consumed - start <= limit:
                self.read(_RECV)
        except BodyError:
            return False
        return self.done

    # ------------------------------------------------------------------ internals
    def _guard(self, reader: Callable[[int], bytes], want: int) -> bytes:
        if self._send_continue is not None:
            send, self._send_continue = self._send_continue, None
            try:
                send()
            except _PeerGone:
                self.error = BodyError(400, "CLIENT_GONE", "The client went away before its body arrived.")
                raise self.error from None
        try:
            data = reader(want)
        except _Deadline:
            self.error = BodyError(408, "REQUEST_TIMEOUT", "The request body did not arrive in time.")
            raise self.error from None
        except _PeerGone:
            self.error = BodyError(400, "CLIENT_GONE", "The client went away before its body arrived.")
            raise self.error from None
        self._consumed += len(data)
        return data

    def _read_length(self, want: int) -> bytes:
        assert self._reader is not None
        need = self._remaining if want < 0 else min(want, self._remaining)
        parts = []
        while need > 0:
            data = self._reader.some(need, self._deadline)
            parts.append(data)
            need -= len(data)
            self._remaining -= len(data)
        if self._remaining == 0:
            self.done = True
        return b"".join(parts)

    def _read_chunked(self, want: int) -> bytes:
        reader = self._reader
        assert reader is not None
        parts = []
        while want != 0 and not self.done:
            if self._chunk_left == 0:
                self._chunk_left = self._chunk_size(reader)
                if self._chunk_left == 0:
                    self._trailers(reader)
                    self.done = True
                    break
            take = self._chunk_left if want < 0 else min(want, self._chunk_left)
            data = reader.some(take, self._deadline)
            parts.append(data)
            self._chunk_left -= len(data)
            if want > 0:
                want -= len(data)
            if self._chunk_left == 0 and reader.line(3, self._deadline) not in (b"\r\n", b"\n"):
                self._bad_chunk()
        return b"".join(parts)

    def _chunk_size(self, reader: _Reader) -> int:
        line = reader.line(_MAX_CHUNK_LINE, self._deadline)
        if not line.endswith(b"\n"):
            self._bad_chunk()
        size = line.split(b";", 1)[0].strip(b" \t\r\n")
        if not size or len(size) > 15 or not _HEX.issuperset(size):
            self._bad_chunk()
        return int(size, 16)

    def _trailers(self, reader: _Reader) -> None:
        total = 0
        while True:
            line = reader.line(_MAX_TRAILERS, self._deadline)
            total += len(line)
            if not line.endswith(b"\n") or total > _MAX_TRAILERS:
                self._bad_chunk()
            if line in (b"\r\n", b"\n"):
                return

    def _bad_chunk(self) -> None:
        self.error = BodyError(400, "BAD_REQUEST", "The chunked request body is malformed.")
        raise self.error


class _Request:
    __slots__ = ("method", "target", "path", "query", "version", "headers", "keep_alive", "length", "chunked")

    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []
        self.length: int | None = None
        self.chunked = False


def _parse_head(head: bytes, max_headers: int) -> _Request:
    lines = head.decode("latin-1").split("\n")
    request_line = lines[0].rstrip("\r")
    if len(request_line) > _MAX_REQUEST_LINE:
        raise _HTTPError(414, "URI_TOO_LONG", "The request line is too long.")
    parts = request_line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or "\x00" in request_line:
        raise _HTTPError(400, "BAD_REQUEST", "The request line is malformed.")
    req = _Request()
    req.method, req.target, req.version = parts
    if req.version not in ("HTTP/1.1", "HTTP/1.0"):
        if re.fullmatch(r"HTTP/\d\.\d", req.version):
            raise _HTTPError(505, "HTTP_VERSION_NOT_SUPPORTED", "Only HTTP/1.0 and HTTP/1.1 are supported.")
        raise _HTTPError(400, "BAD_REQUEST", "The request line is malformed.")
    target = req.target
    if target.startswith("/"):
        path, _, query = target.partition("?")
    elif target == "*":
        path, query = "*", ""
    elif target.lower().startswith(("http://", "https://")):
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        path, _, query = ("/" if slash < 0 else rest[slash:]).partition("?")
    else:
        raise _HTTPError(400, "BAD_REQUEST", "The request target is malformed.")
    req.path, req.query = path, query
    connection: list[str] = []
    lengths: set[str] = set()
    encodings: list[str] = []
    count = 0
    for raw in lines[1:]:
        line = raw.rstrip("\r")
        if not line:
            break
        count += 1
        if count > max_headers:
            raise _HTTPError(431, "HEADERS_TOO_LARGE", "The request has too many headers.")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name) or "\x00" in value:  # also refuses obs-fold
            raise _HTTPError(400, "BAD_REQUEST", "A request header is malformed.")
        value = value.strip(" \t")
        lower = name.lower()
        if lower == "content-length":
            lengths.update(v.strip() for v in value.split(","))
        elif lower == "transfer-encoding":
            encodings += [v.strip().lower() for v in value.split(",") if v.strip()]
        elif lower == "connection":
            connection += [v.strip().lower() for v in value.split(",")]
        req.headers.append((name, value))
    if encodings:
        if lengths:
            raise _HTTPError(400, "BAD_REQUEST", "Content-Length and Transfer-Encoding are both present.")
        if encodings != ["chunked"]:
            raise _HTTPError(501, "NOT_IMPLEMENTED", "Only the chunked transfer coding is supported.")
        if req.version == "HTTP/1.0":
            raise _HTTPError(400, "BAD_REQUEST", "Chunked bodies need HTTP/1.1.")
        req.chunked = True
    elif lengths:
        value = lengths.pop() if len(lengths) == 1 else ""
        if not value.isdigit() or not value.isascii() or len(value) > 18:
            raise _HTTPError(400, "BAD_REQUEST", "The Content-Length header is invalid.")
        req.length = int(value)
    if req.version == "HTTP/1.1":
        req.keep_alive = "close" not in connection
    else:
        req.keep_alive = "keep-alive" in connection
    return req


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()


def _simple_response(
    status: int, code: str, message: str, *, keep_alive: bool = False, extra: list[tuple[str, str]] | None = None
) -> bytes:
    body = _error_body(code, message)
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        f"Date: {_http_date()}",
    ]
    lines += [f"{k}: {v}" for k, v in extra or []]
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Response:
    """One response: ``start_response``, framing, writes, and whether the connection survives."""

    __slots__ = (
        "server",
        "conn",
        "req",
        "body",
        "status",
        "headers",
        "head_sent",
        "keep_alive",
        "framing",
        "length",
        "written",
        "no_body",
    )

    def __init__(self, server: WSGIServer, conn: _Connection, req: _Request, body: RequestBody) -> None:
        self.server = server
        self.conn = conn
        self.req = req
        self.body = body
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.head_sent = False
        self.keep_alive = req.keep_alive
        self.framing = "length"
        self.length = 0
        self.written = 0
        self.no_body = req.method == "HEAD"

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
        if exc_info is not None:
            try:
                if self.head_sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response was already called")
        if not isinstance(status, str) or len(status) < 3 or not status[:3].isdigit():
            raise AssertionError(f"invalid WSGI status {status!r}")
        self.status = status
        self.headers = list(headers)
        return self.write

    def _head(self) -> bytes:
        """The status line and headers; decides framing and keep-alive."""
        assert self.status is not None
        body = self.body
        if body.error is not None:  # the application answered a request whose body failed
            raise body.error
        code = int(self.status[:3])
        lines = [f"HTTP/1.1 {self.status}"]
        length: int | None = None
        for name, value in self.headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"a line break in the response header {name!r}")
            lower = name.lower()
            if lower in _HOP_BY_HOP:
                if lower == "connection" and "close" in value.lower():
                    self.keep_alive = False
                continue
            if lower == "content-length":
                if not value.strip().isdigit():
                    continue  # an invalid length is dropped: the body is then chunked
                length = int(value)
            lines.append(f"{name}: {value}")
        lines.append(f"Date: {_http_date()}")
        if self.no_body or 100 <= code < 200 or code in (204, 304):
            self.no_body = True
            self.framing = "none"
        elif length is not None:
            self.framing, self.length = "length", length
        elif self.req.version == "HTTP/1.1":
            self.framing = "chunked"
            lines.append("Transfer-Encoding: chunked")
        else:
            self.framing = "close"
            self.keep_alive = False
        if self.keep_alive and (self.server.draining or self.conn.reserve):
            self.keep_alive = False
        if not body.done:  # the application did not read the whole body
            if body.continue_pending:
                self.keep_alive = False
                self.conn.linger = True
            elif not body.drain(self.server.limits.drain_bytes):
                if body.error is not None and body.error.code == "CLIENT_GONE":
                    raise body.error
                self.keep_alive = False
                self.conn.linger = True
        if not self.keep_alive:
            lines.append("Connection: close")
        elif self.req.version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        self.head_sent = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def write(self, data: bytes) -> None:
        if self.status is None:
            raise AssertionError("write() before start_response()")
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("a WSGI application must yield bytes")
        if not data and self.head_sent:
            return
        head = b"" if self.head_sent else self._head()
        if self.no_body or not data:
            out = head
        elif self.framing == "chunked":
            out = b"".join((head, b"%x\r\n" % len(data), data, b"\r\n"))
        elif self.framing == "length":
            room = self.length - self.written
            if len(data) > room:
                log.warning("%s: the application wrote more than its Content-Length", self.req.path)
                data = data[:room]
                self.keep_alive = False
            out = head + data if head else data
        else:
            out = head + data if head else data
        self.written += len(data)
        if out:
            self.conn.send(out, self.server.limits.send_timeout)

    def finish(self) -> None:
        if not self.head_sent:
            self.write(b"")
        if self.framing == "chunked" and not self.no_body:
            self.conn.send(b"0\r\n\r\n", self.server.limits.send_timeout)
        elif self.framing == "length" and not self.no_body and self.written != self.length:
            log.warning("%s: the application wrote less than its Content-Length", self.req.path)
            self.keep_alive = False


class WSGIServer:
    """Serve a WSGI application over HTTP/1.1; see the module docstring.

    ``serve_forever()`` runs the accept loop in the calling thread. For a graceful stop:
    ``stop_accepting()`` (the listening socket closes at once, idle keep-alive connections
    are closed, the others close after their current response), ``wait_idle(timeout)``
    (until no connection is open), ``close_all()`` (abort what is left: blocked writes and
    reads fail, so every open WSGI iterable is closed).
    """

    multithread = True

    def __init__(
        self,
        host: str,
        port: int,
        app: WSGIApp,
        limits: ServerLimits | None = None,
        *,
        server_software: str = "agui-adapter",
    ) -> None:
        self.app = app
        self.limits = limits or ServerLimits()
        self.draining = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._connections: dict[int, _Connection] = {}
        self._regular = 0
        self._reserve = 0
        self._accepting = True
        self._loop_done = threading.Event()
        self._loop_done.set()
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(self.limits.backlog)
        except OSError:
            sock.close()
            raise
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_port = self.server_address[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._base_environ = {
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,
            "SERVER_SOFTWARE": server_software,
            "SCRIPT_NAME": "",
            "SERVER_NAME": str(self.server_address[0]),
            "SERVER_PORT": str(self.server_port),
        }
        self._busy = _simple_response(
            503,
            "SERVER_BUSY",
            "The server is at its connection limit; retry shortly.",
            extra=[("Retry-After", str(self.limits.retry_after_seconds))],
        )

    # ================================================================== accept loop
    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept connections until ``stop_accepting()`` or ``shutdown()``."""
        del poll_interval  # accepted for compatibility with socketserver-style callers
        self._loop_done.clear()
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._wake_r, selectors.EVENT_READ)
            with self._lock:
                if not self._accepting:
                    return
                selector.register(self.socket, selectors.EVENT_READ)
            while self._accepting:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif self._accepting:
                        self._accept()
        finally:
            selector.close()
            self._loop_done.set()

    def _accept(self) -> None:
        try:
            sock, peer = self.socket.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:
            if not self._accepting:
                return
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                log.warning("cannot accept a connection: %s", exc.strerror)
                time.sleep(0.05)
                return
            raise
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        limits = self.limits
        evict: _Connection | None = None
        with self._lock:
            if self._regular >= limits.max_connections:
                evict = self._oldest_idle()
            if self._regular < limits.max_connections or evict is not None:
                reserve = False
            elif self._reserve < limits.reserve_connections:
                reserve = True
            else:
                reserve = None
            if reserve is not None:
                conn = _Connection(sock, peer, reserve)
                self._connections[id(conn)] = conn
                if reserve:
                    self._reserve += 1
                else:
                    self._regular += 1
        if evict is not None:
            evict.abort()
        if reserve is None:
            self._refuse(sock)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name=f"http-{peer[1]}", daemon=True).start()
        except RuntimeError:  # can't start new thread
            self._forget(conn)
            self._refuse(sock)

    def _oldest_idle(self) -> _Connection | None:
        idle = [c for c in self._connections.values() if c.state == IDLE and not c.aborted and not c.reserve]
        if not idle:
            return None
        victim = min(idle, key=lambda c: c.opened)
        victim.aborted = True
        return victim

    def _refuse(self, sock: socket.socket) -> None:
        """Beyond the limit and the reserve: a 503 without reading the request, then close."""
        try:
            sock.setblocking(False)
            sock.send(self._busy)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(_RECV)  # what already arrived, so that the close does not reset it
        except OSError:
            pass
        finally:
            sock.close()

    # ================================================================== shutdown API
    def stop_accepting(self) -> None:
        """Close the listening socket now; close idle keep-alive connections; the others
        close after their current response (``Connection: close``)."""
        with self._lock:
            self._accepting = False
            self.draining = True
            idle = [c for c in self._connections.values() if c.state == IDLE]
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.socket.close()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for conn in idle:
            conn.abort()

    def connections(self) -> list[ConnectionInfo]:
        """The open connections (reserve ones included)."""
        with self._lock:
            return [c.info() for c in self._connections.values()]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no connection is open; False if some still are after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._connections:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def close_idle(self) -> int:
        """Close the keep-alive connections waiting for a request; how many there were."""
        with self._lock:
            idle = [c for c in self._connections.values() if c.state == IDLE]
        for conn in idle:
            conn.abort()
        return len(idle)

    def close_all(self) -> None:
        """Abort every open connection: reads and writes fail, each response ends and its
        WSGI iterable is closed by its own thread (at the application's next write)."""
        with self._lock:
            conns = list(self._connections.values())
        for conn in conns:
            conn.abort()

    def shutdown(self) -> None:
        """Stop accepting and wait for ``serve_forever`` to return (socketserver style)."""
        self.stop_accepting()
        self._loop_done.wait(5.0)

    def server_close(self) -> None:
        """Stop accepting and abort every connection (does not wait)."""
        if self._accepting:
            self.stop_accepting()
        self.close_all()
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> WSGIServer:  # noqa: PYI034 - typing.Self needs 3.11
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server_close()

    # ================================================================== a connection
    def _forget(self, conn: _Connection) -> None:
        with self._changed:
            if self._connections.pop(id(conn), None) is not None:
                if conn.reserve:
                    self._reserve -= 1
                else:
                    self._regular -= 1
            self._changed.notify_all()

    def _serve(self, conn: _Connection) -> None:
        limits = self.limits
        reader = _Reader(conn)
        try:
            deadline = conn.opened + (min(limits.request_timeout, 10.0) if conn.reserve else limits.request_timeout)
            while True:
                if conn.requests:
                    with self._lock:
                        if self.draining or conn.aborted:
                            break
                        conn.state = IDLE
                    if not reader.wait(limits.keepalive_timeout) or conn.aborted:
                        break
                    deadline = time.monotonic() + limits.request_timeout
                    conn.state = READING
                if not self._one_request(conn, reader, deadline):
                    break
        except Exception:  # noqa: BLE001 - a bug here must not kill the process
            log.exception("connection from %s failed", conn.peer)
        finally:
            self._close(conn)
            self._forget(conn)

    def _close(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            if conn.linger and not conn.aborted:
                sock.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + self.limits.linger_seconds
                left = self.limits.linger_bytes
                while left > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    conn.settimeout(remaining)
                    data = sock.recv(_RECV)
                    if not data:
                        break
                    left -= len(data)
        except OSError:
            pass
        finally:
            sock.close()

    def _answer(self, conn: _Connection, status: int, code: str, message: str) -> None:
        """A response of the server's own, then the connection closes."""
        conn.linger = True
        try:
            conn.send(_simple_response(status, code, message), min(self.limits.send_timeout, 5.0))
        except _PeerGone:
            conn.linger = False

    def _one_request(self, conn: _Connection, reader: _Reader, deadline: float) -> bool:
        """Read and answer one request; True when the connection stays open."""
        limits = self.limits
        try:
            head = reader.head(deadline, limits.max_header_bytes)
            if head is None:
                return False
            req = _parse_head(head, limits.max_headers)
        except _Deadline:
            if reader.buf:
                self._answer(conn, 408, "REQUEST_TIMEOUT", "The request did not arrive in time.")
            return False
        except _PeerGone:
            return False
        except _HTTPError as err:
            self._answer(conn, err.status, err.code, err.message)
            return False
        conn.requests += 1
        conn.path = req.path
        send_continue = None
        if (req.length or req.chunked) and req.version == "HTTP/1.1":
            if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in req.headers):
                send_continue = partial(conn.send, b"HTTP/1.1 100 Continue\r\n\r\n", limits.send_timeout)
        body = RequestBody(reader, deadline, req.length, req.chunked, send_continue)
        if conn.reserve and not (req.method in ("GET", "HEAD") and req.path in limits.reserve_paths):
            # beyond the limit: 503 SERVER_BUSY; a small body is read first so the close is clean
            conn.linger = not body.drain(limits.drain_bytes)
            try:
                conn.send(self._busy, min(limits.send_timeout, 5.0))
            except _PeerGone:
                conn.linger = False
            return False
        conn.state = ACTIVE
        response = _Response(self, conn, req, body)
        self._run_app(conn, req, body, response)
        return response.keep_alive and not conn.aborted

    def _environ(self, conn: _Connection, req: _Request, body: RequestBody) -> dict[str, Any]:
        environ = dict(self._base_environ)
        peer = conn.peer
        environ.update(
            {
                "REQUEST_METHOD": req.method,
                "PATH_INFO": unquote_to_bytes(req.path).decode("latin-1") if "%" in req.path else req.path,
                "QUERY_STRING": req.query,
                "REQUEST_URI": req.target,
                "RAW_URI": req.target,
                "SERVER_PROTOCOL": req.version,
                "REMOTE_ADDR": peer[0] if isinstance(peer, tuple) else "",
                "REMOTE_PORT": str(peer[1]) if isinstance(peer, tuple) else "",
                "wsgi.input": body,
            }
        )
        for name, value in req.headers:
            key = name.upper().replace("-", "_")
            if "_" in name:  # never let a header pose as another (Foo_Bar vs Foo-Bar)
                continue
            if key == "CONTENT_LENGTH":
                if req.chunked:
                    continue
            elif key != "CONTENT_TYPE":
                key = "HTTP_" + key
                if key in environ:
                    value = f"{environ[key]},{value}"
            environ[key] = value
        if req.chunked:
            environ.pop("CONTENT_LENGTH", None)
        return environ

    def _run_app(self, conn: _Connection, req: _Request, body: RequestBody, response: _Response) -> None:
        """Run the application for one request; its iterable's ``close()`` always runs."""
        environ = self._environ(conn, req, body)
        result: Iterable[bytes] | None = None
        try:
            result = self.app(environ, response.start_response)
            if req.method == "HEAD":
                if response.status is None:  # a lazy application answers in its first item
                    for _ in result:
                        if response.status is not None:
                            break
                response.write(b"")
            else:
                for data in result:
                    response.write(data)
            response.finish()
        except _PeerGone:
            response.keep_alive = False
            conn.linger = False
        except BodyError as err:
            response.keep_alive = False
            self._failed(conn, response, err.status, err.code, str(err), quiet=True)
        except Exception:  # noqa: BLE001 - the application failed: 500 if nothing was sent yet
            response.keep_alive = False
            if body.error is not None:
                err = body.error
                self._failed(conn, response, err.status, err.code, str(err), quiet=True)
            else:
                log.exception("%s %s failed", req.method, req.path)
                self._failed(conn, response, 500, "INTERNAL_ERROR", "The server failed to answer.", quiet=False)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - log it; the connection goes on
                    log.exception("closing the response of %s %s failed", req.method, req.path)
                    response.keep_alive = False

    def _failed(
        self, conn: _Connection, response: _Response, status: int, code: str, message: str, quiet: bool
    ) -> None:
        if response.head_sent:
            return  # the client sees a truncated response: the connection closes
        if code == "CLIENT_GONE":
            conn.linger = False
            return
        if quiet:
            log.info("%s from %s: %s", status, conn.peer[0] if isinstance(conn.peer, tuple) else conn.peer, message)
        self._answer(conn, status, code, message)


def make_server(host: str, port: int, app: WSGIApp, limits: ServerLimits | None = None) -> WSGIServer:
    """A bound, listening ``WSGIServer``; call ``serve_forever()`` to serve."""
    return WSGIServer(host, port, app, limits)
