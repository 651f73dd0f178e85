"""An admitted run: what its machine and driver are built from.

``admission`` makes one for a new run (the thread's run lock taken, the run written down),
``adoption`` for a run taken over from a dead process. The value lives in a module of its
own so that both, and the driver, import it without importing each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.protocol.validation import RunInput
from agui_adapter.run.effects import Mode
from agui_adapter.state.record import ThreadRecord
from agui_adapter.state.store import RunLock


def context_id_for(thread_id: str) -> str:
    return "agui-" + hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:40]


def run_mode_name(mode: Mode, run_mode: str | None) -> str:
    """What ``GET /threads/{threadId}`` calls a run: turn, resume, guidance or pipeline."""
    return "pipeline" if mode is Mode.TURN and run_mode == "pipeline" else mode.value


@dataclass
class Admission:
    """An admitted run, holding its thread's run lock until it ends."""

    run_input: RunInput
    language: str
    record: ThreadRecord
    run_lock: RunLock | None  # None for guidance, which never holds the thread
    mode: Mode
    parts: list[dict[str, Any]] = field(default_factory=list)
    stale_task_id: str | None = None  # a task of the thread's previous execution that may still run
    trace: Any = None  # the run's span (``tracing``), set by the HTTP edge
    start_slot: Any = None  # its turn to start (``ops.start_gate``), set by the HTTP edge

    @property
    def run_mode(self) -> str:
        """The run's mode as operators see it: turn, resume, guidance, or pipeline (a pipeline's turn)."""
        return run_mode_name(self.mode, self.run_input.props.run_mode)

    @property
    def thread_id(self) -> str:
        return self.run_input.thread_id

    @property
    def run_id(self) -> str:
        return self.run_input.run_id
