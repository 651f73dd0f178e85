"""Errors as values: a code from the contract's table, a message template and its
parameters, and the HTTP status used when the error is answered before the stream.

The message is translated only at the edge (``i18n.translate``), per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Code:
    """The contract's error codes (``error.code`` before the stream, ``RUN_ERROR.code`` after)."""

    # before the stream
    UNAUTHORIZED = "UNAUTHORIZED"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    INVALID_JSON = "INVALID_JSON"
    INVALID_INPUT = "INVALID_INPUT"
    DUPLICATE_RUN_ID = "DUPLICATE_RUN_ID"
    RUN_ID_CONFLICT = "RUN_ID_CONFLICT"
    THREAD_BUSY = "THREAD_BUSY"
    THREAD_BINDING_CONFLICT = "THREAD_BINDING_CONFLICT"
    RESUME_REQUIRED = "RESUME_REQUIRED"
    EXECUTION_NOT_FOUND = "EXECUTION_NOT_FOUND"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    THREAD_NOT_FOUND = "THREAD_NOT_FOUND"
    REPLAY_UNAVAILABLE = "REPLAY_UNAVAILABLE"
    STATE_UNAVAILABLE = "STATE_UNAVAILABLE"
    SERVER_BUSY = "SERVER_BUSY"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # before or after the stream started
    EXECUTION_LOST = "EXECUTION_LOST"
    A2A_UNAVAILABLE = "A2A_UNAVAILABLE"
    # in the stream (RUN_ERROR)
    A2A_EXECUTION_FAILED = "A2A_EXECUTION_FAILED"
    A2A_PROTOCOL_ERROR = "A2A_PROTOCOL_ERROR"
    CANCELLED = "CANCELLED"
    INCOMPLETE_RESUME = "INCOMPLETE_RESUME"
    UNKNOWN_INTERRUPT = "UNKNOWN_INTERRUPT"
    RESUME_PAYLOAD_INVALID = "RESUME_PAYLOAD_INVALID"
    RESUME_ALREADY_APPLIED = "RESUME_ALREADY_APPLIED"
    EXECUTION_EXPIRED = "EXECUTION_EXPIRED"
    STATE_PERSISTENCE_FAILED = "STATE_PERSISTENCE_FAILED"
    SESSION_BACKUP_NOT_READY = "SESSION_BACKUP_NOT_READY"


# Code -> HTTP status when answered before the SSE stream starts (default 400).
HTTP_STATUS: dict[str, int] = {
    Code.UNAUTHORIZED: 401,
    Code.NOT_FOUND: 404,
    Code.METHOD_NOT_ALLOWED: 405,
    Code.NOT_ACCEPTABLE: 406,
    Code.UNSUPPORTED_MEDIA_TYPE: 415,
    Code.REQUEST_TOO_LARGE: 413,
    Code.INVALID_JSON: 400,
    Code.INVALID_INPUT: 400,
    Code.DUPLICATE_RUN_ID: 409,
    Code.RUN_ID_CONFLICT: 409,
    Code.THREAD_BUSY: 409,
    Code.THREAD_BINDING_CONFLICT: 409,
    Code.RESUME_REQUIRED: 409,
    Code.EXECUTION_LOST: 409,
    Code.EXECUTION_NOT_FOUND: 404,
    Code.RUN_NOT_FOUND: 404,
    Code.THREAD_NOT_FOUND: 404,
    Code.REPLAY_UNAVAILABLE: 409,
    Code.STATE_UNAVAILABLE: 503,
    Code.SERVER_BUSY: 503,
    Code.A2A_UNAVAILABLE: 503,
    Code.INTERNAL_ERROR: 500,
}


@dataclass
class AguiError(Exception):
    """An adapter error with a contract code and a translatable message."""

    code: str
    message: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.code, self.message)

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 400)

    def __str__(self) -> str:  # English rendering, for logs
        try:
            return f"{self.code}: {self.message.format(**self.params)}"
        except (KeyError, IndexError, ValueError):
            return f"{self.code}: {self.message}"


DETAIL_LIMIT = 300


def clip_detail(text: str | None) -> str:
    """A detail from elsewhere (the kernel, a schema validator) fit for a message: one line, bounded."""
    text = " ".join((text or "").split())
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
