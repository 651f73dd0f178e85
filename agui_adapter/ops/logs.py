"""Log formats: the human ``text`` lines, or ``json`` lines for log pipelines.

An operator's log pipeline wants one JSON object per line with fixed keys, so that a
run can be followed by its ids rather than by grepping free text. ``--log-format json``
(``IAC_CODE_AGUI_LOG_FORMAT``) writes, for every record: ``time`` (UTC, ISO 8601, ms),
``level``, ``logger``, ``message``, ``request_id`` (set on records by the HTTP edge,
``install_request_id_logging``), ``thread_id`` and ``run_id`` (the AG-UI ids of the
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

``write_direct`` writes a line the way a record would have been written, straight to the
stream of the handler ``configure`` installed, when nothing on the record's way could change
it (the access log's one line per request: see its docstring); any other logging setup gets
its record as usual.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agui_adapter.ops import process_local

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
        return self.asctime(record.created, record.msecs)

    def asctime(self, created: float, msecs: float) -> str:
        """``%(asctime)s`` of a record made at ``created`` (``msecs`` as the record has them)."""
        second = int(created)
        cached = self._second  # one tuple, read and replaced whole: safe across threads
        if cached[0] != second:
            cached = self._second = (second, time.strftime(self.default_time_format, self.converter(second)))
        return self.default_msec_format % (cached[1], msecs)

    def line(self, created: float, msecs: float, levelname: str, name: str, message: str) -> str:
        """What ``format`` makes of a record with these attributes and no exception (``TEXT_FORMAT``)."""
        return f"{self.asctime(created, msecs)} {levelname} {name}: {message}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; tracebacks bounded (:func:`bounded_traceback`)."""

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return bounded_traceback(ei)

    def format(self, record: logging.LogRecord) -> str:
        fields = {name: value for name, value in record.__dict__.items() if name not in _RECORD_ATTRIBUTES}
        exception = None
        if record.exc_info:
            exception = self.formatException(record.exc_info)
        elif record.exc_text:
            exception = record.exc_text
        return self.line(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            getattr(record, "request_id", None),
            (getattr(record, "thread_id", None), getattr(record, "run_id", None)),
            process_local.pid() if record.process is None else record.process,
            (getattr(record, "trace_id", None), getattr(record, "span_id", None)),
            fields,
            exception,
        )

    def line(
        self,
        created: float,
        levelname: str,
        name: str,
        message: str,
        request_id: str | None,
        ids: tuple[str | None, str | None],
        pid: int | None,
        trace: tuple[str | None, str | None],
        fields: Mapping[str, Any],
        exception: str | None = None,
    ) -> str:
        """The JSON line of a record with these attributes; ``fields``: those given with
        ``extra=``, keys after the fixed ones."""
        if not request_id or request_id == "-":
            request_id = None
        else:
            # the edge's record factory also appends the id to the message, for text logs
            suffix = f" [request {request_id}]"
            if message.endswith(suffix):
                message = message[: -len(suffix)]
        entry: dict[str, Any] = {
            "time": _utc(created),
            "level": levelname,
            "logger": name,
            "message": message,
            "request_id": request_id,
            "thread_id": ids[0],
            "run_id": ids[1],
            "pid": pid,
            "trace_id": trace[0],
            "span_id": trace[1],
        }
        entry.update(fields)
        if exception is not None:
            entry["exception"] = exception
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
        global _own
        _own = handler
        # Neither format shows where a log call was made, from which thread or process
        # name: skip finding that out for every record (the logging HOWTO, "Optimization").
        # The JSON lines' pid comes from ``process_local``, without a ``getpid`` per record.
        logging._srcfile = None  # type: ignore[attr-defined]
        logging.logThreads = False
        logging.logMultiprocessing = False
        logging.logProcesses = False
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


_factory_lock = threading.Lock()
_request_id_factory: Callable[..., logging.LogRecord] | None = None
"""The record factory ``install_request_id_logging`` set, once it has."""
_factory_wraps: Callable[..., logging.LogRecord] | None = None
"""The factory it calls first (``logging.LogRecord`` unless another was set before)."""


