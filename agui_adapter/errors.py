"""Errors as values: a code from the contract's table, a message template and its
parameters, and the HTTP status used when the error is answered before the stream.

The message is translated only at the edge (``i18n.translate``), per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Code -> HTTP status when answered before the SSE stream starts.
HTTP_STATUS: dict[str, int] = {
    "UNAUTHORIZED": 401,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "NOT_ACCEPTABLE": 406,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "REQUEST_TOO_LARGE": 413,
    "INVALID_JSON": 400,
    "INVALID_INPUT": 400,
    "DUPLICATE_RUN_ID": 409,
    "RUN_ID_CONFLICT": 409,
    "THREAD_BUSY": 409,
    "THREAD_BINDING_CONFLICT": 409,
    "RESUME_REQUIRED": 409,
    "EXECUTION_LOST": 409,
    "EXECUTION_NOT_FOUND": 404,
    "STATE_UNAVAILABLE": 503,
    "A2A_UNAVAILABLE": 503,
    "INTERNAL_ERROR": 500,
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
