"""What a run's driver uses of the process around it, and nothing more.

A ``RunDriver`` (and an ``AdoptedDriver``) is handed a ``RunServices`` by the engine: the
kernel client, the thread store, the journals, the settings, the metrics, the two clocks,
and the one call back into the process it needs (``run_ended``, when its body is closed);
and ``cancel_task_quietly``.
So the driver never sees the engine, and no module of ``run`` imports one that imports it
back (``tests/unit/test_run_imports.py`` checks the import graph, ``TYPE_CHECKING`` included).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.ops.metrics import Metrics
from agui_adapter.state.journal import JournalStore
from agui_adapter.state.store import ThreadStore

log = logging.getLogger("agui_adapter.run.engine")


def _nothing(_driver: Any) -> None:
    return None


@dataclass(frozen=True)
class RunServices:
    """The process's parts a run uses; one per engine, shared by its runs."""

    kernel: KernelClient
    store: ThreadStore
    journals: JournalStore
    settings: Settings
    metrics: Metrics
    #: the wall clock: interrupt expiry, the timestamps of records and events (a fake one in tests)
    clock: Callable[[], float] = time.time
    #: the monotonic clock of the disconnect grace period (``detached``; a fake one in tests)
    monotonic: Callable[[], float] = time.monotonic
    #: a run's body was closed: it leaves the live runs and gives its slot back (``registry``)
    run_ended: Callable[[Any], None] = field(default=_nothing)

    def cancel_task_quietly(self, task_id: str) -> None:
        """``CancelTask``, its failure only logged (the task may have ended already)."""
        try:
            self.kernel.cancel_task(task_id)
        except KernelRejected as exc:
            log.info("CancelTask %s: %s", task_id, exc.detail)
        except KernelUnavailable as exc:
            log.warning("CancelTask %s failed: %s", task_id, exc)
