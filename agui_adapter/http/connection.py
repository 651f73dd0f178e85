"""The socket I/O of one connection of the built-in server: timed reads and writes, ``wsgi.input``.

Why it exists: the server (``server.py``) decides which connections live and runs the
application; this module is what a worker does with one connection's socket. Every read
is bounded by the request's absolute deadline (a client that trickles its request byte by
byte does not reset it, unlike a per-``recv`` timeout), every write by the send timeout
(a client that stops reading is gone), and another thread can ``abort`` a connection to
wake its owner out of either. The socket is non-blocking: each call is made at once and
``poll()`` waits only when it would block (a timed Python socket polls before every call and
changes its timeout with an ``ioctl``: twice the system calls, each a hand-off of the GIL
among the server's threads). ``RequestBody`` is ``wsgi.input``: exactly the request's
body, decoded by the wire rules of ``rules.py``, then EOF; a failure is remembered so
that the server answers it (408, 400) whatever the application does with it. ``Response``
is the other way: ``start_response`` and every chunk written at once, framed as
``rules.plan_response`` decides.

While the application holds a request, it may ask whether the client hung up
(``Connection.hung_up``, offered in the environ as ``CLIENT_GONE_KEY``): a stream that waits
for its next event writes nothing, so without asking it would only learn of a client that left
when a later write fails (a heartbeat interval or more). Asking never blocks and never reads:
bytes the client pipelined behind its request are not a hang-up.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from agui_adapter.http.rules import (
    LAST_CHUNK,
    BodyFraming,
    ChunkedDecoder,
    Framing,
    ProtocolError,
    Request,
    ResponseHead,
    encode_chunk,
    http_date,
    plan_response,
    take_head,
)

log = logging.getLogger("agui_adapter.http.server")  # one log for the whole built-in server

RECV = 65536
"""Bytes asked of one ``recv``."""
_LONGEST_POLL_MS = 2**31 - 1  # poll() takes a C int: a longer wait (a timeout of years) is cut to 24 days
#: The environ key of ``Connection.hung_up`` (a call, no argument, True once the client left).
CLIENT_GONE_KEY = "agui.client_gone"
#: The environ key of the built-in server's offer to tell the application when its client hangs
#: up: ``watch(notify) -> bool``, True when the server took it; then ``notify(gone)`` is called
#: once, on the server's I/O thread, while the response lasts: ``gone`` True when the client
#: closed or reset the connection, False when the server stopped watching for another reason
#: (bytes pipelined behind the request, the server's loop ending): ask ``CLIENT_GONE_KEY`` again.
#: ``notify`` must not block. Absent under other servers, and on the server's I/O thread.
CLIENT_WATCH_KEY = "agui.client_watch"
#: The environ key of what the application left in the environ when it declined to answer a
#: request on the I/O thread (``answer_inline`` returned None): offered again in the environ
#: of the same request on its worker, so that the work done while declining (the checks of a
#: body already parsed) is not done twice. Absent when there is nothing to carry.
INLINE_CARRY_KEY = "agui.inline_carry"
# Linux says "the peer closed its side" (POLLRDHUP) even with unread bytes in the buffer;
# elsewhere a readable socket is peeked at: no bytes at all is the end of the stream.
_RDHUP = getattr(select, "POLLRDHUP", 0)
_HANGUP_EVENTS = select.POLLHUP | select.POLLERR | (_RDHUP or select.POLLIN)


class ConnState(str, Enum):
    """Where a connection stands (a ``str`` enum: a member equals its value, ``"idle"``)."""

    IDLE = "idle"
    """Waiting for the next request of a keep-alive connection (or the first of a new one)."""
    READING = "reading"
    """A request's line, headers (and body) are arriving."""
    ACTIVE = "active"
    """The application has the request."""


