"""One bounded line about an unexpected exception, for the log.

Why this module exists: a traceback is the wrong thing to log about a request. An exception
raised while handling client input may quote that input in its message and in every frame
of a deep stack (a ``RecursionError`` from a path of a thousand components quoted the path a
thousand times: 2.3 MB of log from a 3 KB request), and Python chains the exception being
handled under it. :func:`describe` says what an operator needs to find the bug (the
exception's type, the start of its message, where it was raised) in one line of bounded
length, whatever the exception holds; the request id is added by the edge's log record
factory (``logs.install_request_id_logging``).
"""

from __future__ import annotations

import os
import traceback

__all__ = ["MAX_MESSAGE", "describe"]

#: How much of an exception's message a log line keeps (characters).
MAX_MESSAGE = 300


def _clip(text: str, limit: int) -> str:
    # one line: control characters (newlines, a CR that would rewrite a terminal line) shown escaped
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii", "replace")
    return text if len(text) <= limit else text[:limit] + f"...({len(text) - limit} more)"


def describe(exc: BaseException, limit: int = MAX_MESSAGE) -> str:
    """``Type: message (at file.py:123 in function)``, on one line, at most about
    ``limit + 200`` characters. Never raises (an exception whose ``str`` fails still has a type)."""
    name = type(exc).__qualname__
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure it describes
        message = "<unprintable>"
    where = ""
    try:
        frames = traceback.extract_tb(exc.__traceback__, limit=-1) if exc.__traceback__ is not None else []
        if frames:
            last = frames[-1]
            where = f" (at {_clip(os.path.basename(last.filename), 80)}:{last.lineno} in {_clip(last.name, 80)})"
    except Exception:  # noqa: BLE001
        where = ""
    return f"{_clip(name, 80)}: {_clip(message, limit)}{where}"
