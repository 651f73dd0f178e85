"""Log formats: the human ``text`` lines, or ``json`` lines for log pipelines.

An operator's log pipeline wants one JSON object per line with fixed keys, so that a
run can be followed by its ids rather than by grepping free text. ``--log-format json``
(``IAC_CODE_AGUI_LOG_FORMAT``) writes, for every record: ``time`` (UTC, ISO 8601, ms),
``level``, ``logger``, ``message``, ``request_id`` (set on records by the HTTP edge,
``web.install_request_id_logging``), ``thread_id`` and ``run_id`` (the AG-UI ids of the
run being carried out, from ``RUN_IDS``, which ``run.driver`` sets while it iterates or
closes a run's body; the kernel pump inherits it), ``pid``, and ``exception`` when there is
one. The unknown ones are ``null``. The one line ``run.driver`` writes when a run ends
adds ``outcome``, ``error_code``, ``events_sent``, ``bytes_sent`` and ``duration_seconds``;
any other field a log call passes with ``extra=`` is a key of its JSON line too (the access
log's ``method``, ``route``, ``status``...). ``trace_id`` and ``span_id`` are the
OpenTelemetry ids of the current span when tracing is on (``tracing.py`` sets
``trace_ids``), else ``null``.

``REQUEST_ID`` (the HTTP edge sets it) and ``RUN_IDS`` live here, with the lines they mark, so
that any module can read them (the kernel client sends the request id on to the kernel)
without importing the HTTP edge.

Neither format adds anything a log call did not already say: no secret reaches a log
line through here (the session-wide secrets check of the tests reads both).
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Callable
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: (AG-UI thread id, run id) of the run whose body is being iterated on this thread, or of the
#: request being handled (a refusal, a reattach: run id None for a cancel).
RUN_IDS: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar("agui_run_ids", default=None)
#: The id of the HTTP request being handled on this thread (None outside a request).
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("agui_request_id", default=None)

#: Structured fields a log call may pass with ``extra=`` (the per-run summary line).
RUN_FIELDS = ("outcome", "error_code", "events_sent", "bytes_sent", "duration_seconds")

#: (trace id, span id) of the current OpenTelemetry span, as hex; set by ``tracing`` when on.
trace_ids: Callable[[], tuple[str, str] | None] | None = None

#: What every LogRecord has: anything else on a record came with ``extra=``.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "thread_id",
    "run_id",
    "trace_id",
    "span_id",
    "taskName",
}


class RunContext(logging.Filter):
    """Puts the current run's ids on every record (``thread_id``, ``run_id``; None outside a
    run), and the current span's ids when tracing is on (``trace_id``, ``span_id``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run_id", None) is None:
            ids = RUN_IDS.get()
            if ids is not None:
                record.thread_id, record.run_id = ids
            elif getattr(record, "thread_id", None) is None:
                record.thread_id, record.run_id = None, None
        if trace_ids is not None and getattr(record, "trace_id", None) is None:
            current = trace_ids()
            record.trace_id, record.span_id = current if current is not None else (None, None)
        return True


#: The most of a traceback either format writes (characters; its last frames are kept).
MAX_TRACEBACK = 8 * 1024


def bounded_traceback(exc_info: Any) -> str:
    """The traceback of ``exc_info``, its last 20 frames, without the exceptions it was chained
    to, and at most :data:`MAX_TRACEBACK` characters: a deep or chained traceback quoting
    client input in every frame must not make one request cost megabytes of log."""
    import traceback

    text = "".join(traceback.format_exception(*exc_info, limit=-20, chain=False)).rstrip("\n")
    return text if len(text) <= MAX_TRACEBACK else "...(cut)\n" + text[-MAX_TRACEBACK:]


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` lines; the local time of a second is formatted once, not per record.
    Tracebacks are bounded (:func:`bounded_traceback`)."""

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return bounded_traceback(ei)

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second  # one tuple, read and replaced whole: safe across threads
        if cached[0] != second:
            cached = self._second = (second, time.strftime(self.default_time_format, self.converter(second)))
        return self.default_msec_format % (cached[1], record.msecs)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; tracebacks bounded (:func:`bounded_traceback`)."""

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return bounded_traceback(ei)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        request_id = getattr(record, "request_id", None)
        if not request_id or request_id == "-":
            request_id = None
        else:
            # the edge's record factory also appends the id to the message, for text logs
            suffix = f" [request {request_id}]"
            if message.endswith(suffix):
                message = message[: -len(suffix)]
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
            "request_id": request_id,
            "thread_id": getattr(record, "thread_id", None),
            "run_id": getattr(record, "run_id", None),
            "pid": record.process,
            "trace_id": getattr(record, "trace_id", None),
            "span_id": getattr(record, "span_id", None),
        }
        for name, value in record.__dict__.items():  # the fields given with ``extra=``
            if name not in _RECORD_ATTRIBUTES:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return _JSON.encode(entry)


_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
"""One encoder for every line (``json.dumps`` with options builds one per call)."""


def _utc(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def configure(level: str, log_format: str = "text") -> None:
    """Root logging on stderr in the chosen format (a no-op when logging is configured already)."""
    handler = logging.StreamHandler()
    handler.addFilter(RunContext())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    if handler in logging.getLogger().handlers:  # these lines are the process's logging
        # Neither format shows where a log call was made, from which thread or process
        # name: skip finding that out for every record (the logging HOWTO, "Optimization").
        logging._srcfile = None  # type: ignore[attr-defined]
        logging.logThreads = False
        logging.logMultiprocessing = False
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
