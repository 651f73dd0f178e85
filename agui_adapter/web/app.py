"""The HTTP edge: routing, auth, content type, body limits, JSON errors, the SSE response.

A plain WSGI application on Werkzeug's routing and request helpers, nothing more.
Checks on ``POST /`` run in a fixed order (auth, content type, Accept, size, JSON,
envelope, admission; the first five are ``request_checks``) and every failure before the stream is the JSON shape
``{"error": {"code", "message"}}`` in the request's language. The SSE response is the
run's generator, returned as the WSGI iterable itself so that servers call its
``close()`` when the client goes away.

Every request has an id: the client's ``X-Request-ID`` when it is printable ASCII of at
most 128 characters, else a fresh one. It is echoed on every response, passed on to the
kernel (``kernel_calls``) and, through a context variable read by a log record factory
installed with the app, appended to every log line written while the request is handled,
its SSE body's iterations included (the server iterates the body later, so the body is
wrapped to set the id around each step: ``access_log.ResponseBody``, which also writes the
request's access line when the response is over). Once a request names its thread and run
(a run, a reattach, a cancel), every line of it carries their ids (``logs.RUN_IDS``),
refusals included. With tracing on (``tracing``), each request is a span continuing the
client's ``traceparent``, and a run's admission a child of the run's span.

CORS (``cors_origins``; none by default, and then no CORS header at all): a preflight
``OPTIONS`` on a known route is answered 204 before auth (a preflight never carries the
bearer token), with the ``Access-Control-Allow-*`` headers only when the ``Origin`` is
allowed; every actual response to an allowed origin carries ``Access-Control-Allow-Origin``
(the origin itself) and exposes ``X-Request-ID`` and ``Retry-After``. Only a valid serialized
origin (``scheme://host[:port]``, ASCII, no control byte) is ever allowed, and so reflected,
whatever ``cors_origins`` says (``*`` included): anything else (``null``, a path, a bare CR
that another server let through) is answered as an origin not allowed.

``answer_inline`` is the same application for a server that reads requests on one I/O thread
(the built-in one): it answers what never blocks (a refusal of ``POST /`` before admission,
``/health``, 404, 405, a preflight) and declines the rest (None, nothing written, nothing
counted), which the server then runs on a thread of its own through ``__call__``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from agui_adapter import PROTOCOL_VERSION, __version__
from agui_adapter.http.connection import CLIENT_GONE_KEY, CLIENT_WATCH_KEY, INLINE_CARRY_KEY
from agui_adapter.http.rules import error_body
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.ops import logs
from agui_adapter.ops.faults import describe
from agui_adapter.ops.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from agui_adapter.ops.start_gate import STARTS
from agui_adapter.ops.tracing import Tracing
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.i18n import negotiate_language, translate
from agui_adapter.protocol.validation import (
    check_json_text,
    check_thread_header,
    preferred_language_hint,
    request_digest,
    validate_run_input,
)
from agui_adapter.run.client_watch import ClientWatch
from agui_adapter.run.engine import Admission, RunEngine
from agui_adapter.run.process_gone import process_gone_ending
from agui_adapter.state.journal import JournalReader, ReplayUnavailable, follow
from agui_adapter.web import client_modules, console_page
from agui_adapter.web import request_checks as checks
from agui_adapter.web.access_log import IDS_KEY, REFUSED_KEY, Exchange, ResponseBody, write_line
from agui_adapter.web.thread_resource import ThreadViews, check_path_header

log = logging.getLogger("agui_adapter.web.app")

MAX_RUN_BODY = 12 * 1024 * 1024
MAX_CANCEL_BODY = 64 * 1024

StartResponse = Callable[..., Any]
#: The matched endpoint's name, kept in the environ for the HTTP requests metric (never the raw path).
ROUTE_KEY = "agui_adapter.route"
#: In the environ of a request ``answer_inline`` handles: the app must not block.
INLINE_KEY = "agui_adapter.inline"
#: The routes ``answer_inline`` answers (``run`` up to admission); every other one needs a thread.
INLINE_ROUTES = frozenset(("health", "run"))


class _Checked(NamedTuple):
    """A run's body as checked on the I/O thread before it declined (``INLINE_CARRY_KEY``)."""

    body: bytes
    payload: Any
    run_input: Any


