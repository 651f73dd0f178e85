"""``logs.write_direct`` writes the line ``logging`` would have written, or nothing.

The access log skips ``logging``'s record machinery when the process's logging is the
adapter's own (``logs.configure``): the line must be the one the record would have made,
in both formats, and any other setup (another handler, a filter, a factory, a logger that
does not propagate...) must get its record as before. Each test sets the adapter's logging
up on a fresh root, writing to a string, and puts the test runner's back when it ends.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agui_adapter.ops import logs
from agui_adapter.web import access_log

ACCESS = logging.getLogger("agui_adapter.access")
TEXT_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
FIELDS = {"error_code": "INVALID_INPUT", "method": "POST", "path": "/", "status": 400, "duration_seconds": 0.000123}


@contextlib.contextmanager
def own_logging(log_format: str) -> Iterator[io.StringIO]:
    """The adapter's logging (``configure`` and the request id factory) on a fresh root."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_factory = logging.getLogRecordFactory()
    saved_module = (logs._own, logs._request_id_factory, logs._factory_wraps)
    saved_flags = (logging._srcfile, logging.logThreads, logging.logMultiprocessing)  # type: ignore[attr-defined]
    root.handlers.clear()
    logging.setLogRecordFactory(logging.LogRecord)
    logs._own = logs._request_id_factory = logs._factory_wraps = None
    stream = io.StringIO()
    try:
        logs.configure("info", log_format)
        logs.install_request_id_logging()
        handler = root.handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(stream)
        yield stream
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging.setLogRecordFactory(saved_factory)
        logs._own, logs._request_id_factory, logs._factory_wraps = saved_module
        logging._srcfile, logging.logThreads, logging.logMultiprocessing = saved_flags  # type: ignore[attr-defined]


def by_record(message: str, fields: dict[str, Any]) -> None:
    """The usual way: a record with ``fields`` as ``extra=`` would set them."""
    record = ACCESS.makeRecord(ACCESS.name, logging.INFO, "(access)", 0, message, None, None)
    record.__dict__.update(fields)
    ACCESS.handle(record)


def take(stream: io.StringIO) -> list[str]:
    lines = stream.getvalue().splitlines()
    stream.seek(0)
    stream.truncate()
    return lines


@contextlib.contextmanager
def context(request_id: str | None, ids: tuple[str, str | None] | None) -> Iterator[None]:
    request_token, ids_token = logs.REQUEST_ID.set(request_id), logs.RUN_IDS.set(ids)
    try:
        yield
    finally:
        logs.RUN_IDS.reset(ids_token)
        logs.REQUEST_ID.reset(request_token)


CASES = [
    ("no request", None, None, '127.0.0.1 "GET /health HTTP/1.1" 200 12 0.000s health ""', {}),
    ("a refusal", "0123abcd" * 4, ("t-1", "r-1"), '::1 "POST / HTTP/1.1" 400 108 0.001s run "x"', FIELDS),
    (
        "a cancel",
        "req-7",
        ("t-2", None),
        'a "POST /x HTTP/1.0" 202 2 1.500s cancel "é 中 \\"q\\""',
        {"route": "cancel"},
    ),
    ("the suffix already", "rid", None, "m [request rid]", {}),
]


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize(("name", "request_id", "ids", "message", "fields"), CASES, ids=[c[0] for c in CASES])
def test_the_direct_line_is_the_record_s_line(
    log_format: str,
    name: str,
    request_id: str | None,
    ids: tuple[str, str | None] | None,
    message: str,
    fields: dict[str, Any],
) -> None:
    with own_logging(log_format) as stream, context(request_id, ids):
        assert logs.write_direct(ACCESS, logging.INFO, message, lambda: dict(fields))
        direct = take(stream)
        by_record(message, dict(fields))
        usual = take(stream)
    assert len(direct) == len(usual) == 1
    if log_format == "text":
        assert TEXT_TIME.match(direct[0]) and TEXT_TIME.match(usual[0])
        assert TEXT_TIME.sub("", direct[0]) == TEXT_TIME.sub("", usual[0])
        assert direct[0].endswith(f" [request {request_id}]") == bool(request_id)
    else:
        got, expected = json.loads(direct[0]), json.loads(usual[0])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", got.pop("time"))
        expected.pop("time")
        assert list(got.items()) == list(expected.items())  # the same keys, in the same order
        assert got["request_id"] == request_id and (got["thread_id"], got["run_id"]) == (ids or (None, None))


