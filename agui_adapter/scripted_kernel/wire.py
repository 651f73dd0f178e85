"""The kernel's wire: A2A task states, JSON-RPC errors and responses, SSE framing.

Why: every frame the scripted kernel sends must look like the real kernel's
(compact JSON, Struct floats, a2a-sdk error objects, one ``data:`` line per
frame), so these rules live in one place that the app and the scripts share.
"""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from werkzeug.wrappers import Response

A2A_VERSION = "1.0"

KERNEL_VERSION = "scripted"

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
COMPLETED = "TASK_STATE_COMPLETED"
REJECTED = "TASK_STATE_REJECTED"
TERMINAL_STATES = frozenset({FAILED, CANCELED, COMPLETED, REJECTED})

#: Frames joined into one write for bulk ([FAST]) and drained streams.
FRAMES_PER_WRITE = 256


CLOSE = object()  # end-of-stream sentinel put on subscriber queues
ACK = object()  # "answer acknowledged": unary SendMessage returns; streams ignore it
UTC = timezone.utc  # noqa: UP017 - datetime.UTC needs Python 3.11; we support 3.10


# --------------------------------------------------------------------------- helpers


def dumps(obj: Any) -> str:
    """Compact JSON as the real kernel writes it (non-ASCII kept as is)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def as_struct(value: Any) -> Any:
    """Mimic a protobuf ``Struct`` round trip: every number becomes a float."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: as_struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_struct(v) for v in value]
    return value


def random_hex(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


# --------------------------------------------------------------------------- errors


class RpcError(Exception):
    """A JSON-RPC error in the a2a-sdk shape (``data`` is a google.rpc.ErrorInfo list)."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason:
            error["data"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ]
        return error


def task_not_found(message: str = "Task not found") -> RpcError:
    return RpcError(-32001, message, "TASK_NOT_FOUND")


def not_cancelable() -> RpcError:
    return RpcError(-32002, "Task cannot be canceled", "TASK_NOT_CANCELABLE")


def invalid_params(message: str) -> RpcError:
    return RpcError(-32602, message, "INVALID_PARAMS")


def version_not_supported(version: str | None) -> RpcError:
    seen = version if version else "0.3"
    return RpcError(
        -32009,
        f"A2A version '{seen}' is not supported by this handler. Expected version '{A2A_VERSION}'.",
        "VERSION_NOT_SUPPORTED",
    )


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj), status=status, content_type="application/json")


def rpc_error(rid: Any, error: RpcError) -> Response:
    return json_response({"error": error.to_error(), "id": rid, "jsonrpc": "2.0"})


# --------------------------------------------------------------------------- SSE


def sse_response(
    subscriber: queue.SimpleQueue[Any], rid: Any, keepalive_seconds: float, on_close: Callable[[], None]
) -> Response:
    """A ``text/event-stream`` response that relays the subscriber queue until ``CLOSE``."""
    response = Response(
        sse_frames(subscriber, rid, keepalive_seconds, on_close),
        status=200,
        content_type="text/event-stream; charset=utf-8",
        direct_passthrough=True,
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    return response


def sse_frames(
    subscriber: queue.SimpleQueue[Any], rid: Any, keepalive_seconds: float, on_close: Callable[[], None]
) -> Iterator[bytes]:
    """The stream body: queued ``(result, repeat)`` items as JSON-RPC frames, batched per write.

    A ``: ping`` comment goes out after ``keepalive_seconds`` of silence; ``on_close``
    runs when the stream ends for any reason (the client went away included).
    """
    head = b'data: {"result":'
    tail = (',"id":' + dumps(rid) + ',"jsonrpc":"2.0"}\n\n').encode("utf-8")
    timeout = keepalive_seconds if keepalive_seconds > 0 else None
    try:
        while True:
            try:
                item = subscriber.get(timeout=timeout)
            except queue.Empty:
                yield f": ping - {datetime.now(UTC)}\n\n".encode()
                continue
            buffer: list[bytes] = []
            closed = False
            while True:
                if item is CLOSE:
                    closed = True
                    break
                if item is not ACK:
                    result, repeat = item
                    frame = head + dumps(result).encode("utf-8") + tail
                    if repeat == 1:
                        buffer.append(frame)
                    else:
                        if buffer:
                            yield b"".join(buffer)
                            buffer = []
                        full, rest = divmod(repeat, FRAMES_PER_WRITE)
                        if full:
                            chunk = frame * FRAMES_PER_WRITE
                            for _ in range(full):
                                yield chunk
                        if rest:
                            yield frame * rest
                if len(buffer) >= FRAMES_PER_WRITE:
                    break
                try:
                    item = subscriber.get_nowait()
                except queue.Empty:
                    break
            if buffer:
                yield b"".join(buffer)
            if closed:
                return
    finally:
        on_close()