class _NeedsThread(BaseException):  # noqa: N818 - a signal, not an error: ``except Exception`` lets it by
    """Raised inside ``answer_inline`` where the request would block: the server runs it on a thread."""


MAX_REQUEST_ID = 128
REQUEST_ID_HEADER = "X-Request-ID"
#: The id of the request being handled on this thread (None outside a request); kept in ``logs``.
REQUEST_ID = logs.REQUEST_ID
_REQUEST_IDS = random.Random(os.urandom(32))
# forked workers (gunicorn --preload) must not all make the same ids
os.register_at_fork(after_in_child=lambda: _REQUEST_IDS.seed(os.urandom(32)))


def request_id_for(environ: dict[str, Any]) -> str:
    """The client's ``X-Request-ID`` if printable ASCII of at most 128 characters, else a new one."""
    given = environ.get("HTTP_X_REQUEST_ID", "").strip()
    if 0 < len(given) <= MAX_REQUEST_ID and all(" " <= ch <= "~" for ch in given):
        return given
    # A correlation id, not a secret: a seeded generator, no system call per request.
    return f"{_REQUEST_IDS.getrandbits(128):032x}"


CORS_ALLOW_HEADERS = (
    "Authorization, Content-Type, Accept, Accept-Language, Last-Event-ID, X-Request-ID, X-AGUI-Thread-Id"
)
CORS_EXPOSE_HEADERS = "X-Request-ID, Retry-After"
CORS_MAX_AGE = "600"
_ROUTE_METHODS = {"run": "POST, OPTIONS", "cancel": "POST, OPTIONS", "health": "GET, HEAD, OPTIONS"}
_ROUTE_METHODS["ready"] = _ROUTE_METHODS["events"] = _ROUTE_METHODS["health"]
_ROUTE_METHODS["thread"] = _ROUTE_METHODS["messages"] = _ROUTE_METHODS["health"]
_ROUTE_METHODS["client_module"] = _ROUTE_METHODS["health"]
_SERIALIZED_ORIGIN = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?"
)
"""An origin as browsers serialize it (RFC 6454 6.2): the only ``Origin`` ever reflected."""


class CorsPolicy:
    """Which browser origins may call the adapter (``cors_origins``: exact origins or ``*``)."""

    def __init__(self, setting: str) -> None:
        items = [item.strip().lower() for item in setting.split(",") if item.strip()]
        self.enabled = bool(items)
        self.any_origin = "*" in items
        self.origins = frozenset(items)

    def allows(self, origin: str) -> bool:
        if not origin or len(origin) > 512 or not _SERIALIZED_ORIGIN.fullmatch(origin):
            return False  # never reflected: no header can carry it safely, whatever the setting
        return self.any_origin or origin.lower() in self.origins

    def response_headers(self, origin: str) -> list[tuple[str, str]]:
        """What every actual response carries (``Vary: Origin`` whenever CORS is on)."""
        if not self.enabled:
            return []
        if not self.allows(origin):
            return [("Vary", "Origin")]
        return [
            ("Access-Control-Allow-Origin", origin),
            ("Vary", "Origin"),
            ("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS),
        ]


SSE_HEADERS = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
]