def test_the_text_time_is_the_formatter_s_to_the_millisecond() -> None:
    formatter = logs.TextFormatter(logs.TEXT_FORMAT)
    for created in (1_700_000_000.0, 1_700_000_000.9996, 1_765_000_123.0421, time.time()):
        record = logging.LogRecord("n", logging.INFO, "", 0, "m", None, None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert formatter.line(created, record.msecs, "INFO", "n", "m") == formatter.format(record)


def _another_root_handler() -> Callable[[], None]:
    handler = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(handler)
    return lambda: logging.getLogger().removeHandler(handler)


def _a_handler_of_its_own() -> Callable[[], None]:
    handler = logging.StreamHandler(io.StringIO())
    ACCESS.addHandler(handler)
    return lambda: ACCESS.removeHandler(handler)


def _a_filter_on(logger: logging.Logger) -> Callable[[], Callable[[], None]]:
    def change() -> Callable[[], None]:
        only = logging.Filter("nothing")
        logger.addFilter(only)
        return lambda: logger.removeFilter(only)

    return change


def _no_propagation() -> Callable[[], None]:
    parent = logging.getLogger("agui_adapter")
    parent.propagate = False
    return lambda: setattr(parent, "propagate", True)


def _handler_level() -> Callable[[], None]:
    handler = logging.getLogger().handlers[0]
    handler.setLevel(logging.WARNING)
    return lambda: handler.setLevel(logging.NOTSET)


def _another_factory() -> Callable[[], None]:
    previous = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *a, **k: previous(*a, **k))
    return lambda: logging.setLogRecordFactory(previous)


def _another_formatter() -> Callable[[], None]:
    handler = logging.getLogger().handlers[0]
    formatter = handler.formatter
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    return lambda: handler.setFormatter(formatter)


def _another_filter_on_the_handler() -> Callable[[], None]:
    handler = logging.getLogger().handlers[0]
    only = logging.Filter("")
    handler.addFilter(only)
    return lambda: handler.removeFilter(only)


def _disabled() -> Callable[[], None]:
    ACCESS.disabled = True
    return lambda: setattr(ACCESS, "disabled", False)


CHANGES = {
    "another root handler": _another_root_handler,
    "a handler of the logger's own": _a_handler_of_its_own,
    "a filter on the logger": _a_filter_on(ACCESS),
    "a filter on the root": _a_filter_on(logging.getLogger()),
    "a parent that does not propagate": _no_propagation,
    "the handler's level": _handler_level,
    "another record factory": _another_factory,
    "another formatter": _another_formatter,
    "another filter on the handler": _another_filter_on_the_handler,
    "a disabled logger": _disabled,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_anything_else_on_the_record_s_way_gets_the_record(change: str) -> None:
    with own_logging("text") as stream:
        undo = CHANGES[change]()
        try:
            assert not logs.write_direct(ACCESS, logging.INFO, "m", dict)
            assert stream.getvalue() == ""
        finally:
            undo()
        assert logs.write_direct(ACCESS, logging.INFO, "m", dict)  # back to the adapter's own
        assert take(stream)[0].endswith("INFO agui_adapter.access: m")


def test_without_the_request_id_factory_nothing_is_written_directly() -> None:
    with own_logging("text") as stream:
        logs._request_id_factory = None
        assert not logs.write_direct(ACCESS, logging.INFO, "m", dict)
        assert stream.getvalue() == ""


def test_a_stream_that_fails_leaves_the_line_to_logging() -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    with own_logging("text"):
        logging.getLogger().handlers[0].setStream(Broken())  # type: ignore[attr-defined]
        assert not logs.write_direct(ACCESS, logging.INFO, "m", dict)


def test_the_access_line_reaches_an_embedder_s_handler_too() -> None:
    """Embedded with a handler of its own on the root, the access line is a record for both."""
    with own_logging("json") as stream:
        theirs = io.StringIO()
        extra = logging.StreamHandler(theirs)
        logging.getLogger().addHandler(extra)
        try:
            exchange = access_log.Exchange({"REQUEST_METHOD": "GET", "PATH_INFO": "/health"}, "rid-1")
            exchange.status, exchange.sent = 200, 12
            access_log.write_line(exchange, "health")
        finally:
            logging.getLogger().removeHandler(extra)
        ours = json.loads(take(stream)[0])
    assert ours["route"] == "health" and ours["status"] == 200 and ours["bytes_sent"] == 12
    assert theirs.getvalue().startswith('- "GET /health "')  # the record's message, through their handler
