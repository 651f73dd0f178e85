"""The process's live runs: every run whose body is open, each holding a run slot.

The driver leaves the registry when its body is closed (``ended``, its ``RunServices.run_ended``),
once however often that happens, and gives its slot back; when the last live run leaves, the
heap trimmer is told (``ops.heap``). The others ask it: which run of a
thread is live here (``GET /threads/{threadId}``, the cancel extension, admission waiting
for a run whose client just left) and which runs a shutdown ends.
"""

from __future__ import annotations

import threading

from agui_adapter.ops.heap import HEAP, HeapTrimmer
from agui_adapter.ops.idle import IdleWatch
from agui_adapter.ops.metrics import Metrics
from agui_adapter.run.driver import RunDriver
from agui_adapter.run.effects import Mode
from agui_adapter.run.slots import RunSlots


class LiveRuns:
    def __init__(self, slots: RunSlots, metrics: Metrics, idle: IdleWatch, heap: HeapTrimmer = HEAP) -> None:
        self._slots = slots
        self._metrics = metrics
        self._idle = idle
        self._heap = heap  # told when the last live run ends, and when runs start again
        self._live: set[RunDriver] = set()
        self._lock = threading.Lock()

    def opened(self, driver: RunDriver, *, adopted: bool = False) -> None:
        """A run's body is open (its slot already taken)."""
        with self._lock:
            first = not self._live
            self._live.add(driver)
        if first:
            self._heap.busy()
        self._metrics.run_opened()
        if adopted:
            self._metrics.adopted()

    def ended(self, driver: RunDriver) -> None:
        """A run's body was closed: it leaves the live runs and gives its slot back."""
        with self._lock:
            live = driver in self._live
            self._live.discard(driver)
            last = live and not self._live
        if live:  # once per run, however often its body is closed
            self._metrics.run_closed()
            self._slots.give()
            self._idle.touch()
        if last:
            self._heap.idle()  # the heaps are trimmed once it stays so for a second

    def holders(self, thread_id: str) -> list[RunDriver]:
        """The runs here that hold the thread's run lock."""
        with self._lock:
            return [d for d in self._live if d.thread_id == thread_id and d.holds_thread]

    def of_execution(self, execution_id: str) -> list[RunDriver]:
        with self._lock:
            return [d for d in self._live if d.machine.execution_id == execution_id]

    def driver_of(self, thread_id: str) -> RunDriver | None:
        """This process's live run of the thread: the one holding it, else a guidance run."""
        with self._lock:
            drivers = [d for d in self._live if d.thread_id == thread_id and not d.machine.ended]
        drivers.sort(key=lambda d: d.machine.mode is Mode.GUIDANCE)
        return drivers[0] if drivers else None

    def count(self) -> int:
        with self._lock:
            return len(self._live)

    def all(self) -> list[RunDriver]:
        with self._lock:
            return list(self._live)
