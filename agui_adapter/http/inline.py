"""A whole, small request answered on the server's I/O thread (``server.py``).

Moved out of ``WSGIServer`` so the server keeps to its connections: when the bytes a waiting
connection sent hold a whole request with a small body and the application offers
``answer_inline(environ, start_response)`` (a refusal before admission, ``/health``), it runs
on the I/O thread and its answer, head and body, goes out in one ``send``: no thread hand-off.
This module decides that and sends; what then becomes of the connection (closed, kept waiting,
or handed to a worker with the rest of the answer) is the server's, told by a ``Step``. When
the application declines, what it left in the environ under ``INLINE_CARRY_KEY`` (a run's
checks, done before it knew it must decline) is offered to the same request on its worker
(``exchange.Exchanges.run_app`` keeps it on the connection, ``environ`` hands it on once).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from agui_adapter.http.connection import Connection, ConnState, Reader, RequestBody, Response
from agui_adapter.http.exchange import Exchanges, InlineAnswer
from agui_adapter.http.limits import ServerLimits
from agui_adapter.http.rules import ProtocolError, parse_request_head, take_head

INLINE_BODY_BYTES = 16 * 1024
"""The largest request body answered on the I/O thread (a larger one goes to a worker)."""


class Step(Enum):
    """What the server does with the connection after ``answer``."""

    WORKER = "worker"  # not answered (nothing changed): a worker serves the request
    CLOSE = "close"  # answered, or the send failed: close the connection
    HAND_OVER = "hand_over"  # the rest of the answer, a pipelined request or a lingering close: a worker's
    KEEP = "keep"  # answered: the connection waits for its next request


def answer(
    conn: Connection,
    reader: Reader,
    deadline: float,
    limits: ServerLimits,
    exchanges: Exchanges,
    inline: InlineAnswer,
    closing: Callable[[], bool],
) -> tuple[Step, tuple[bytes, bool] | None]:
    """Answer a whole, small request when the application can without blocking; with
    ``HAND_OVER``, what is left to send and whether the connection stays open after it."""
    buf = reader.buf
    try:
        head, rest = take_head(buf, limits.max_header_bytes)
        if head is None:
            return Step.WORKER, None
        req = parse_request_head(head, limits.max_headers)
    except ProtocolError:
        return Step.WORKER, None  # a worker answers it (and lingers)
    if req.chunked or req.expects_continue or (req.length or 0) > min(len(rest), INLINE_BODY_BYTES):
        return Step.WORKER, None
    reader.buf = rest
    conn.requests += 1
    conn.path = req.path
    conn.state = ConnState.ACTIVE
    body = RequestBody(reader, deadline, req.body, None)
    out: list[bytes] = []
    response = Response(conn, req, body, limits.send_timeout, limits.drain_bytes, closing, out)
    if not exchanges.run_app(conn, req, body, response, inline):  # the application needs a thread
        reader.buf = buf
        conn.requests -= 1
        conn.state = ConnState.IDLE
        return Step.WORKER, None
    data = b"".join(out)
    keep = response.keep_alive and not conn.aborted
    sent = 0
    try:
        sent = conn.sock.send(data) if data else 0
    except BlockingIOError:
        pass
    except OSError:
        return Step.CLOSE, None
    if sent < len(data) or (keep and reader.buf) or (not keep and conn.linger):
        return Step.HAND_OVER, (data[sent:], keep)
    return (Step.KEEP if keep else Step.CLOSE), None
