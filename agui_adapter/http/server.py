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
runtime dependencies. Its wire rules, with no I/O, are ``rules.py``; the socket I/O of one
connection (timed reads and writes, ``wsgi.input``, the response writer) is
``connection.py``; one request (its head, the WSGI environ, the application's run, the
server's own JSON answers) is ``exchange.py``; the worker threads are warm threads
(``ops.warm_threads``, as the runs' kernel readers are), the waiting connections' deadlines
``deadlines.py``, the limits ``limits.py``; the listening socket (opening, accepting,
refusing beyond the limit) is ``listener.py``, and the answer of a small request on the I/O
thread ``inline.py``; this module is the server: the I/O thread, the connections and their
limits, and the shutdown API.

Threading model (waitress's, with one twist): one I/O thread (``serve_forever``) accepts
connections and watches every one that waits for a request, new or kept alive, with one
``select``; a waiting connection holds no thread, and its deadline (the request timeout for a
new one, the keep-alive timeout after a response) is a timer of that thread. When a request
arrives, the I/O thread reads what is there; if that is a whole request with a small body and
the application offers ``answer_inline(environ, start_response)`` (the adapter does: a refusal
before admission, ``/health``), it runs that on the I/O thread and sends the answer, head and
body, in one ``send``: the commonest short answers cost no thread hand-off at all. Otherwise
(no such method, it returns None, a partial request, a large or chunked body,
``Expect: 100-continue``, an answer larger than the socket takes at once) the connection goes
to a worker thread (a waiting one, else a new one), which serves it as a blocking server does
and hands it back to the I/O thread when it waits for its next request. An SSE stream holds
its worker. Every chunk the application
yields is written at once (``TCP_NODELAY``, no buffering), so heartbeats and deltas leave
when they are produced, and a write that fails (the client went away) or cannot make
progress for ``send_timeout`` seconds ends the response: the WSGI iterable's ``close()``
always runs, which is how the application notices a client that left. A stream that writes
nothing while it waits need not wait for a write to fail: the environ's ``agui.client_gone``
(``connection.CLIENT_GONE_KEY``) tells it, without blocking, that the client hung up, and
``agui.client_watch`` (``connection.CLIENT_WATCH_KEY``) has the I/O thread watch the socket
during the response and say so the moment it happens (``watch``), so that a waiting stream
need not wake up to ask.

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

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from enum import Enum

from agui_adapter.http import inline, listener
from agui_adapter.http.connection import (
    RECV,
    Connection,
    ConnectionInfo,
    ConnState,
    PeerGone,
    Reader,
)
from agui_adapter.http.deadlines import FOREVER, Deadlines
from agui_adapter.http.exchange import Exchanges, InlineAnswer, WSGIApp
from agui_adapter.http.inline import Step
from agui_adapter.http.limits import ServerLimits
from agui_adapter.http.rules import (
    error_response,
    http_date,
)
from agui_adapter.ops.warm_threads import WarmThreads

log = logging.getLogger("agui_adapter.http.server")

IDLE_WORKERS = 32
"""Worker threads kept waiting for the next request; more exit once done."""
WORKER_IDLE_SECONDS = 30.0
"""A waiting worker exits after this long without a request."""


_LONGEST_WAIT = 3600.0  # one select() (a deadline years away is waited for an hour at a time)
_KERNEL_REGISTRATION = tuple(
    getattr(selectors, name)
    for name in ("EpollSelector", "KqueueSelector", "DevpollSelector")
    if hasattr(selectors, name)
)
"""Selectors whose registrations reach a ``select()`` already waiting (the kernel holds the set)."""


class _Watch:
    """A response's socket watched by the I/O thread for a hang-up (``WSGIServer.watch``)."""

    __slots__ = ("conn", "notify")

    def __init__(self, conn: Connection, notify: Callable[[bool], None]) -> None:
        self.conn = conn
        self.notify = notify


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
        self._looping = False
        self._selector = selectors.DefaultSelector()
        self._wake_on_park = not isinstance(self._selector, _KERNEL_REGISTRATION)
        self._parked: dict[int, Connection] = {}  # id -> connection waiting on the I/O thread
        self._watches: dict[int, _Watch] = {}  # id -> a response's connection watched for a hang-up
        self._deadlines = Deadlines()
        self._next_wake = FOREVER  # the deadline the I/O thread sleeps until
        self._workers = WarmThreads(idle_seconds=WORKER_IDLE_SECONDS, max_idle=IDLE_WORKERS, name="http-worker")
        self.socket = sock = listener.listen(host, port, self.limits.backlog)
        self.server_address = sock.getsockname()
        self.server_port = self.server_address[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._base_environ = listener.base_environ(self.server_address, self.server_port, server_software)
        self._busy = error_response(
            503,
            "SERVER_BUSY",
            "The server is at its connection limit; retry shortly.",
            http_date(time.time()),
            [("Retry-After", str(self.limits.retry_after_seconds))],
        )
        self._exchanges = Exchanges(
            app, self.limits, self._base_environ, self._busy, self._closing, (self.watch, self._unwatch)
        )
        self._inline: InlineAnswer | None = None
        self.app = app
        served_by = getattr(app, "served_by", None)
        if callable(served_by):  # the app may watch the server (its open connections, for /metrics)
            served_by(self)

    @property
    def app(self) -> WSGIApp:
        """The WSGI application; its ``answer_inline``, when it has one, runs on the I/O thread."""
        return self._exchanges.app

    @app.setter
    def app(self, app: WSGIApp) -> None:
        self._exchanges.app = app
        inline = getattr(app, "answer_inline", None)
        self._inline = inline if callable(inline) else None

    # ================================================================== the I/O thread
    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept and serve connections until ``stop_accepting()`` or ``shutdown()`` (then
        until the last waiting keep-alive connection is closed)."""
        del poll_interval  # accepted for compatibility with socketserver-style callers
        selector = self._selector
        with self._lock:
            if not self._accepting or self._looping:
                return
            self._looping = True
            self._loop_done.clear()
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.register(self.socket, selectors.EVENT_READ)
        listening = True
        try:
            while True:
                timeout = self._expire()
                for key, _ in selector.select(timeout):
                    conn = key.data
                    if conn.__class__ is _Watch:
                        self._watched(conn)
                    elif conn is not None:
                        self._readable(conn)
                    elif key.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif self._accepting:
                        self._accept()
                with self._lock:
                    if not self._accepting:
                        if listening:
                            listening = False
                            selector.unregister(self.socket)
                        if not self._parked:
                            self._looping = False
                            break
        finally:
            with self._lock:
                self._looping = False
                left = list(self._parked.values())
                self._parked.clear()
                self._deadlines.clear()
                lapsed = list(self._watches.values())
                self._watches.clear()
                for watch in lapsed:
                    watch.conn.watch = None
            for conn in left:
                self._close(conn)
            for watch in lapsed:  # nobody watches their sockets now: they ask again
                self._tell(watch, False)
            selector.close()
            self._loop_done.set()

    def _accept(self) -> None:
        accepted = listener.accept(self.socket, lambda: self._accepting)
        if accepted is None:
            return
        sock, peer = accepted
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
            listener.refuse(sock, self._busy)
            return
        timeout = min(limits.request_timeout, 10.0) if conn.reserve else limits.request_timeout
        with self._lock:
            parked = self._park(conn, conn.opened + timeout)
        if not parked:  # the server stopped meanwhile
            self._close(conn)

    # ------------------------------------------------------------------ waiting connections
    def _park(self, conn: Connection, deadline: float) -> bool:
        """Hand a connection with no request pending to the I/O thread, until ``deadline``;
        False when the server no longer keeps idle connections. Called with the lock held."""
        if not self._looping or not self._accepting or conn.aborted:
            return False
        conn.state = ConnState.IDLE if conn.requests else ConnState.READING  # a new one awaits its first
        self._parked[id(conn)] = conn
        self._deadlines.set(conn, deadline, len(self._parked))
        try:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        except (KeyError, ValueError, OSError):  # closed meanwhile
            self._parked.pop(id(conn), None)
            self._deadlines.cancel(conn)
            return False
        if self._wake_on_park or deadline < self._next_wake:
            self._wake()
        return True

    def _unpark(self, conn: Connection) -> None:
        """Take a connection off the I/O thread's watch (on the I/O thread)."""
        with self._lock:
            self._parked.pop(id(conn), None)
            self._deadlines.cancel(conn)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    # ------------------------------------------------------------------ responses watched
    def watch(self, conn: Connection, notify: Callable[[bool], None]) -> bool:
        """Watch a connection serving a response for a hang-up (``CLIENT_WATCH_KEY``):
        ``notify(gone)`` once, on the I/O thread, until the response ends (``_unwatch``);
        False when the server cannot (its loop is not running, or it watches already)."""
        with self._lock:
            if not self._looping or conn.aborted or conn.watch is not None:
                return False
            watch = _Watch(conn, notify)
            try:
                self._selector.register(conn.sock, selectors.EVENT_READ, watch)
            except (KeyError, ValueError, OSError):  # closed meanwhile
                return False
            conn.watch = self._watches[id(conn)] = watch
        if self._wake_on_park:
            self._wake()
        return True

    def _unwatch(self, conn: Connection) -> None:
        """The response is over: its socket is not watched any more (before it is parked)."""
        self._end_watch(conn, conn.watch)

    def _watched(self, watch: _Watch) -> None:
        """A watched socket is readable: the client hung up, or sent bytes behind its request
        (then it is not watched any more: they would keep it readable). Said once, either way."""
        if self._end_watch(watch.conn, watch):  # else the response ended meanwhile
            self._tell(watch, watch.conn.hung_up())

    def _end_watch(self, conn: Connection, watch: _Watch | None) -> bool:
        """Stop watching ``conn``'s socket if ``watch`` is still its watch; whether it was."""
        with self._lock:
            if watch is None or conn.watch is not watch:
                return False
            conn.watch = None
            self._watches.pop(id(conn), None)
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        return True

    @staticmethod
    def _tell(watch: _Watch, gone: bool) -> None:
        try:
            watch.notify(gone)
        except Exception:  # noqa: BLE001 - a bug there must not stop the I/O thread
            log.exception("telling a response of %s that its client hung up failed", watch.conn.peer)

    def _renew(self, conn: Connection, deadline: float) -> None:
        """A new deadline for a connection that stays on the I/O thread."""
        with self._lock:
            self._deadlines.set(conn, deadline, len(self._parked))
        conn.state = ConnState.IDLE

    def _expire(self) -> float | None:
        """Close the waiting connections whose deadline passed; seconds to the next deadline."""
        now = time.monotonic()
        with self._lock:
            expired = self._deadlines.expired(now)
            self._next_wake = self._deadlines.earliest()
        for conn in expired:
            self._unpark(conn)
            self._close(conn)
        return None if self._next_wake == FOREVER else min(max(0.0, self._next_wake - now), _LONGEST_WAIT)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _close(self, conn: Connection) -> None:
        """Close a connection that needs no lingering read (the I/O thread never waits)."""
        conn.linger = False
        conn.close(0.0, 0)
        self._forget(conn)

    def _readable(self, conn: Connection) -> None:
        """A waiting connection has bytes (or was closed): answer at once or hand it to a worker."""
        reader = conn.reader
        try:
            data = conn.sock.recv(RECV)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or conn.aborted or (self.draining and conn.requests):
            self._unpark(conn)
            self._close(conn)
            return
        reader.buf += data
        first = conn.requests == 0
        if first:
            limit = min(self.limits.request_timeout, 10.0) if conn.reserve else self.limits.request_timeout
            deadline = conn.opened + limit
        else:
            deadline = time.monotonic() + self.limits.request_timeout
        if self._inline is not None and not conn.reserve and self._answer_inline(conn, reader, deadline):
            return
        self._unpark(conn)
        self._dispatch(conn, reader, deadline, None)

    def _answer_inline(self, conn: Connection, reader: Reader, deadline: float) -> bool:
        """Answer a whole, small request on the I/O thread when the application can without
        blocking (``inline.py``); False when a worker must serve it (nothing is changed then)."""
        assert self._inline is not None
        step, pending = inline.answer(conn, reader, deadline, self.limits, self._exchanges, self._inline, self._closing)
        if step is Step.WORKER:
            return False
        if step is Step.KEEP:
            self._renew(conn, time.monotonic() + self.limits.keepalive_timeout)
            return True
        self._unpark(conn)
        if step is Step.HAND_OVER:  # the rest of the answer, the next request pipelined, or a lingering close
            self._dispatch(conn, reader, time.monotonic() + self.limits.request_timeout, pending)
        else:
            self._close(conn)
        return True

    # ------------------------------------------------------------------ workers
    def _dispatch(self, conn: Connection, reader: Reader, deadline: float, pending: tuple[bytes, bool] | None) -> None:
        """Serve the connection on a worker thread (``ops.warm_threads``)."""
        conn.state = ConnState.READING
        if not self._workers.run(lambda: self._serve(conn, reader, deadline, pending)):
            conn.abort()
            self._close(conn)

    def _oldest_idle(self) -> Connection | None:
        idle = [c for c in self._connections.values() if c.state is ConnState.IDLE and not c.aborted and not c.reserve]
        if not idle:
            return None
        victim = min(idle, key=lambda c: c.opened)
        victim.aborted = True
        return victim

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

    def _serve(self, conn: Connection, reader: Reader, deadline: float, pending: tuple[bytes, bool] | None) -> None:
        """Serve a connection on this worker until it closes or waits for its next request
        (then it goes back to the I/O thread). ``pending``: the rest of an answer the I/O
        thread could not send at once, and whether the connection stays open after it."""
        limits = self.limits
        parked = False
        try:
            if pending is not None:
                data, keep = pending
                if data:
                    conn.send(data, limits.send_timeout)
                if not keep:
                    return
            elif not self._exchanges.one_request(conn, reader, deadline):
                return
            while True:
                with self._lock:
                    if self.draining or conn.aborted:
                        return
                    if not reader.buf:
                        parked = self._park(conn, time.monotonic() + limits.keepalive_timeout)
                        return
                conn.state = ConnState.READING  # the next request was pipelined behind this one
                if not self._exchanges.one_request(conn, reader, time.monotonic() + limits.request_timeout):
                    return
        except PeerGone:
            conn.linger = False
        except Exception:  # noqa: BLE001 - a bug here must not kill the process
            log.exception("connection from %s failed", conn.peer)
        finally:
            if not parked:
                conn.close(limits.linger_seconds, limits.linger_bytes)
                self._forget(conn)

    def _closing(self) -> bool:
        return self.draining


def make_server(host: str, port: int, app: WSGIApp, limits: ServerLimits | None = None) -> WSGIServer:
    """A bound, listening ``WSGIServer``; call ``serve_forever()`` to serve."""
    return WSGIServer(host, port, app, limits)
