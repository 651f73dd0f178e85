"""The access log, and the WSGI body every response goes out through.

Why here, in the WSGI app, not in the server: the adapter runs under the built-in server,
gunicorn, waitress or mod_wsgi alike, and each logs (or not) in its own way; one line per
request written by the app is the same everywhere. As gunicorn does, the line is written
when the response is over: the app's body is wrapped, its bytes counted as they are handed
to the server, and the line written when the server closes it (PEP 3333 guarantees the
``close()``), so a stream's line comes when the stream ends, with its whole duration and
size. An answer given on the built-in server's I/O thread (``answer_inline``: a refusal
before admission, ``/health``) is a list the server sends as it is once the app returns,
with nothing of the app run after: its line is written by the app before it returns, in
the request's own context, and the list goes out unwrapped. ``--no-access-log``
(``IAC_CODE_AGUI_ACCESS_LOG=false``, ``access_log`` in the config file) turns it off.

One line, logger ``agui_adapter.access`` at INFO, in the chosen ``--log-format``:

- text: ``<client> "<METHOD> <path> <protocol>" <status> <bytes> <seconds>s <route>
  "<user agent>"`` plus ``thread=<id> run=<id>`` when known and ``refused=<code>`` for a
  run refused with an AG-UI error code, then the request id as on every line
  (``[request <id>]``);
- JSON: the fields ``method``, ``path``, ``protocol``, ``route``, ``status``,
  ``bytes_sent``, ``duration_seconds``, ``client_address``, ``user_agent`` (and
  ``error_code`` for a refused run) besides the usual ``request_id``, ``thread_id``,
  ``run_id`` (``logs``).

A refused run has this one line (its code on it); without the access log, the app writes
``POST / refused: <code>`` instead, so that a refusal is never silent. One log record, not
two, saves about a fifth of the application's part of a refusal.

The path is logged without its query string, and the client address is the peer's
(``REMOTE_ADDR``): behind a proxy, the proxy's log has the browser's. Header values never
appear but the user agent (control characters and quotes escaped, at most 256 characters).

``ResponseBody`` also puts the request's id, its known thread and run ids, and its
OpenTelemetry span (``tracing``) in context around each step of the body and its close, on
whichever thread the server iterates it (the body of an SSE response is iterated long after
the app returned).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from agui_adapter.ops import logs
from agui_adapter.ops.tracing import NO_TRACE, NoTrace

log = logging.getLogger("agui_adapter.access")

#: Where the HTTP edge keeps a request's known (thread id, run id) in the environ.
IDS_KEY = "agui_adapter.ids"
#: Where the app keeps the AG-UI error code a run was refused with, for its access line.
REFUSED_KEY = "agui_adapter.refused"
MAX_USER_AGENT = 256


class Exchange:
    """One request and its response as the access log sees them."""

    __slots__ = ("environ", "request_id", "sent", "started", "status", "trace")

    def __init__(self, environ: dict[str, Any], request_id: str, trace: NoTrace | Any = NO_TRACE) -> None:
        self.environ = environ
        self.request_id = request_id
        self.trace = trace
        self.started = time.perf_counter()
        self.status: int | None = None
        self.sent = 0

    @property
    def ids(self) -> tuple[str, str | None] | None:
        return self.environ.get(IDS_KEY)


def _printable(value: str) -> str:
    text = value[:MAX_USER_AGENT]
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else "?")
    return "".join(out)


def write_line(exchange: Exchange, route: str) -> None:
    """The access line of a finished exchange: its message formatted once and written
    straight to the process's log stream when logging is the adapter's own
    (``logs.write_direct``: a third of a refusal's application time less), else as a record
    with its fields set in one step (``Logger.info`` with ``extra=`` would check them one by
    one)."""
    if not log.isEnabledFor(logging.INFO):
        return
    environ = exchange.environ
    seconds = time.perf_counter() - exchange.started
    method = str(environ.get("REQUEST_METHOD", ""))
    path = _printable(str(environ.get("PATH_INFO", "")))
    protocol = str(environ.get("SERVER_PROTOCOL", ""))
    client = str(environ.get("REMOTE_ADDR", "")) or "-"
    agent = _printable(str(environ.get("HTTP_USER_AGENT", "")))
    status = exchange.status if exchange.status is not None else 0
    sent = exchange.sent
    ids = exchange.ids
    where = ""
    if ids is not None:
        where = f" thread={_printable(ids[0])}" + (f" run={_printable(ids[1])}" if ids[1] else "")
    refused = environ.get(REFUSED_KEY)
    if refused is not None:
        where += f" refused={refused}"
    message = f'{client} "{method} {path} {protocol}" {status} {sent} {seconds:.3f}s {route} "{agent}"{where}'

    def fields() -> dict[str, Any]:
        named: dict[str, Any] = {} if refused is None else {"error_code": refused}
        named.update(
            method=method,
            path=path,
            protocol=protocol,
            route=route,
            status=status,
            bytes_sent=sent,
            duration_seconds=round(seconds, 6),
            client_address=client,
            user_agent=agent,
        )
        return named

    if logs.write_direct(log, logging.INFO, message, fields):
        return
    record = log.makeRecord(log.name, logging.INFO, "(access)", 0, message, None, None)
    record.__dict__.update(fields())
    log.handle(record)


class ResponseBody:
    """A WSGI body iterated and closed with its request's context set, its bytes counted,
    and, once closed, its access line written and its span ended."""

    def __init__(self, body: Iterable[bytes], exchange: Exchange, *, access_log: bool, route_key: str) -> None:
        self._body = body
        self._iterator: Iterator[bytes] = iter(body)
        self._plain = type(body) is list  # its items are bytes already: no code of the app runs
        self._exchange = exchange
        self._access_log = access_log
        self._route_key = route_key
        self._closed = False

    def __iter__(self) -> ResponseBody:
        return self

    def _enter(self) -> tuple[Any, Any, Any]:
        exchange = self._exchange
        ids = exchange.ids
        return (
            logs.REQUEST_ID.set(exchange.request_id),
            logs.RUN_IDS.set(ids) if ids is not None else None,
            exchange.trace.attach(),
        )

    def _leave(self, tokens: tuple[Any, Any, Any]) -> None:
        request, ids, trace = tokens
        self._exchange.trace.detach(trace)
        if ids is not None:
            logs.RUN_IDS.reset(ids)
        logs.REQUEST_ID.reset(request)

    def __next__(self) -> bytes:
        if self._plain:
            chunk = next(self._iterator)
            self._exchange.sent += len(chunk)
            return chunk
        tokens = self._enter()
        try:
            chunk = next(self._iterator)
        finally:
            self._leave(tokens)
        self._exchange.sent += len(chunk)
        return chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tokens = self._enter()
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            try:
                exchange = self._exchange
                if exchange.status is not None:
                    exchange.trace.status(exchange.status)
                exchange.trace.end()
                if self._access_log:
                    write_line(exchange, str(exchange.environ.get(self._route_key, "unmatched")))
            finally:
                self._leave(tokens)

    def __getattr__(self, name: str) -> Any:  # anything else a server may ask the body
        return getattr(self._body, name)
