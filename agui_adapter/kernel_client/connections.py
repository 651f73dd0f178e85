"""The streaming calls' HTTP/1.1, on kept-alive sockets to an ``http://`` kernel.

Why this module exists: every run's way to its first delta goes through one POST to the
kernel and the head of its answer. ``http.client`` spent about 75 us of Python on that pair
(its request is put together header by header, and the answer's headers go through the
``email`` package's parser), and under a burst of runs each of its extra system calls (the
head and the body written apart, the buffered reader's) is one more hand-off of the GIL.
Here the request is one buffer written with one ``sendall``, the answer's head is split off
the first read and parsed with the server's own wire rules (``http.rules.take_head``,
``parse_response_head``, which h11 holds to account in ``tests/unit/test_kernel_connections.py``),
and the body is read from the socket as it comes. The unary calls (and an ``https://``
kernel) keep ``requests``.
"""

from __future__ import annotations

import re
import select
import socket
import struct
import threading
import time

from agui_adapter.http.rules import (
    ChunkedDecoder,
    Framing,
    ProtocolError,
    ResponseError,
    ResponseStart,
    is_token,
    parse_response_head,
    take_head,
)

#: The longest answer head read (the kernel's are a few hundred bytes).
MAX_HEAD = 64 * 1024
#: The largest answer body read whole (a JSON-RPC error instead of a stream).
MAX_BODY = 16 * 1024 * 1024
_READ = 65536
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


class WireError(Exception):
    """The kernel's answer could not be read: the connection broke or the bytes are not HTTP."""