URLS = Map(
    [
        Rule("/health", endpoint="health", methods=["GET"]),
        Rule("/ready", endpoint="ready", methods=["GET"]),
        Rule("/metrics", endpoint="metrics", methods=["GET"]),
        Rule("/", endpoint="run", methods=["POST"]),
        Rule("/", endpoint="console", methods=["GET"]),
        Rule(
            "/extensions/iac-code/v1/executions/<execution_id>/cancel",
            endpoint="cancel",
            methods=["POST"],
        ),
        Rule("/threads/<path:thread_id>/runs/<path:run_id>/events", endpoint="events", methods=["GET"]),
        Rule("/threads/<path:thread_id>/messages", endpoint="messages", methods=["GET"]),
        Rule("/threads/<path:thread_id>", endpoint="thread", methods=["GET"]),
        *(Rule(path, endpoint="client_module", methods=["GET"]) for path in client_modules.MODULES),
    ],
    strict_slashes=False,
)
#: The fixed routes, looked up without binding ``URLS`` (whose answer they agree with);
#: any other path or method, and every preflight, goes through the map.
FIXED_ROUTES = {
    ("/", "POST"): "run",
    ("/", "GET"): "console",
    ("/health", "GET"): "health",
    ("/ready", "GET"): "ready",
    ("/metrics", "GET"): "metrics",
    **{(path, "GET"): "client_module" for path in client_modules.MODULES},
}
_PHRASES = {status.value: status.phrase for status in HTTPStatus}
#: The route of each endpoint as a span names it (never the raw path).
ROUTE_TEMPLATES = {
    "run": "/",
    "console": "/",
    "health": "/health",
    "ready": "/ready",
    "metrics": "/metrics",
    "cancel": "/extensions/iac-code/v1/executions/{executionId}/cancel",
    "events": "/threads/{threadId}/runs/{runId}/events",
    "thread": "/threads/{threadId}",
    "messages": "/threads/{threadId}/messages",
}


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""``json.dumps`` with these options would build an encoder per call."""


def json_response(
    start_response: StartResponse,
    status: int,
    body: dict[str, Any] | bytes,
    extra: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    """A JSON answer: ``body`` as ``_JSON`` writes it, or its bytes already written."""
    payload = body if type(body) is bytes else _JSON.encode(body).encode("utf-8")
    phrase = _PHRASES.get(status, "")
    headers = [
        ("Content-Type", "application/json; charset=utf-8"),
        ("Content-Length", str(len(payload))),
        ("Cache-Control", "no-store"),
    ] + (extra or [])
    start_response(f"{status} {phrase}".strip(), headers)
    return [payload]


def last_event_id(environ: dict[str, Any]) -> int | None:
    """The ``Last-Event-ID`` header as an event id (None when absent or blank)."""
    value = environ.get("HTTP_LAST_EVENT_ID", "").strip()
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise AguiError(Code.INVALID_INPUT, msg.LAST_EVENT_ID_INVALID)
    return int(value)


class Replay:
    """The body of a reattached stream; closing it lets go of the run (``detach``)."""

    def __init__(self, reader: JournalReader, chunks: Iterator[bytes], client: ClientWatch | None = None) -> None:
        self._reader = reader
        self._chunks = chunks
        self._client = client

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        try:
            self._chunks.close()  # type: ignore[attr-defined]
        finally:
            if self._client is not None:
                self._client.stop()  # the connection may serve other requests now
            self._reader.close()  # detaches it


class AguiApp:
    """The WSGI application."""

    def __init__(
        self, engine: RunEngine, *, auth_token: str = "", default_language: str = "en", kernel_kind: str = "external"
    ) -> None:
        self.engine = engine
        self.kernel_kind = kernel_kind  # /health's "kernel": scripted | iac-code | external
        self.kernel: KernelClient = engine.kernel
        self._auth_token = auth_token.encode("utf-8") if auth_token else b""
        self.default_language = default_language
        self.cors = CorsPolicy(getattr(engine.settings, "cors_origins", ""))
        self.access_log = bool(getattr(engine.settings, "access_log", True))
        self.tracing: Tracing = getattr(engine, "tracing", None) or Tracing()
        self.threads = ThreadViews(engine)
        logs.install_request_id_logging()

    def served_by(self, server: Any) -> None:
        """The built-in server hands itself over (``serving``): its open connections and
        their limit become gauges of ``/metrics``."""
        self.engine.metrics.watch_connections(server.open_connections, server.limits.max_connections)

    def answer_inline(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes] | None:
        """The answer if it never blocks (see the module docstring), else None: the server then
        calls the app on a thread of its own, with the same request and what this call left
        under ``INLINE_CARRY_KEY`` (a run's checks: its body is parsed and checked once)."""
        if self.tracing.enabled:  # one span per request: never start one to drop it
            return None
        environ[INLINE_KEY] = True
        try:
            return self(environ, start_response)
        except _NeedsThread:
            return None

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request_id = request_id_for(environ)
        origin = environ.get("HTTP_ORIGIN", "")
        edge_headers = [(REQUEST_ID_HEADER, request_id), *self.cors.response_headers(origin)]
        exchange = Exchange(environ, request_id, self.tracing.request(environ))

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            self.engine.metrics.http_request(environ.get(ROUTE_KEY, "unmatched"), status[:3])
            exchange.status = int(status[:3]) if status[:3].isdigit() else 0
            return start_response(status, list(headers) + edge_headers, exc_info)

        token = REQUEST_ID.set(request_id)
        ids_token = logs.RUN_IDS.set(None)  # the handler sets them once it knows them
        trace_token = exchange.trace.attach()
        try:
            body: Iterable[bytes] | None = None
            if self.cors.enabled and environ.get("REQUEST_METHOD") == "OPTIONS":
                body = self._preflight(environ, start, origin)
            if body is None:
                body = self._dispatch(environ, start)
            if environ.get("REQUEST_METHOD") == "HEAD":
                # HEAD is answered like GET (/health, /ready) or refused like any other
                # method, but never with a body, whatever the server does about it.
                close = getattr(body, "close", None)
                if close is not None:
                    close()
                body = []
            if type(body) is list and environ.get(INLINE_KEY):
                # Answered on the server's I/O thread (``answer_inline``, never with tracing
                # on): the server sends this list as it is once the app returns, and nothing of
                # the app runs after; the access line is written now, in this context, and
                # the list needs no wrapper (measured: 5% less CPU per refusal).
                if self.access_log:
                    exchange.sent = sum(map(len, body))
                    write_line(exchange, str(environ.get(ROUTE_KEY, "unmatched")))
                return body
        except BaseException:
            exchange.trace.end(error="the application failed")
            raise
        finally:
            endpoint = environ.get(ROUTE_KEY)
            if endpoint is not None:
                route = ROUTE_TEMPLATES.get(endpoint, endpoint)
                exchange.trace.rename(f"{environ.get('REQUEST_METHOD', '')} {route}")
            exchange.trace.detach(trace_token)
            logs.RUN_IDS.reset(ids_token)
            REQUEST_ID.reset(token)
        if isinstance(body, list) and not self.access_log and not self.tracing.enabled:
            return body  # nothing to do when it is over
        return ResponseBody(body, exchange, access_log=self.access_log, route_key=ROUTE_KEY)

    @staticmethod
    def _known_ids(environ: dict[str, Any], thread_id: str, run_id: str | None) -> None:
        """From here on, this request's log lines and its access line carry these ids."""
        ids = (thread_id, run_id)
        environ[IDS_KEY] = ids
        logs.RUN_IDS.set(ids)  # reset by ``__call__`` when the app returns

    def _dispatch(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        language = negotiate_language(environ.get("HTTP_ACCEPT_LANGUAGE"), None, self.default_language)
        try:
            endpoint = FIXED_ROUTES.get((environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")))
            if endpoint is not None:
                args: dict[str, Any] = {}
            else:
                endpoint, args = URLS.bind_to_environ(environ).match()
            environ[ROUTE_KEY] = endpoint
        except NotFound:
            return self._error(start_response, language, AguiError(Code.NOT_FOUND, msg.NOT_FOUND))
        except MethodNotAllowed as exc:
            allow = ", ".join(sorted(exc.valid_methods or []))
            return self._error(
                start_response,
                language,
                AguiError(Code.METHOD_NOT_ALLOWED, msg.METHOD_NOT_ALLOWED),
                extra=[("Allow", allow)],
            )
        except HTTPException:  # e.g. a redirect for a path variant
            return self._error(start_response, language, AguiError(Code.NOT_FOUND, msg.NOT_FOUND))
        if endpoint not in INLINE_ROUTES and environ.get(INLINE_KEY):
            raise _NeedsThread
        try:
            if endpoint == "health":
                return self.health(start_response)
            if endpoint == "ready":
                return self.ready(start_response, language)
            if endpoint == "metrics":
                return self.metrics(environ, start_response)
            if endpoint == "run":
                return self.run(environ, start_response, language)
            if endpoint == "console":
                return self.console(environ, start_response, language)
            if endpoint == "client_module":
                return self.client_module(environ, start_response)
            if endpoint == "events":
                return self.events(environ, start_response, language, args["thread_id"], args["run_id"])
            if endpoint == "thread" or endpoint == "messages":
                return self.thread(environ, start_response, str(endpoint), args["thread_id"])
            return self.cancel(environ, start_response, language, args["execution_id"])
        except AguiError as err:
            return self._error(start_response, language, err)
        except Exception as exc:  # noqa: BLE001 - always answer JSON, never a bare 500
            # one bounded line (no traceback: it may quote the input, frame after frame)
            log.error("unexpected failure on route %s: %s", endpoint, describe(exc))
            return self._error(start_response, language, AguiError(Code.INTERNAL_ERROR, msg.INTERNAL_ERROR))

    def _preflight(self, environ: dict[str, Any], start: StartResponse, origin: str) -> list[bytes] | None:
        """204 for ``OPTIONS`` on a known route (None: not one, answered as usual)."""
        adapter = URLS.bind_to_environ(environ)
        methods = ""
        for method in ("POST", "GET"):
            try:
                endpoint, _ = adapter.match(method=method)
            except HTTPException:
                continue
            methods = _ROUTE_METHODS.get(str(endpoint), f"{method}, OPTIONS")
            break
        if not methods:
            return None
        environ[ROUTE_KEY] = "preflight"
        headers = [("Allow", methods)]
        if self.cors.allows(origin):
            headers += [
                ("Access-Control-Allow-Methods", methods),
                ("Access-Control-Allow-Headers", CORS_ALLOW_HEADERS),
                ("Access-Control-Max-Age", CORS_MAX_AGE),
            ]
        else:
            log.info("CORS preflight from an origin not allowed")
        start("204 No Content", headers)
        return []

    # ------------------------------------------------------------------ helpers
    def _error(
        self,
        start_response: StartResponse,
        language: str,
        err: AguiError,
        extra: list[tuple[str, str]] | None = None,
    ) -> list[bytes]:
        message = translate(language, err.message, **err.params)
        if err.code == Code.UNAUTHORIZED:
            extra = (extra or []) + [("WWW-Authenticate", 'Bearer realm="agui-adapter"')]
        if "retryAfter" in err.params:
            extra = (extra or []) + [("Retry-After", str(err.params["retryAfter"]))]
        return json_response(start_response, err.status, error_body(err.code, message, ensure_ascii=False), extra)

    # ------------------------------------------------------------------ endpoints
    def health(self, start_response: StartResponse) -> list[bytes]:
        return json_response(
            start_response,
            200,
            {
                "status": "ok",
                "protocol": "ag-ui",
                "executionKernel": "a2a-1.0",
                "serverVersion": __version__,
                "protocolVersion": PROTOCOL_VERSION,
                "reattach": True,
                "readers": "many",
                "kernel": self.kernel_kind,
                "adoption": True,  # a run whose adapter process went is taken over by the next
                "disconnectGraceSeconds": self.engine.settings.disconnect_grace_seconds,
                "replayRetentionSeconds": self.engine.settings.replay_retention_seconds,
            },
        )

    def ready(self, start_response: StartResponse, language: str) -> list[bytes]:
        if self.kernel.health(timeout=2.0):
            return json_response(start_response, 200, {"status": "ready"})
        return self._error(start_response, language, AguiError(Code.A2A_UNAVAILABLE, msg.KERNEL_NOT_READY))

    def metrics(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """Prometheus text exposition (``metrics.py``); the bearer token is required when one is set."""
        checks.check_auth(environ, self._auth_token)
        body = self.engine.metrics.render()
        headers = [("Content-Type", METRICS_CONTENT_TYPE), ("Cache-Control", "no-store")]
        start_response("200 OK", headers + [("Content-Length", str(len(body)))])
        return [body]

    def console(self, environ: dict[str, Any], start_response: StartResponse, language: str) -> list[bytes]:
        """The console page for a browser's ``GET /``; any other request keeps the JSON 405."""
        if environ.get("REQUEST_METHOD") != "GET" or not console_page.wants_page(environ.get("HTTP_ACCEPT", "")):
            err = AguiError(Code.METHOD_NOT_ALLOWED, msg.METHOD_NOT_ALLOWED)
            return self._error(start_response, language, err, extra=[("Allow", "POST")])
        body = console_page.page()
        start_response("200 OK", console_page.PAGE_HEADERS + [("Content-Length", str(len(body)))])
        return [body]

    def client_module(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """``GET /agui-adapter-client.mjs`` and ``/agui-adapter-agent.mjs`` (``client_modules.py``)."""
        path = environ.get("PATH_INFO", "").rstrip("/")
        if path not in client_modules.MODULES:  # a variant the map let through
            raise AguiError(Code.NOT_FOUND, msg.NOT_FOUND)
        body, etag = client_modules.module(path)
        if client_modules.not_modified(environ.get("HTTP_IF_NONE_MATCH", ""), etag):
            start_response("304 Not Modified", client_modules.headers(etag, modified=False))
            return []
        start_response("200 OK", client_modules.headers(etag) + [("Content-Length", str(len(body)))])
        return [body]

    def run(self, environ: dict[str, Any], start_response: StartResponse, language: str) -> Iterable[bytes]:
        checks.check_auth(environ, self._auth_token)
        checks.check_content_type(environ)
        checks.check_accept(environ)
        body = checks.read_body(environ, MAX_RUN_BODY, msg.BODY_TOO_LARGE)
        # The same body parsed and checked on the I/O thread a moment ago, which declined it
        # (below): its payload and run input are taken as they are, not made again.
        checked = environ.get(INLINE_CARRY_KEY)
        if type(checked) is not _Checked or checked.body != body:
            checked = None
        payload = checks.parse_json(body, msg.INVALID_JSON) if checked is None else checked.payload
        hint = preferred_language_hint(payload)
        if hint is not None:  # without one, the language is the one negotiated already
            language = negotiate_language(environ.get("HTTP_ACCEPT_LANGUAGE"), hint, self.default_language)
        inline = environ.get(INLINE_KEY)
        try:
            if checked is None:
                check_json_text(payload, body)
            # the payload is all that is used from here (a body with images is MiBs); one read
            # on the I/O thread (16 KiB at most) is kept to be recognised on the worker
            seen, body = (body if inline else b""), b""
            run_input = validate_run_input(payload) if checked is None else checked.run_input
            self._known_ids(environ, run_input.thread_id, run_input.run_id)
            check_thread_header(environ.get("HTTP_X_AGUI_THREAD_ID"), run_input.thread_id)
            if inline:  # admission and reattach write and wait: a thread's work
                environ[INLINE_CARRY_KEY] = _Checked(seen, payload, run_input)  # for the worker (``http.exchange``)
                raise _NeedsThread
            after = last_event_id(environ)
            if after is not None:  # a reattach, if the thread knows this run with this body
                digest = request_digest(run_input.raw)
                reader = self.engine.reattach(run_input.thread_id, run_input.run_id, after, digest)
                if reader is not None:
                    thread_id, run_id = run_input.thread_id, run_input.run_id
                    return self._replay(environ, start_response, reader, language, thread_id, run_id)
            slot = STARTS.enter()  # starts two at a time (``ops.start_gate``)
            try:
                admission = self._admit(run_input, language)
            except BaseException:
                slot.leave()
                raise
            admission.start_slot = slot
        except AguiError as err:
            if self.access_log:
                environ[REFUSED_KEY] = str(err.code)  # on the access line (``access_log``)
            else:
                log.info("POST / refused: %s", err.code)
            return self._error(start_response, language, err)
        ids = {"thread_id": run_input.thread_id, "run_id": run_input.run_id}
        log.info(
            "run %s admitted on thread %s (%s)", run_input.run_id, run_input.thread_id, admission.mode.value, extra=ids
        )
        try:
            body = self.engine.stream(admission, environ.get(CLIENT_GONE_KEY), environ.get(CLIENT_WATCH_KEY))
        except BaseException:
            slot.leave()
            raise
        try:
            start_response("200 OK", list(SSE_HEADERS))
        except BaseException:
            body.close()  # gives the thread and the run's slot back
            raise
        return body

    def _admit(self, run_input: Any, language: str) -> Admission:
        """``engine.admit`` as the first step of the run's span (``tracing``)."""
        trace = self.tracing.run(run_input.thread_id, run_input.run_id)
        try:
            with trace.step("agui.admission"):
                admission = self.engine.admit(run_input, language)
        except BaseException as exc:
            trace.end(error=str(getattr(exc, "code", "") or type(exc).__name__))
            raise
        admission.trace = trace
        return admission

    def events(
        self, environ: dict[str, Any], start_response: StartResponse, language: str, thread_id: str, run_id: str
    ) -> Iterable[bytes]:
        """``GET /threads/{threadId}/runs/{runId}/events``: the run's stream from the event
        after ``Last-Event-ID`` (from its first event without one), then live, followed by
        any number of readers at once. 204 when the reader already has all of an ended run
        (what stops a browser's ``EventSource`` from reconnecting)."""
        self._known_ids(environ, thread_id, run_id)
        checks.check_auth(environ, self._auth_token)
        checks.check_accept(environ)
        after = last_event_id(environ) or 0
        reader = self.engine.reattach(thread_id, run_id, after, attach=False)
        assert reader is not None
        try:
            nothing_left = reader.nothing_left()
        except ReplayUnavailable:
            reader.close()
            raise AguiError(Code.REPLAY_UNAVAILABLE, msg.REPLAY_UNAVAILABLE) from None
        except OSError as exc:
            reader.close()
            log.error("run %s: journal unreadable: %s", run_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        if nothing_left or environ.get("REQUEST_METHOD") == "HEAD":  # HEAD: the same answer, no reader
            reader.close()
            if nothing_left:
                start_response("204 No Content", [("Cache-Control", "no-store")])
            else:
                start_response("200 OK", list(SSE_HEADERS))
            return []
        self.engine.attach_reader(thread_id, run_id, reader)
        return self._replay(environ, start_response, reader, language, thread_id, run_id)

    def thread(
        self, environ: dict[str, Any], start_response: StartResponse, endpoint: str, thread_id: str
    ) -> list[bytes]:
        """``GET /threads/{threadId}`` and ``GET /threads/{threadId}/messages`` (``threads``)."""
        checks.check_auth(environ, self._auth_token)
        check_path_header(environ.get("HTTP_X_AGUI_THREAD_ID"), thread_id)
        if endpoint == "thread":
            self.engine.adoption.thread(thread_id)  # a run of it whose process went: adopted, shown live
            return json_response(start_response, 200, self.threads.show(thread_id))
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        limit, before = query.get("limit", [None])[0], query.get("before", [None])[0]
        return json_response(start_response, 200, self.threads.messages(thread_id, limit, before))

    def _replay(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        reader: JournalReader | None,
        language: str,
        thread_id: str,
        run_id: str,
    ) -> Iterable[bytes]:
        assert reader is not None

        def lost(next_id: int) -> bytes:
            if self.engine.adoption.stopped:  # this process is stopping: the client reattaches to the next
                return b""
            ending = process_gone_ending(reader.sent_events(), int(time.time() * 1000), language)
            return ev.encode_many(ending, next_id)

        heartbeat = self.engine.settings.heartbeat_seconds

        def adopt() -> bool:  # the run's process died while this reader followed it (``adoption``)
            return bool(thread_id) and self.engine.adoption.run(thread_id, run_id)

        # the server's word on a client that hangs up wakes the follower (``run.client_watch``)
        wake, client = threading.Event(), None
        client_gone = environ.get(CLIENT_GONE_KEY)
        if client_gone is not None:
            client = ClientWatch(client_gone, run_id, environ.get(CLIENT_WATCH_KEY), wake.set)
        chunks = follow(reader, heartbeat_seconds=heartbeat, lost=lost, client=client, wake=wake, adopt=adopt)
        body = Replay(reader, chunks, client)
        try:
            start_response("200 OK", list(SSE_HEADERS))
        except BaseException:
            body.close()
            raise
        return body

    def cancel(
        self, environ: dict[str, Any], start_response: StartResponse, language: str, execution_id: str
    ) -> Iterable[bytes]:
        checks.check_auth(environ, self._auth_token)
        checks.check_content_type(environ)
        body = checks.read_body(environ, MAX_CANCEL_BODY, msg.CANCEL_BODY_TOO_LARGE)
        payload = checks.parse_json(body, msg.CANCEL_INVALID_JSON)
        check_json_text(payload, body)
        if not isinstance(payload, dict):
            raise AguiError(Code.INVALID_INPUT, msg.CANCEL_NOT_AN_OBJECT)
        thread_id, ros_id = payload.get("threadId"), payload.get("rosInvocationId")
        if not (isinstance(thread_id, str) and thread_id and isinstance(ros_id, str) and ros_id):
            raise AguiError(Code.INVALID_INPUT, msg.CANCEL_FIELDS_REQUIRED)
        self._known_ids(environ, thread_id, None)
        status = self.engine.cancel_execution(thread_id, ros_id, execution_id)
        return json_response(start_response, 200, {"executionId": execution_id, "status": status})
