"""How a run is summed up for operators, once it is over (``run.driver``).

Moved out of ``RunDriver``: one log line sums the run up (outcome, error code, events, bytes,
duration; its fields also as structured extras for JSON logs, ``logs``), and the run's span
(``tracing``) ends with the same figures.
"""

from __future__ import annotations

import logging
from typing import Any

from agui_adapter.run import effects as fx

log = logging.getLogger("agui_adapter.run")


def log_line(run_id: str, thread_id: str, finish: fx.Finish | None, events: int, sent: int, duration: float) -> None:
    """The run's one summary line; ``sent``: the bytes of the whole stream, its final chunk included."""
    outcome = finish.outcome.value if finish is not None else "abandoned"
    code = finish.code if finish is not None else None
    log.info(
        "run %s on thread %s: %s, %d events, %d bytes, %.3f s",
        run_id,
        thread_id,
        code or outcome,
        events,
        sent,
        duration,
        extra={
            "outcome": outcome,
            "error_code": code,
            "events_sent": events,
            "bytes_sent": sent,
            "duration_seconds": round(duration, 6),
        },
    )


def end_trace(trace: Any, finish: fx.Finish | None, events: int, sent: int) -> None:
    """End the run's span with its outcome (``abandoned`` when it never finished)."""
    outcome = finish.outcome.value if finish is not None else "abandoned"
    trace.end(
        error=(finish.code or "error") if outcome == "error" and finish is not None else None,
        outcome=outcome,
        error_code=finish.code if finish is not None else None,
        events_sent=events,
        bytes_sent=sent,
    )