class BodyError(OSError):
    """Reading ``wsgi.input`` failed: the request timed out, the chunking is broken, or the
    client went away. The server answers the request itself (``status``) and closes."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PeerGone(Exception):
    """The client closed the connection or it failed."""


class Deadline(Exception):
    """The request's deadline passed."""


@dataclass(frozen=True)
class ConnectionInfo:
    """A snapshot of one open connection (see ``WSGIServer.connections``)."""

    peer: str
    state: ConnState
    reserve: bool
    opened: float
    requests: int
    path: str


class Connection:
    """One accepted socket, owned by one thread (others may only ``abort`` it)."""

    __slots__ = (
        "sock",
        "peer",
        "reserve",
        "state",
        "opened",
        "requests",
        "path",
        "linger",
        "aborted",
        "reader",
        "ticket",
        "carry",
        "watch",
        "_polls",
    )

    def __init__(self, sock: socket.socket, peer: Any, reserve: bool) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.peer = peer
        self.reserve = reserve
        self.state = ConnState.READING
        self.opened = time.monotonic()
        self.requests = 0
        self.path = ""
        self.linger = False
        self.aborted = False
        self.reader = Reader(self)
        """Its buffered reads (bytes read past a request are the next one's)."""
        self.ticket = 0
        """While it waits on the server's I/O thread, which of its deadlines is current (else 0)."""
        self.carry: Any = None
        """What the application left when it declined its request on the I/O thread, for the
        same request's environ on its worker (``INLINE_CARRY_KEY``)."""
        self.watch: Any = None
        """While the server's I/O thread watches it for a hang-up during a response, the watch."""
        self._polls: dict[int, select.poll] = {}

    def ready(self, events: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the socket to be readable (``POLLIN``) or
        writable (``POLLOUT``); a closed or aborted socket counts as ready (its next call fails)."""
        poller = self._polls.get(events)
        if poller is None:
            poller = self._polls[events] = select.poll()
            poller.register(self.sock, events)
        return bool(poller.poll(min(max(0, math.ceil(timeout * 1000)), _LONGEST_POLL_MS)))

    def hung_up(self) -> bool:
        """Whether the client closed (or reset) the connection; never blocks, reads nothing,
        and any thread may ask. Once it has, the connection is aborted, so the response's
        next write fails at once."""
        if self.aborted:
            return True
        poller = select.poll()  # its own (any thread may ask; one poll object is not shared)
        try:
            poller.register(self.sock, _HANGUP_EVENTS)
        except (OSError, ValueError):  # closed meanwhile
            return True
        ready = poller.poll(0)
        if not ready:
            return False
        mask = ready[0][1]
        gone = bool(mask & (select.POLLHUP | select.POLLERR | _RDHUP))
        if not gone and mask & select.POLLIN:  # no POLLRDHUP here: bytes, or the end?
            try:
                gone = not self.sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
        if gone:
            self.abort()
        return gone

    def send(self, data: bytes, timeout: float) -> None:
        """Write everything; a write that makes no progress for ``timeout`` seconds fails."""
        view = memoryview(data)
        try:
            while view:
                try:
                    sent = self.sock.send(view)
                except BlockingIOError:
                    if not self.ready(select.POLLOUT, timeout):
                        raise TimeoutError("timed out") from None
                    continue
                view = view[sent:]
        except OSError as exc:  # timeout, reset, broken pipe, or aborted by the server
            raise PeerGone(str(exc) or type(exc).__name__) from None

    def abort(self) -> None:
        """Wake the owning thread out of any read or write; it closes the socket."""
        self.aborted = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self, linger_seconds: float, linger_bytes: int) -> None:
        """Close the socket; after an answer to a request whose body was not read (``linger``),
        first read and drop what the client still sends, up to ``linger_bytes`` for
        ``linger_seconds``, so that the close does not reset the answer away."""
        sock = self.sock
        try:
            if self.linger and not self.aborted:
                sock.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + linger_seconds
                left = linger_bytes
                while left > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self.ready(select.POLLIN, remaining):
                        break
                    try:
                        data = sock.recv(RECV)
                    except BlockingIOError:
                        continue
                    if not data:
                        break
                    left -= len(data)
        except OSError:
            pass
        finally:
            sock.close()

    def info(self) -> ConnectionInfo:
        peer = self.peer[0] if isinstance(self.peer, tuple) else str(self.peer)
        return ConnectionInfo(peer, self.state, self.reserve, self.opened, self.requests, self.path)


class Reader:
    """Buffered reads from a connection, each bounded by an absolute deadline."""

    __slots__ = ("conn", "buf")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.buf = b""

    def _recv(self, deadline: float) -> bytes:
        conn = self.conn
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Deadline
            try:
                data = conn.sock.recv(RECV)
            except BlockingIOError:
                if not conn.ready(select.POLLIN, remaining):
                    raise Deadline from None
                continue
            except OSError as exc:
                raise PeerGone(str(exc)) from None
            if not data:
                raise PeerGone("closed by the client")
            return data

    def head(self, deadline: float, limit: int) -> bytes | None:
        """The request line and headers, through the blank line; None on a clean close.
        ``ProtocolError`` when they outgrow ``limit``."""
        scanned = 0
        while True:
            head, self.buf = take_head(self.buf, limit, scanned)
            if head is not None:
                return head
            scanned = len(self.buf)
            try:
                data = self._recv(deadline)
            except PeerGone:
                if not self.buf:
                    return None
                raise
            self.buf += data

    def some(self, size: int, deadline: float) -> bytes:
        """Between 1 and ``size`` bytes."""
        if not self.buf:
            self.buf = self._recv(deadline)
        data, self.buf = self.buf[:size], self.buf[size:]
        return data

    def unread(self, data: bytes) -> None:
        """Put back bytes read past the end of a request (the next one's)."""
        self.buf = data + self.buf


class RequestBody:
    """``wsgi.input``: exactly the request's body (``Content-Length`` or chunked), then EOF.

    Reads are bounded by the request's deadline; a failure raises ``BodyError`` and is
    remembered, so that the server answers it (408, 400) whatever the application does.
    """

    __slots__ = (
        "_reader",
        "_deadline",
        "_remaining",
        "_chunks",
        "_send_continue",
        "done",
        "error",
        "_consumed",
        "_pushback",
    )

    def __init__(
        self,
        reader: Reader,
        deadline: float,
        framing: BodyFraming,
        send_continue: Callable[[], None] | None,
    ) -> None:
        self._reader = reader
        self._deadline = deadline
        self._remaining = framing.length or 0
        self._chunks = ChunkedDecoder() if framing.chunked else None
        self._send_continue = send_continue
        self.done = not framing.chunked and not framing.length
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
        return None if self._chunks is not None else self._remaining

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
        return self._guard(self._read_length if self._chunks is None else self._read_chunked, want)

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
        if self._chunks is None and self._remaining > limit:
            return False
        start = self._consumed
        try:
            while not self.done and self._consumed - start <= limit:
                self.read(RECV)
        except BodyError:
            return False
        return self.done

    # ------------------------------------------------------------------ internals
    def _fail(self, status: int, code: str, message: str) -> BodyError:
        self.error = BodyError(status, code, message)
        return self.error

    def _guard(self, reader: Callable[[int], bytes], want: int) -> bytes:
        gone = "The client went away before its body arrived."
        if self._send_continue is not None:
            send, self._send_continue = self._send_continue, None
            try:
                send()
            except PeerGone:
                raise self._fail(400, "CLIENT_GONE", gone) from None
        try:
            data = reader(want)
        except Deadline:
            raise self._fail(408, "REQUEST_TIMEOUT", "The request body did not arrive in time.") from None
        except PeerGone:
            raise self._fail(400, "CLIENT_GONE", gone) from None
        except ProtocolError as err:  # the chunked framing is broken
            raise self._fail(err.status, err.code, err.message) from None
        self._consumed += len(data)
        return data

    def _read_length(self, want: int) -> bytes:
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
        reader, chunks = self._reader, self._chunks
        assert chunks is not None
        parts = []
        while want != 0:
            data = chunks.read(want)
            if data is None:
                chunks.feed(reader.some(RECV, self._deadline))
            elif not data:  # the last chunk and the trailers are in
                self.done = True
                reader.unread(chunks.unused)
                break
            else:
                parts.append(data)
                if want > 0:
                    want -= len(data)
        return b"".join(parts)


class Response:
    """One response: ``start_response``, its head (``rules.plan_response``), the writes, and
    whether the connection survives."""

    __slots__ = (
        "conn",
        "req",
        "body",
        "send_timeout",
        "drain_bytes",
        "closing",
        "status",
        "headers",
        "head",
        "keep_alive",
        "written",
        "out",
    )

    def __init__(
        self,
        conn: Connection,
        req: Request,
        body: RequestBody,
        send_timeout: float,
        drain_bytes: int,
        closing: Callable[[], bool],
        out: list[bytes] | None = None,
    ) -> None:
        self.conn = conn
        self.req = req
        self.body = body
        self.send_timeout = send_timeout
        self.drain_bytes = drain_bytes
        self.closing = closing
        """Whether the server closes connections after their response (it is draining)."""
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.head: ResponseHead | None = None
        """Once sent."""
        self.keep_alive = req.keep_alive
        self.written = 0
        self.out = out
        """When a list, what is written is kept there (to be sent at once by the caller) instead of sent."""

    @property
    def head_sent(self) -> bool:
        return self.head is not None

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

    def _head(self) -> ResponseHead:
        """Decide the head (framing and keep-alive); a request body left unread is drained or
        the connection closes after a lingering read."""
        assert self.status is not None
        body = self.body
        if body.error is not None:  # the application answered a request whose body failed
            raise body.error
        head = plan_response(self.status, self.headers, self.req)
        if not self.keep_alive or self.closing() or self.conn.reserve:
            head.keep_alive = False
        if not body.done:  # the application did not read the whole body
            if body.continue_pending:
                head.keep_alive = False
                self.conn.linger = True
            elif not body.drain(self.drain_bytes):
                if body.error is not None and body.error.code == "CLIENT_GONE":
                    raise body.error
                head.keep_alive = False
                self.conn.linger = True
        self.keep_alive = head.keep_alive
        return head

    def write(self, data: bytes) -> None:
        if self.status is None:
            raise AssertionError("write() before start_response()")
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("a WSGI application must yield bytes")
        head = self.head
        if head is None:
            head = self.head = self._head()
            first = head.encode(http_date(time.time()))
        elif not data:
            return
        else:
            first = b""
        if head.no_body or not data:
            out = first
        elif head.framing is Framing.CHUNKED:
            out = encode_chunk(data, first)
        else:
            if head.framing is Framing.LENGTH and len(data) > head.length - self.written:
                log.warning("%s: the application wrote more than its Content-Length", self.req.path)
                data = data[: head.length - self.written]
                self.keep_alive = False
            out = first + data if first else data
        self.written += len(data)
        if out:
            self.send(out)

    def send(self, data: bytes) -> None:
        """Send bytes of this response (or keep them in ``out``)."""
        if self.out is not None:
            self.out.append(data)
        else:
            self.conn.send(data, self.send_timeout)

    def finish(self) -> None:
        if self.head is None:
            self.write(b"")
        assert self.head is not None
        if self.head.framing is Framing.CHUNKED:
            self.send(LAST_CHUNK)
        elif self.head.framing is Framing.LENGTH and self.written != self.head.length:
            log.warning("%s: the application wrote less than its Content-Length", self.req.path)
            self.keep_alive = False
