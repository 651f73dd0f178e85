"""The scripted kernel on a real socket: a threaded Werkzeug server in a daemon thread.

Why: the adapter, the tests and ``python -m agui_adapter.scripted_kernel`` all need the
kernel listening on loopback like the real ``iac-code a2a``, started and stopped
cleanly (open streams closed, running scripts canceled, sessions saved,
temporary folders removed).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from agui_adapter.scripted_kernel.jsonrpc import ScriptedKernelApp
from agui_adapter.scripted_kernel.tasks import KernelState

#: Connections the kernel's socket queues before its loop accepts them: as many as the adapter's
#: own (``http.limits``). Werkzeug's 128 drops the connection attempts of a burst beyond it, and
#: each dropped one waits a second for its retry (200 runs started at once, say, each opening
#: its stream at the same instant).
LISTEN_BACKLOG = max(1024, socket.SOMAXCONN)


class _QuietRequestHandler(WSGIRequestHandler):
    """Werkzeug's handler without the per-request access log (errors still go to stderr)."""

    protocol_version = "HTTP/1.1"  # chunked transfer encoding for the SSE generators

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class ScriptedKernel:
    """Runs the scripted kernel on a threaded Werkzeug server in a daemon thread.

    With ``state_dir`` the kernel keeps its sessions there (see
    :mod:`agui_adapter.scripted_kernel.sessions`), so a new instance on the same directory
    continues the same session ids.

    >>> with ScriptedKernel(token="t", delay_scale=0.01) as kernel:  # doctest: +SKIP
    ...     requests.get(kernel.url + "health", headers={"Authorization": "Bearer t"})
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        delay_scale: float = 1.0,
        keepalive_seconds: float = 15.0,
        log_requests: bool = False,
        state_dir: str | None = None,
    ) -> None:
        self.token = token or None
        self.state = KernelState(
            self.token, delay_scale=delay_scale, keepalive_seconds=keepalive_seconds, state_dir=state_dir
        )
        self.app = ScriptedKernelApp(self.state)
        self.url = ""
        self._log_requests = log_requests
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON-RPC request log (a snapshot; safe to read from any thread)."""
        return self.state.requests

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind, serve in a daemon thread, and return the base URL (with a trailing slash)."""
        if self._server is not None:
            raise RuntimeError("the scripted kernel is already running")
        handler = WSGIRequestHandler if self._log_requests else _QuietRequestHandler
        server = make_server(host, port, self.app, threaded=True, request_handler=handler)
        server.socket.listen(LISTEN_BACKLOG)  # Werkzeug listens with 128
        url_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{url_host}:{server.server_port}/"
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-kernel",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        return self.url

    def stop(self) -> None:
        """Cancel running scripts, close open streams, stop the server, save sessions, remove temp folders."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.shutdown()  # no new requests; in-flight ones finish below
        self.state.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> ScriptedKernel:  # noqa: PYI034 - typing.Self needs 3.11
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