def install_request_id_logging() -> None:
    """Make every log record written during a request carry its id: as ``record.request_id``
    (``-`` outside a request) and at the end of the message, whatever the handler's format."""
    global _request_id_factory, _factory_wraps
    with _factory_lock:
        if _request_id_factory is not None:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            request_id = REQUEST_ID.get()
            record.request_id = request_id or "-"
            if request_id:
                try:
                    message = record.getMessage()
                except Exception:  # noqa: BLE001 - a bad log call keeps its own failure mode
                    return record
                record.msg, record.args = f"{message} [request {request_id}]", None
            return record

        logging.setLogRecordFactory(factory)
        _request_id_factory, _factory_wraps = factory, previous


_own: logging.StreamHandler[Any] | None = None
"""The handler ``configure`` installed, while it is the root's."""


def _only_own_handler(logger: logging.Logger, levelno: int) -> logging.StreamHandler[Any] | None:
    """The handler ``configure`` installed when a record of ``logger`` at ``levelno`` would
    reach it and nothing else, unchanged on its way but for this module's factory and filter:
    no other handler, filter, factory or logger class. None otherwise."""
    handler = _own
    if handler is None or handler.level > levelno or type(handler) is not logging.StreamHandler:
        return None
    if _request_id_factory is None or logging.getLogRecordFactory() is not _request_id_factory:
        return None
    if _factory_wraps is not logging.LogRecord:
        return None
    if len(handler.filters) != 1 or type(handler.filters[0]) is not RunContext:
        return None
    node: logging.Logger | None = logger
    while node is not None:
        if type(node) is not logging.Logger and node is not logging.root:
            return None
        if node.filters or node.disabled:
            return None
        if node is logging.root:
            return handler if len(node.handlers) == 1 and node.handlers[0] is handler else None
        if node.handlers or not node.propagate:
            return None
        node = node.parent
    return None


def write_direct(logger: logging.Logger, levelno: int, message: str, fields: Callable[[], Mapping[str, Any]]) -> bool:
    """Write the line a record of ``logger`` (``message``, ``fields()`` as ``extra=``: none of
    a record's own attributes, asked for by the JSON format only; no exception) would have
    been written as, straight to the stream of the handler ``configure`` installed, under its
    lock, when nothing on the record's way could change it (``_only_own_handler``); False when
    that is not so or the write failed (nothing counts as written then): the caller logs the
    record the usual way. The caller has checked ``logger.isEnabledFor(levelno)``.

    Why: the access log writes one line per request, and the record's way through
    ``logging`` (its factory, filters, handler and formatter calls) was the largest part of a
    refusal's work in the application: timed on one thread with the app alone, a refusal took
    33 us of CPU with it and 21 us with the line written here. The lines are the same
    (``tests/unit/test_log_lines.py`` compares them with the records' in both formats).
    """
    handler = _only_own_handler(logger, levelno)
    if handler is None:
        return False
    formatter = handler.formatter
    created = time.time()
    levelname = logging.getLevelName(levelno)
    request_id = REQUEST_ID.get()
    if request_id:  # as the factory does
        message = f"{message} [request {request_id}]"
    if type(formatter) is TextFormatter and formatter._fmt == TEXT_FORMAT and formatter.datefmt is None:
        msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord has them
        line = formatter.line(created, msecs, levelname, logger.name, message)
    elif type(formatter) is JsonFormatter:
        ids = RUN_IDS.get() or (None, None)
        trace = (trace_ids() if trace_ids is not None else None) or (None, None)
        line = formatter.line(
            created, levelname, logger.name, message, request_id, ids, process_local.pid(), trace, fields()
        )
    else:
        return False
    try:
        handler.acquire()
        try:
            stream = handler.stream
            stream.write(line + handler.terminator)
            if hasattr(stream, "flush"):  # as StreamHandler.flush
                stream.flush()
        finally:
            handler.release()
    except Exception:  # noqa: BLE001 - the usual way reports it (logging's handleError)
        return False
    return True
