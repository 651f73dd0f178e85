"""The built-in server's timeouts and bounds, in one value (``python run.py``'s flags set some).

Why apart: the server (``server.py``) and one request's handling (``exchange.py``) both read
them, and neither should import the other for it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


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
