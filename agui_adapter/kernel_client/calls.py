"""What each call to the kernel tells operators, and what it carries besides its JSON-RPC.

The kernel client (``a2a``) wraps every call (JSON-RPC, streaming or unary, and the plain
HTTP extension routes) in ``KernelCalls.call``. The call gets extra headers: the request id
of the HTTP request it serves (``X-Request-ID``, from ``logs.REQUEST_ID``), and the trace
context when tracing is on (``tracing``). When it ends: its latency and, if it failed, the
kind of failure go to ``/metrics`` (``agui_kernel_call_seconds{method}``,
``agui_kernel_call_errors_total{method,kind}``), the span ends, and at ``--log-level
debug`` one line says the method, the outcome and the duration. Never the parameters,
the body or the headers (the kernel's bearer token, the run's secrets): only those three.

Kinds of failure: ``connection`` (unreachable, reset), ``timeout``, ``http_status`` (an HTTP
error answer), ``bad_answer`` (not the JSON or SSE expected), ``rejected`` (a JSON-RPC error
object). A stream is timed until its answer starts; a stream that breaks later is the run's
``A2A_UNAVAILABLE``, not a call failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agui_adapter.ops import logs

if TYPE_CHECKING:
    from agui_adapter.ops.metrics import Metrics
    from agui_adapter.ops.tracing import Tracing

log = logging.getLogger("agui_adapter.kernel")

REQUEST_ID_HEADER = "X-Request-ID"


class Call:
    """One call in progress: the headers to add, and its outcome when not an exception."""

    __slots__ = ("error", "headers")

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.error: str | None = None  # a failure the caller saw without raising (an HTTP error status)


class KernelCalls:
    """Observes the kernel client's calls (metrics, tracing, debug lines); all optional."""

    def __init__(self, metrics: Metrics | None = None, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing if tracing is not None and tracing.enabled else None

    @contextmanager
    def call(self, method: str) -> Iterator[Call]:
        headers: dict[str, str] = {}
        request_id = logs.REQUEST_ID.get()
        if request_id:
            headers[REQUEST_ID_HEADER] = request_id
        tracing = self.tracing
        span = tracing.kernel_call(method, headers) if tracing is not None else None
        call = Call(headers)
        started = time.perf_counter()
        error: str | None = None
        try:
            yield call
        except BaseException as exc:
            error = _kind(exc)
            raise
        finally:
            seconds = time.perf_counter() - started
            error = error or call.error
            if self.metrics is not None:
                self.metrics.kernel_call(method, seconds, error)
            if tracing is not None:
                tracing.end_kernel_call(span, error)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "kernel %s: %s in %.1f ms",
                    method,
                    error or "ok",
                    seconds * 1000,
                    extra={"kernel_method": method, "kernel_result": error or "ok", "duration_seconds": seconds},
                )


def _kind(exc: BaseException) -> str:
    kind: Any = getattr(exc, "kind", None)
    return kind if isinstance(kind, str) else "error"


#: What a client without an observer uses: the request id is passed on all the same.
PLAIN = KernelCalls()
