"""The HTTP edge: routing, auth, content type, body limits, JSON errors, the SSE response.

A plain WSGI application on Werkzeug's routing and request helpers, nothing more.
Checks on ``POST /`` run in a fixed order (auth, content type, Accept, size, JSON,
envelope, admission) and every failure before the stream is the JSON shape
``{"error": {"code", "message"}}`` in the request's language. The SSE response is the
run's generator, returned as the WSGI iterable itself so that servers call its
``close()`` when the client goes away.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wsgi import get_input_stream

from . import PROTOCOL_VERSION, __version__, console_page
from . import messages as msg
from .a2a import KernelClient
from .errors import AguiError
from .i18n import negotiate_language, translate, weighted_items
from .runs import RunEngine
from .validation import check_thread_header, preferred_language_hint, validate_run_input

log = logging.getLogger("agui_adapter.web")

MAX_RUN_BODY = 12 * 1024 * 1024
MAX_CANCEL_BODY = 64 * 1024
_READ_CHUNK = 64 * 1024

StartResponse = Callable[..., Any]

SSE_HEADERS = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
]

URLS = Map(
    [
        Rule("/health", endpoint="health", methods=["GET"]),
        Rule("/ready", endpoint="ready", methods=["GET"]),
        Rule("/", endpoint="run", methods=["POST"]),
        Rule("/", endpoint="console", methods=["GET"]),
        Rule(
            "/extensions/iac-code/v1/executions/<execution_id>/cancel",
            endpoint="cancel",
            methods=["POST"],
        ),
    ],
    strict_slashes=False,
)


def json_response(
    start_response: StartResponse, status: int, body: dict[str, Any], extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    headers = [
        ("Content-Type", "application/json; charset=utf-8"),
        ("Content-Length", str(len(payload))),
        ("Cache-Control", "no-store"),
    ] + (extra or [])
    start_response(f"{status} {phrase}".strip(), headers)
    return [payload]


class AguiApp:
    """The WSGI application."""

    def __init__(self, engine: RunEngine, *, auth_token: str = "", default_language: str = "en") -> None:
        self.engine = engine
        self.kernel: KernelClient = engine.kernel
        self._auth_token = auth_token.encode("utf-8") if auth_token else b""
        self.default_language = default_language

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        language = negotiate_language(environ.get("HTTP_ACCEPT_LANGUAGE"), None, self.default_language)
        try:
            adapter = URLS.bind_to_environ(environ)
            endpoint, args = adapter.match()
        except NotFound:
            return self._error(start_response, language, AguiError("NOT_FOUND", msg.NOT_FOUND))
        except MethodNotAllowed as exc:
            allow = ", ".join(sorted(exc.valid_methods or []))
            return self._error(
                start_response,
                language,
                AguiError("METHOD_NOT_ALLOWED", msg.METHOD_NOT_ALLOWED),
                extra=[("Allow", allow)],
            )
        except HTTPException:  # e.g. a redirect for a path variant
            return self._error(start_response, language, AguiError("NOT_FOUND", msg.NOT_FOUND))
        try:
            if endpoint == "health":
                return self.health(start_response)
            if endpoint == "ready":
                return self.ready(start_response, language)
            if endpoint == "run":
                return self.run(environ, start_response, language)
            if endpoint == "console":
                return self.console(environ, start_response, language)
            return self.cancel(environ, start_response, language, args["execution_id"])
        except AguiError as err:
            return self._error(start_response, language, err)
        except Exception:  # noqa: BLE001 - always answer JSON, never a bare 500
            log.exception("unexpected failure on %s", environ.get("PATH_INFO"))
            return self._error(start_response, language, AguiError("INTERNAL_ERROR", msg.INTERNAL_ERROR))

    # ------------------------------------------------------------------ helpers
    def _error(
        self,
        start_response: StartResponse,
        language: str,
        err: AguiError,
        extra: list[tuple[str, str]] | None = None,
    ) -> list[bytes]:
        message = translate(language, err.message, **err.params)
        if err.code == "UNAUTHORIZED":
            extra = (extra or []) + [("WWW-Authenticate", 'Bearer realm="agui-adapter"')]
        return json_response(start_response, err.status, {"error": {"code": err.code, "message": message}}, extra)

    def _check_auth(self, environ: dict[str, Any]) -> None:
        if not self._auth_token:
            return
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = header.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token.encode("utf-8"), self._auth_token)
        if not ok:
            raise AguiError("UNAUTHORIZED", msg.UNAUTHORIZED)

    @staticmethod
    def _check_content_type(environ: dict[str, Any]) -> None:
        content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise AguiError("UNSUPPORTED_MEDIA_TYPE", msg.UNSUPPORTED_MEDIA_TYPE)

    @staticmethod
    def _check_accept(environ: dict[str, Any]) -> None:
        accept = environ.get("HTTP_ACCEPT", "").strip()
        if not accept:
            return
        for media, q in weighted_items(accept):
            if q > 0 and media.lower() in ("text/event-stream", "text/*", "*/*"):
                return
        raise AguiError("NOT_ACCEPTABLE", msg.NOT_ACCEPTABLE)

    @staticmethod
    def _read_body(environ: dict[str, Any], limit: int, too_large: str) -> bytes:
        length = environ.get("CONTENT_LENGTH", "")
        if length:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared > limit:
                raise AguiError("REQUEST_TOO_LARGE", too_large, {"limit": limit})
        stream = get_input_stream(environ, safe_fallback=False, max_content_length=None)
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = stream.read(_READ_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise AguiError("REQUEST_TOO_LARGE", too_large, {"limit": limit})
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _parse_json(body: bytes, invalid: str) -> Any:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise AguiError("INVALID_JSON", invalid) from None

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
            },
        )

    def ready(self, start_response: StartResponse, language: str) -> list[bytes]:
        if self.kernel.health(timeout=2.0):
            return json_response(start_response, 200, {"status": "ready"})
        return self._error(start_response, language, AguiError("A2A_UNAVAILABLE", msg.KERNEL_NOT_READY))

    def console(self, environ: dict[str, Any], start_response: StartResponse, language: str) -> list[bytes]:
        """The console page for a browser's ``GET /``; any other request keeps the JSON 405."""
        if environ.get("REQUEST_METHOD") != "GET" or not console_page.wants_page(environ.get("HTTP_ACCEPT", "")):
            err = AguiError("METHOD_NOT_ALLOWED", msg.METHOD_NOT_ALLOWED)
            return self._error(start_response, language, err, extra=[("Allow", "POST")])
        body = console_page.page()
        start_response("200 OK", console_page.PAGE_HEADERS + [("Content-Length", str(len(body)))])
        return [body]

    def run(self, environ: dict[str, Any], start_response: StartResponse, language: str) -> Iterable[bytes]:
        self._check_auth(environ)
        self._check_content_type(environ)
        self._check_accept(environ)
        body = self._read_body(environ, MAX_RUN_BODY, msg.BODY_TOO_LARGE)
        payload = self._parse_json(body, msg.INVALID_JSON)
        language = negotiate_language(
            environ.get("HTTP_ACCEPT_LANGUAGE"), preferred_language_hint(payload), self.default_language
        )
        try:
            run_input = validate_run_input(payload)
            check_thread_header(environ.get("HTTP_X_AGUI_THREAD_ID"), run_input.thread_id)
            admission = self.engine.admit(run_input, language)
        except AguiError as err:
            log.info("POST / refused: %s", err.code)
            return self._error(start_response, language, err)
        log.info("run %s admitted on thread %s (%s)", run_input.run_id, run_input.thread_id, admission.mode)
        start_response("200 OK", list(SSE_HEADERS))
        return self.engine.stream(admission)

    def cancel(
        self, environ: dict[str, Any], start_response: StartResponse, language: str, execution_id: str
    ) -> Iterable[bytes]:
        self._check_auth(environ)
        self._check_content_type(environ)
        body = self._read_body(environ, MAX_CANCEL_BODY, msg.CANCEL_BODY_TOO_LARGE)
        payload = self._parse_json(body, msg.CANCEL_INVALID_JSON)
        if not isinstance(payload, dict):
            raise AguiError("INVALID_INPUT", msg.CANCEL_NOT_AN_OBJECT)
        thread_id, ros_id = payload.get("threadId"), payload.get("rosInvocationId")
        if not (isinstance(thread_id, str) and thread_id and isinstance(ros_id, str) and ros_id):
            raise AguiError("INVALID_INPUT", msg.CANCEL_FIELDS_REQUIRED)
        status = self.engine.cancel_execution(thread_id, ros_id, execution_id)
        return json_response(start_response, 200, {"executionId": execution_id, "status": status})
