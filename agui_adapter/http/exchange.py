"""One request of a connection of the built-in server: read it, run the WSGI app, answer.

Why it exists: the server (``server.py``) decides where a request runs (on its I/O thread when
the application can answer at once, else on a worker) and what happens to the connection
after; this module is the request itself, wherever it runs: the head read and parsed
(``rules.py``), the reserve's 503, the WSGI environ, the application's run with its iterable
always closed, and the server's own JSON answers (400, 408, 500...) when something fails
before the application's answer began.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

from agui_adapter.http.connection import (
    CLIENT_GONE_KEY,
    CLIENT_WATCH_KEY,
    INLINE_CARRY_KEY,
    BodyError,
    Connection,
    ConnState,
    Deadline,
    PeerGone,
    Reader,
    RequestBody,
    Response,
)
from agui_adapter.http.limits import ServerLimits
from agui_adapter.http.rules import CONTINUE, ProtocolError, Request, error_response, http_date, parse_request_head
from agui_adapter.ops.faults import describe

log = logging.getLogger("agui_adapter.http.server")  # one log for the whole built-in server

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
InlineAnswer = Callable[[dict[str, Any], Callable[..., Any]], "Iterable[bytes] | None"]
#: The server's watch for a hang-up during a response (``CLIENT_WATCH_KEY``), and its end.
Watch = Callable[[Connection, Callable[[bool], None]], bool]
Unwatch = Callable[[Connection], None]


class Exchanges:
    """Serve one request at a time of any connection with ``app`` (see the module docstring)."""

    def __init__(
        self,
        app: WSGIApp,
        limits: ServerLimits,
        base_environ: dict[str, Any],
        busy: bytes,
        closing: Callable[[], bool],
        watch: tuple[Watch, Unwatch] | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self._base_environ = base_environ
        self._busy = busy
        """The 503 SERVER_BUSY answer of a reserve connection."""
        self._closing = closing
        """Whether connections close after their response (the server is draining)."""
        self._watch = watch
        """The server's watch for a hang-up, offered to a response on a worker (``CLIENT_WATCH_KEY``)."""

    def answer(self, conn: Connection, status: int, code: str, message: str) -> None:
        """A response of the server's own, then the connection closes."""
        conn.linger = True
        try:
            answer = error_response(status, code, message, http_date(time.time()))
            conn.send(answer, min(self.limits.send_timeout, 5.0))
        except PeerGone:
            conn.linger = False

    def one_request(self, conn: Connection, reader: Reader, deadline: float) -> bool:
        """Read and answer one request; True when the connection stays open."""
        limits = self.limits
        try:
            head = reader.head(deadline, limits.max_header_bytes)
            if head is None:
                return False
            req = parse_request_head(head, limits.max_headers)
        except Deadline:
            if reader.buf:
                self.answer(conn, 408, "REQUEST_TIMEOUT", "The request did not arrive in time.")
            return False
        except PeerGone:
            return False
        except ProtocolError as err:
            self.answer(conn, err.status, err.code, err.message)
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
        response = Response(conn, req, body, limits.send_timeout, limits.drain_bytes, self._closing)
        self.run_app(conn, req, body, response)
        return response.keep_alive and not conn.aborted

    def environ(self, conn: Connection, req: Request, body: RequestBody) -> dict[str, Any]:
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
        if conn.carry is not None:  # the same request, declined on the I/O thread a moment ago
            environ[INLINE_CARRY_KEY], conn.carry = conn.carry, None
        return environ

    def run_app(
        self, conn: Connection, req: Request, body: RequestBody, response: Response, inline: InlineAnswer | None = None
    ) -> bool:
        """Run the application for one request; its iterable's ``close()`` always runs.
        With ``inline`` (the application's ``answer_inline``), False when it declined."""
        environ = self.environ(conn, req, body)
        result: Iterable[bytes] | None = None
        try:
            if inline is not None:
                result = inline(environ, response.start_response)
                if result is None:
                    conn.carry = environ.get(INLINE_CARRY_KEY)  # for the same request on its worker
                    return False
            else:
                if self._watch is not None:
                    environ[CLIENT_WATCH_KEY] = partial(self._watch[0], conn)
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
            if conn.watch is not None:  # the response is over: no more word of a hang-up
                self._watch[1](conn)  # type: ignore[index]
        return True

    def _failed(self, conn: Connection, response: Response, status: int, code: str, message: str, quiet: bool) -> None:
        if response.head_sent:
            return  # the client sees a truncated response: the connection closes
        if code == "CLIENT_GONE":
            conn.linger = False
            return
        if quiet:
            log.info("%s from %s: %s", status, conn.peer[0] if isinstance(conn.peer, tuple) else conn.peer, message)
        if response.out is not None:  # answered on the I/O thread: the answer goes out with the rest
            conn.linger = True
            response.out[:] = [error_response(status, code, message, http_date(time.time()))]
            return
        self.answer(conn, status, code, message)
