"""The HTTP/1.1 server ``python run.py`` uses: a WSGI app, threaded, one thread per connection.

Why it exists: Werkzeug's development server closes the connection after every response,
has no timeout (a client that trickles its request holds a thread for ever), no bound on
connections, and a listen backlog of 128. This module serves the same WSGI application
(unchanged: it still runs under gunicorn, waitress or mod_wsgi) with keep-alive, a
deadline for the whole request, a send timeout, a connection limit with a reserve for
``/health``, and a shutdown API for graceful stops.

Why this base: the standard library's ``socket``, ``selectors`` and ``threading``, with
HTTP/1.1 framing written in this package. Werkzeug's ``WSGIRequestHandler.run_wsgi`` is one method
that hard-codes ``Connection: close`` and drains request bodies by reading until the
socket goes quiet, and ``http.server.BaseHTTPRequestHandler`` (its base, and
``wsgiref``'s) reads the request through a buffered file whose timeout is per ``recv``,
so a slow-loris client resets it with every byte; neither has a send timeout or a
connection limit. Keeping them would have meant overriding their core and living with
their private details; the protocol subset a WSGI server needs (request line, headers,
``Content-Length``/chunked bodies, chunked or length-framed responses) is small enough to
own, test (the rules without sockets, the server over real ones), and keep free of new
runtime dependencies. Its wire rules, with no I/O, are ``http11.py``; the socket I/O of one
connection (timed reads and writes, ``wsgi.input``, the response writer) is
``connection.py``; this module is the server: the accept loop, the connections and their
limits, a thread each, the WSGI environ and the application's run, and the shutdown API.

Threading model: an accept loop hands every connection to its own thread, which
serves its requests in turn; an SSE stream holds its thread. Every chunk the application
yields is written at once (``TCP_NODELAY``, no buffering), so heartbeats and deltas leave
when they are produced, and a write that fails (the client went away) or cannot make
progress for ``send_timeout`` seconds ends the response: the WSGI iterable's ``close()``
always runs, which is how the application notices a client that left. A stream that writes
nothing while it waits need not wait for a write to fail: the environ's ``agui.client_gone``
(``connection.CLIENT_GONE_KEY``) tells it, without blocking, that the client hung up.

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
import logging
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

from agui_adapter.http.connection import (
    CLIENT_GONE_KEY,
    RECV,
    BodyError,
    Connection,
    ConnectionInfo,
    ConnState,
    Deadline,
    PeerGone,
    Reader,
    RequestBody,
    Response,
)
from agui_adapter.http.rules import CONTINUE, ProtocolError, Request, error_response, http_date, parse_request_head
from agui_adapter.ops.faults import describe

log = logging.getLogger("agui_adapter.http.server")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


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


class Slot(Enum):
    """The place an accepted connection gets: within the limit, in the reserve, or none (503)."""

    REGULAR = "regular"
    RESERVE = "reserve"
    NONE = "none"


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
        self._connections: dict[int, Connection] = {}
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
        self._busy = error_response(
            503,
            "SERVER_BUSY",
            "The server is at its connection limit; retry shortly.",
            http_date(time.time()),
            [("Retry-After", str(self.limits.retry_after_seconds))],
        )
        served_by = getattr(app, "served_by", None)
        if callable(served_by):  # the app may watch the server (its open connections, for /metrics)
            served_by(self)

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
        evict: Connection | None = None
        with self._lock:
            if self._regular >= limits.max_connections:
                evict = self._oldest_idle()
            if self._regular < limits.max_connections or evict is not None:
                slot = Slot.REGULAR
            elif self._reserve < limits.reserve_connections:
                slot = Slot.RESERVE
            else:
                slot = Slot.NONE
            if slot is not Slot.NONE:
                conn = Connection(sock, peer, slot is Slot.RESERVE)
                self._connections[id(conn)] = conn
                if conn.reserve:
                    self._reserve += 1
                else:
                    self._regular += 1
        if evict is not None:
            evict.abort()
        if slot is Slot.NONE:
            self._refuse(sock)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name=f"http-{peer[1]}", daemon=True).start()
        except RuntimeError:  # can't start new thread
            self._forget(conn)
            self._refuse(sock)

    def _oldest_idle(self) -> Connection | None:
        idle = [c for c in self._connections.values() if c.state is ConnState.IDLE and not c.aborted and not c.reserve]
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
            sock.recv(RECV)  # what already arrived, so that the close does not reset it
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
            idle = [c for c in self._connections.values() if c.state is ConnState.IDLE]
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

    def open_connections(self) -> int:
        """How many connections are open (reserve ones included); cheap enough for every scrape."""
        with self._lock:
            return self._regular + self._reserve

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
            idle = [c for c in self._connections.values() if c.state is ConnState.IDLE]
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
    def _forget(self, conn: Connection) -> None:
        with self._changed:
            if self._connections.pop(id(conn), None) is not None:
                if conn.reserve:
                    self._reserve -= 1
                else:
                    self._regular -= 1
            self._changed.notify_all()

    def _serve(self, conn: Connection) -> None:
        limits = self.limits
        reader = Reader(conn)
        try:
            deadline = conn.opened + (min(limits.request_timeout, 10.0) if conn.reserve else limits.request_timeout)
            while True:
                if conn.requests:
                    with self._lock:
                        if self.draining or conn.aborted:
                            break
                        conn.state = ConnState.IDLE
                    if not reader.wait(limits.keepalive_timeout) or conn.aborted:
                        break
                    deadline = time.monotonic() + limits.request_timeout
                    conn.state = ConnState.READING
                if not self._one_request(conn, reader, deadline):
                    break
        except Exception:  # noqa: BLE001 - a bug here must not kill the process
            log.exception("connection from %s failed", conn.peer)
        finally:
            conn.close(self.limits.linger_seconds, self.limits.linger_bytes)
            self._forget(conn)

    def _answer(self, conn: Connection, status: int, code: str, message: str) -> None:
        """A response of the server's own, then the connection closes."""
        conn.linger = True
        try:
            answer = error_response(status, code, message, http_date(time.time()))
            conn.send(answer, min(self.limits.send_timeout, 5.0))
        except PeerGone:
            conn.linger = False

    def _one_request(self, conn: Connection, reader: Reader, deadline: float) -> bool:
        """Read and answer one request; True when the connection stays open."""
        limits = self.limits
        try:
            head = reader.head(deadline, limits.max_header_bytes)
            if head is None:
                return False
            req = parse_request_head(head, limits.max_headers)
        except Deadline:
            if reader.buf:
                self._answer(conn, 408, "REQUEST_TIMEOUT", "The request did not arrive in time.")
            return False
        except PeerGone:
            return False
        except ProtocolError as err:
            self._answer(conn, err.status, err.code, err.message)
            return False
        conn.requests += 1
        conn.path = req.path
        send_continue = partial(conn.send, CONTINUE, limits.send_timeout) if req.expects_continue else None
        body = RequestBody(reader, deadline, req.body, send_continue)
        if conn.reserve and not (req.method in ("GET", "HEAD") and req.path in limits.reserve_paths):
            # beyond the limit: 503 SERVER_BUSY; a small body is read first so the close is clean
            conn.linger = not body.drain(limits.drain_bytes)
            try:
                conn.send(self._busy, min(limits.send_timeout, 5.0))
            except PeerGone:
                conn.linger = False
            return False
        conn.state = ConnState.ACTIVE
        response = Response(conn, req, body, limits.send_timeout, limits.drain_bytes, closing=lambda: self.draining)
        self._run_app(conn, req, body, response)
        return response.keep_alive and not conn.aborted

    def _environ(self, conn: Connection, req: Request, body: RequestBody) -> dict[str, Any]:
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
                CLIENT_GONE_KEY: conn.hung_up,
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

    def _run_app(self, conn: Connection, req: Request, body: RequestBody, response: Response) -> None:
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
        except PeerGone:
            response.keep_alive = False
            conn.linger = False
        except BodyError as err:
            response.keep_alive = False
            self._failed(conn, response, err.status, err.code, str(err), quiet=True)
        except Exception as exc:  # noqa: BLE001 - the application failed: 500 if nothing was sent yet
            response.keep_alive = False
            if body.error is not None:
                err = body.error
                self._failed(conn, response, err.status, err.code, str(err), quiet=True)
            else:
                log.error("%s %.200s failed: %s", req.method, req.path, describe(exc))
                self._failed(conn, response, 500, "INTERNAL_ERROR", "The server failed to answer.", quiet=False)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - log it; the connection goes on
                    log.error("closing %s %.200s failed: %s", req.method, req.path, describe(exc))
                    response.keep_alive = False

    def _failed(self, conn: Connection, response: Response, status: int, code: str, message: str, quiet: bool) -> None:
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
