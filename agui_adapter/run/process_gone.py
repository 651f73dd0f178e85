"""The "process gone" ending: how a run whose adapter process died ends when nobody can go on with it.

A run's events are in its journal as they were sent. When the process writing them dies and
the run cannot be adopted (``run.adoption``: the kernel lost its task, another run holds its
thread, no process takes it over while a reader waits), whoever ends the run for it (a reader
following the journal, ``web.app``; the process concluding the journal, ``run.adoption``)
sends the same ending: END for every span the journal left open (``protocol.spans``), then
``RUN_ERROR EXECUTION_LOST`` saying the outcome is unknown, in the client's language. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import Code
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.i18n import translate
from agui_adapter.protocol.spans import OpenSpans


def process_gone_ending(sent: Iterable[Mapping[str, Any]], ts: int, language: str) -> list[Event]:
    """The events that end a run whose process died after sending ``sent`` (the journal's
    events, in order): the open spans' ENDs, then ``RUN_ERROR EXECUTION_LOST``."""
    closing = OpenSpans(sent).closing(ts)
    return [*closing, ev.run_error(ts, Code.EXECUTION_LOST, translate(language, msg.RUN_PROCESS_GONE))]
