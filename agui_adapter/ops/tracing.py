"""OpenTelemetry tracing, optional: nothing here imports OpenTelemetry unless it is asked for.

Why: a run crosses the client, the adapter and the kernel (which has OpenTelemetry of its
own); one trace shows where its time went. With the optional ``otel`` extra
(``opentelemetry-api``, and ``opentelemetry-sdk`` to record anything):

- a request's W3C ``traceparent`` (and ``tracestate``, through the globally configured
  propagators, ``OTEL_PROPAGATORS``) is continued, or a trace is started: one SERVER span
  per HTTP request, named ``<METHOD> <route>`` (``POST /``, ``GET /threads/{threadId}/...``);
- a run is one ``agui.run`` span (its thread and run ids, mode, outcome, events, bytes)
  with children for its admission (``agui.admission``), each thread state write
  (``agui.state_write``), each kernel call (a CLIENT span ``A2A <method>``) and the wait
  for its first event (``agui.first_event``, from the start of its stream to the first
  event after RUN_STARTED);
- every A2A call carries the trace context as HTTP headers (``traceparent``,
  ``tracestate``), beside the request id (``X-Request-ID``, ``kernel_client.calls``);
- JSON log lines carry ``trace_id`` and ``span_id`` (``logs.trace_ids``).

When it is on: ``OTEL_SDK_DISABLED`` is not ``true``, opentelemetry-api is installed, and
either a tracer provider is already set in the process (by ``opentelemetry-instrument``,
or by the application hosting the WSGI app: it is used) or one of ``OTEL_TRACES_EXPORTER``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_SERVICE_NAME`` is set. Then, if no tracer
provider was set and opentelemetry-sdk is installed, the SDK is configured from the standard
variables: resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), sampler
(``OTEL_TRACES_SAMPLER``), and the exporters named by ``OTEL_TRACES_EXPORTER`` (``otlp`` by
default, ``console``, ``none``; any installed exporter package registers its name) behind a
batch processor. With the API alone every span is a no-op (an incoming trace context is
still passed on to the kernel).

Compared with the OpenTelemetry Python contrib WSGI middleware
(``opentelemetry-instrumentation-wsgi``), which this follows (extract from the environ, a
SERVER span unless a span is already active, INTERNAL then, the response status on the
span, ERROR status only for 5xx, the span ended when the response is closed):

- the span name is the route template, never the raw path (low cardinality; the contrib
  middleware uses ``<METHOD> <path>``);
- the span's context is made current around each step of the response (each ``next`` and
  the ``close``) rather than attached once when the app is called and detached in a
  generator's ``finally``: an SSE body is iterated and closed by the server, possibly on
  another thread, and a detached run goes on on a thread of its own;
- the request's duration and the byte count belong to the access log and ``/metrics``
  (``access_log``, ``metrics``), so no OpenTelemetry metrics are recorded;
- no request or response headers are captured as attributes (they carry bearer tokens).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from agui_adapter import __version__
from agui_adapter.ops import logs

log = logging.getLogger("agui_adapter.ops.tracing")

#: Any of these set says the operator wants traces.
WANTED_BY = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
)


class NoTrace:
    """The trace of a request or a run when tracing is off: every method does nothing."""

    __slots__ = ()

    def attach(self) -> Any:
        return None

    def detach(self, token: Any) -> None:
        return None

    def rename(self, name: str) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        return None

    def status(self, status: int) -> None:
        return None

    def step(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def first_event(self) -> None:
        return None

    def end(self, error: str | None = None, **attributes: Any) -> None:
        return None


NO_TRACE = NoTrace()


class Tracing:
    """Tracing off (the default): nothing imported, every hook a no-op."""

    enabled = False

    def request(self, environ: Mapping[str, Any]) -> NoTrace:
        """The span of one HTTP request (not yet current)."""
        return NO_TRACE

    def run(self, thread_id: str, run_id: str) -> NoTrace:
        """A run's span, a child of the current span (not yet current)."""
        return NO_TRACE

    def kernel_call(self, method: str, headers: dict[str, str]) -> Any:
        """Start a kernel call's span and add its context to ``headers``; ``end_kernel_call`` ends it."""
        return None

    def end_kernel_call(self, span: Any, error: str | None) -> None:
        return None

    def interval(self, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        """A span that already happened, child of the current span (a state write)."""
        return None


class _EnvironGetter:
    """Reads propagation headers from a WSGI environ (``traceparent`` -> ``HTTP_TRACEPARENT``)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [k[5:].lower().replace("_", "-") for k in carrier if k.startswith("HTTP_")]


class OtelTrace:
    """One span (a request's or a run's) and its context, made current step by step."""

    def __init__(self, tracing: OtelTracing, span: Any, *, first_event: bool = False) -> None:
        self._tracing = tracing
        self.span = span
        self._context = tracing.trace.set_span_in_context(span)
        self._ended = False
        self._first: Any = None
        if first_event:
            self._first = tracing.tracer.start_span("agui.first_event", context=self._context)

    def attach(self) -> Any:
        return self._tracing.context.attach(self._context)

    def detach(self, token: Any) -> None:
        if token is not None:
            self._tracing.context.detach(token)

    def rename(self, name: str) -> None:
        self.span.update_name(name)

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(_attribute(key), value)

    def status(self, status: int) -> None:
        """The HTTP status of the response; 5xx marks the server span an error (semconv)."""
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(self._tracing.status_code.ERROR)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Any]:
        """A child span around a step (admission), current while it runs."""
        tracer = self._tracing.tracer
        with tracer.start_as_current_span(name, context=self._context) as span:
            yield span

    def first_event(self) -> None:
        first, self._first = self._first, None
        if first is not None:
            first.end()

    def end(self, error: str | None = None, **attributes: Any) -> None:
        if self._ended:
            return
        self._ended = True
        first, self._first = self._first, None
        if first is not None:  # the run ended before its first event
            first.set_attribute("agui.first_event.reached", False)
            first.end()
        self.set(**attributes)
        if error:
            self.span.set_status(self._tracing.status_code.ERROR, error)
        self.span.end()


def _attribute(key: str) -> str:
    return key if "." in key else f"agui.{key}"


class OtelTracing(Tracing):
    """Spans through OpenTelemetry's API (the SDK records them when configured)."""

    enabled = True

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.propagators.textmap import Getter
        from opentelemetry.trace import SpanKind, StatusCode

        class EnvironGetter(_EnvironGetter, Getter):  # type: ignore[misc]
            pass

        self.trace, self.context, self.propagate = trace, context, propagate
        self.kinds, self.status_code = SpanKind, StatusCode
        self.tracer = trace.get_tracer("agui_adapter", __version__, tracer_provider)
        self._getter = EnvironGetter()
        logs.trace_ids = self.log_ids

    def log_ids(self) -> tuple[str, str] | None:
        """(trace id, span id) of the current span as hex, for log lines (None without one)."""
        context = self.trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"

    def request(self, environ: Mapping[str, Any]) -> OtelTrace:
        method = str(environ.get("REQUEST_METHOD", "")) or "HTTP"
        attributes = {
            "http.request.method": method,
            "url.path": str(environ.get("PATH_INFO", "")),
            "url.scheme": str(environ.get("wsgi.url_scheme", "http")),
            "client.address": str(environ.get("REMOTE_ADDR", "")),
            "user_agent.original": str(environ.get("HTTP_USER_AGENT", "")),
            "network.protocol.version": str(environ.get("SERVER_PROTOCOL", "")).partition("/")[2],
        }
        if self.trace.get_current_span().get_span_context().is_valid:
            # something outside the app already traces this request: a child, as the contrib middleware does
            span = self.tracer.start_span(method, kind=self.kinds.INTERNAL, attributes=attributes)
        else:
            parent = self.propagate.extract(environ, getter=self._getter)
            span = self.tracer.start_span(method, context=parent, kind=self.kinds.SERVER, attributes=attributes)
        return OtelTrace(self, span)

    def run(self, thread_id: str, run_id: str) -> OtelTrace:
        attributes = {"agui.thread_id": thread_id, "agui.run_id": run_id}
        return OtelTrace(self, self.tracer.start_span("agui.run", attributes=attributes), first_event=True)

    def kernel_call(self, method: str, headers: dict[str, str]) -> Any:
        attributes = {"rpc.system": "jsonrpc", "rpc.service": "a2a", "rpc.method": method}
        span = self.tracer.start_span(f"A2A {method}", kind=self.kinds.CLIENT, attributes=attributes)
        self.propagate.inject(headers, context=self.trace.set_span_in_context(span))
        return span

    def end_kernel_call(self, span: Any, error: str | None) -> None:
        if span is None:
            return
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(self.status_code.ERROR, error)
        span.end()

    def interval(self, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        span = self.tracer.start_span(name, start_time=start_ns)
        for key, value in attributes.items():
            span.set_attribute(_attribute(key), value)
        span.end(end_time=end_ns)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (nothing imported to find out)."""
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    api = sys.modules.get("opentelemetry.trace")
    if api is not None and not isinstance(api.get_tracer_provider(), api.ProxyTracerProvider):
        return True  # set up already (opentelemetry-instrument, or the application hosting this one)
    return any(env.get(name, "").strip() for name in WANTED_BY)


def from_environment(env: Mapping[str, str] | None = None) -> Tracing:
    """OpenTelemetry tracing when the environment asks for it and the API is installed; else off."""
    env = os.environ if env is None else env
    if not wanted(env):
        return Tracing()
    import importlib.util

    if importlib.util.find_spec("opentelemetry") is None or importlib.util.find_spec("opentelemetry.trace") is None:
        log.warning("OTEL_* variables are set but opentelemetry-api is not installed (pip install agui-adapter[otel])")
        return Tracing()
    _configure_sdk(env)
    return OtelTracing()


_configured = False


def _configure_sdk(env: Mapping[str, str]) -> None:
    """Set up the SDK's tracer provider from the standard variables, unless one is set already
    or the SDK is not installed (then the API's no-op provider stays)."""
    global _configured
    from opentelemetry import trace

    if _configured or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return
    import importlib.util

    if importlib.util.find_spec("opentelemetry.sdk") is None:
        log.info("opentelemetry-sdk is not installed: spans are not recorded, trace context is passed on")
        return
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "agui-adapter"}))
    names = [n.strip() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    for name in names:
        if name == "none":
            continue
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            log.warning("OTEL_TRACES_EXPORTER names %r, which no installed package provides", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
    trace.set_tracer_provider(provider)
    _configured = True
    log.info("OpenTelemetry tracing on (exporters: %s)", ", ".join(names))