def request_head(path: str, host: str, port: int, headers: dict[str, str]) -> bytes:
    """The fixed part of every streaming request's head, as ``http.client`` writes it (the
    ``Host`` without the default port, ``Accept-Encoding: identity``); a header value that
    could not be sent is a ``ValueError`` that does not show it (it may be the token)."""
    authority = f"[{host}]" if ":" in host else host
    if port != 80:
        authority = f"{authority}:{port}"
    lines = [f"POST {path} HTTP/1.1", f"Host: {authority}", "Accept-Encoding: identity"]
    lines += [_header_line(name, value) for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def _header_line(name: str, value: str) -> str:
    if not _HEADER_VALUE.fullmatch(value) or not is_token(name):
        raise ValueError(f"the {name!r} header holds a character no header may carry")
    return f"{name}: {value}"


def encode_request(head: bytes, extra: dict[str, str], body: bytes) -> bytes:
    """One request: ``head`` (``request_head``), the call's own headers, the length, the body."""
    lines = "".join(_header_line(name, value) + "\r\n" for name, value in extra.items()) if extra else ""
    return b"".join((head, lines.encode("latin-1"), b"Content-Length: %d\r\n\r\n" % len(body), body))


class KernelConnection:
    """One socket to the kernel, and the bytes read past the last thing parsed off it."""

    __slots__ = ("sock", "_pending")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = b""

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except BlockingIOError as exc:  # the socket's own send timeout (``bound``)
            raise TimeoutError("timed out") from exc

    def recv(self) -> bytes:
        """What the last parse left over, else one network read (``b""`` at the end)."""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        try:
            return self.sock.recv(_READ)
        except BlockingIOError as exc:  # the socket's own receive timeout (``bound``)
            raise TimeoutError("timed out") from exc

    def put_back(self, data: bytes) -> None:
        self._pending = data + self._pending

    @property
    def clean(self) -> bool:
        """Nothing was read past the last answer: the connection can carry another request."""
        return not self._pending

    def read_head(self) -> ResponseStart:
        """The answer's head (interim 1xx answers skipped); ``WireError`` when the connection
        ends first or the head is malformed or too long."""
        while True:
            buf = b""
            while True:
                data = self.recv()
                if not data:
                    raise WireError("the kernel closed the connection before its answer")
                scanned = len(buf)
                buf += data
                if buf[:1] in (b"\r", b"\n"):  # empty lines are skipped before a request only
                    raise WireError("the answer does not start with a status line")
                try:
                    head, rest = take_head(buf, MAX_HEAD, scanned)
                except ProtocolError as exc:
                    raise WireError("the answer's head is too long") from exc
                if head is not None:
                    break
                buf = rest
            self._pending = rest
            try:
                start = parse_response_head(head)
            except ResponseError as exc:
                raise WireError(f"the answer is not HTTP: {exc}") from exc
            if not 100 <= start.status < 200:
                return start
            if start.status == 101:
                raise WireError("the kernel switched protocols")

    def read_body(self, start: ResponseStart, limit: int = MAX_BODY) -> bytes:
        """The whole body of ``start``'s answer (at most ``limit`` bytes)."""
        parts: list[bytes] = []
        size = 0
        for data in self.body(start):
            size += len(data)
            if size > limit:
                raise WireError("the answer's body is too large")
            parts.append(data)
        return b"".join(parts)

    def body(self, start: ResponseStart):  # noqa: ANN201 - a generator of bytes
        """The body of ``start``'s answer, as it arrives (chunked bodies de-chunked, all that
        arrived with each read in one item); ``WireError`` when it breaks off."""
        if start.framing is Framing.NONE:
            return
        if start.framing is Framing.CHUNKED:
            decoder = ChunkedDecoder()
            try:
                while True:
                    data = self.recv()
                    if not data:
                        raise WireError("the kernel's answer broke off")
                    decoder.feed(data)
                    available = decoder.read_available()
                    if available:
                        yield available
                    if decoder.done:
                        self._pending = decoder.unused
                        return
            except ProtocolError as exc:
                raise WireError("the answer's chunked body is malformed") from exc
        if start.framing is Framing.LENGTH:
            left = start.length or 0
            while left:
                data = self.recv()
                if not data:
                    raise WireError("the kernel's answer broke off")
                if len(data) > left:
                    self.put_back(data[left:])
                    data = data[:left]
                left -= len(data)
                yield data
            return
        while True:  # up to the close
            data = self.recv()
            if not data:
                return
            yield data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class StreamConnections:
    """Kept-alive connections to one ``http://`` kernel, for streaming calls.

    A connection is taken for one call and given back only once its answer was read to
    the end; one idle for longer than ``max_idle`` seconds (the kernel's server closes idle
    connections after 5 s), or that the kernel closed meanwhile, is not used again."""

    def __init__(self, host: str, port: int, *, connect_timeout: float, read_timeout: float, size: int) -> None:
        self._host, self._port = host, port
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._size = size
        self._idle: list[tuple[KernelConnection, float]] = []
        self._lock = threading.Lock()
        self.max_idle = 2.0

    def take(self) -> tuple[KernelConnection, bool]:
        """A connection, and whether it served before."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    break
                connection, since = self._idle.pop()
            if now - since < self.max_idle and not _dropped(connection.sock):
                return connection, True
            connection.close()
        sock = socket.create_connection((self._host, self._port), timeout=self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            bound(sock, self._read_timeout)
        except OSError:
            sock.close()
            raise
        return KernelConnection(sock), False

    def give_back(self, connection: KernelConnection) -> None:
        if connection.clean:
            with self._lock:
                if len(self._idle) < self._size:
                    self._idle.append((connection, time.monotonic()))
                    return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()


def bound(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, each ``recv`` and ``send`` bounded by ``seconds`` of the system's
    own socket timeouts (``SO_RCVTIMEO``, ``SO_SNDTIMEO``: the call fails with ``EAGAIN``,
    which ``KernelConnection`` turns into ``TimeoutError``).

    Why not ``settimeout``: a timed Python socket polls before every call, one more system
    call per read of a stream that arrives a delta at a time, and under many runs one more
    hand-off of the GIL (a run's reader thread reads the kernel's stream a few hundred times a
    second). Where the options can't be set, ``settimeout`` does the job."""
    whole = int(seconds)
    timeval = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    except (AttributeError, OSError):
        sock.settimeout(seconds)
        return
    sock.settimeout(None)


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle connection was closed by the other end (readable means EOF or junk)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
