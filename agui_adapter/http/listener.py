"""The built-in server's listening socket: opened, accepted from, and refusing beyond the limit.

Moved out of ``WSGIServer`` (``server.py``) so the server keeps to its connections: the socket
is bound with ``SO_REUSEADDR`` (IPv6 only on an IPv6 address) and the configured backlog; an
accept that fails for want of descriptors or memory is logged and retried after a short pause
instead of ending the server; a connection beyond the limit and the reserve gets a 503 without
its request being read, then is closed; and the WSGI environ's server part is made here.
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from agui_adapter.http.connection import RECV

log = logging.getLogger("agui_adapter.http.server")


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening TCP socket."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def accept(listening: socket.socket, accepting: Callable[[], bool]) -> tuple[socket.socket, Any] | None:
    """One connection (``TCP_NODELAY`` set), or None when there was none to take; ``accepting``,
    asked after a failure: false when the server is stopping (the failure is nobody's concern)."""
    try:
        sock, peer = listening.accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return None
    except OSError as exc:
        if not accepting():
            return None
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            log.warning("cannot accept a connection: %s", exc.strerror)
            time.sleep(0.05)
            return None
        raise
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    return sock, peer


def refuse(sock: socket.socket, busy: bytes) -> None:
    """Beyond the limit and the reserve: a 503 (``busy``) without reading the request, then close."""
    try:
        sock.setblocking(False)
        sock.send(busy)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(RECV)  # what already arrived, so that the close does not reset it
    except OSError:
        pass
    finally:
        sock.close()


def base_environ(server_address: Any, server_port: int, server_software: str) -> dict[str, Any]:
    """The part of every request's WSGI environ that is the server's."""
    return {
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
        "SERVER_SOFTWARE": server_software,
        "SCRIPT_NAME": "",
        "SERVER_NAME": str(server_address[0]),
        "SERVER_PORT": str(server_port),
    }
