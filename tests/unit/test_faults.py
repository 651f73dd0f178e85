"""faults.describe: one bounded line about any exception."""

from __future__ import annotations

from agui_adapter.ops.faults import describe


def deep(n: int, payload: str) -> None:
    if n == 0:
        raise ValueError(payload)
    deep(n - 1, payload)


def test_one_bounded_line_whatever_the_exception_holds() -> None:
    try:
        deep(200, "line one\nline two\r" + "x" * 100_000)
    except ValueError as exc:
        line = describe(exc)
    assert "\n" not in line and "\r" not in line
    assert len(line) < 600
    assert line.startswith("ValueError: line one\\nline two\\r")
    assert "more)" in line and "test_faults.py" in line and "in deep" in line


def test_an_unprintable_exception_still_has_a_type() -> None:
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe(Odd()) == "test_an_unprintable_exception_still_has_a_type.<locals>.Odd: <unprintable>"


def test_the_log_formats_bound_any_traceback_left() -> None:
    import logging
    import sys

    from agui_adapter.ops.logs import MAX_TRACEBACK, JsonFormatter, TextFormatter

    try:
        try:
            deep(300, "inner " + "q" * 50_000)
        except ValueError:
            deep(300, "outer " + "p" * 50_000)
    except ValueError:
        info = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", None, info)
    for formatter in (TextFormatter("%(message)s"), JsonFormatter()):
        text = formatter.format(record)
        assert len(text) < MAX_TRACEBACK + 1024
        assert "q" * 100 not in text  # the exception it was chained to is not written
