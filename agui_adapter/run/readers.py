"""Reader threads kept warm: a run's kernel pump starts on one without waiting for a new thread.

Each run reads its kernel stream on a thread of its own (the design card's reader thread,
``pump``). Starting a new ``threading.Thread`` for every run costs the run a thread's birth
on its way to the first delta: ``start()`` waits until the new thread runs, and on a busy
machine that wait is the scheduler's, up to milliseconds. So a reader thread that finished
its run waits a while for the next one (``IDLE_SECONDS``), and a run hands its reader work
to such a thread with one queue put, going on at once (it makes the run's journal while the
kernel answers). At most ``MAX_IDLE`` threads wait at any time; the others end, as does a
waiting thread nobody called for within ``IDLE_SECONDS``, so a burst of runs leaves no
crowd of threads behind. A thread still serves one run at a time: the design is unchanged.
A forked child (a WSGI server's worker forked after the application was loaded) forgets the
parent's waiting threads, which it does not have.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger("agui_adapter.run.readers")

#: How long a reader thread with nothing to read waits for the next run before it ends.
IDLE_SECONDS = 10.0
#: How many reader threads may wait for work at once.
MAX_IDLE = 8

Work = Callable[[], None]


class ReaderThreads:
    """Runs each piece of work given to ``run`` on a thread of its own, reusing idle ones."""

    def __init__(self, *, idle_seconds: float = IDLE_SECONDS, max_idle: int = MAX_IDLE) -> None:
        self._idle_seconds = idle_seconds
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Work]] = []  # one inbox per waiting thread, newest last
        _POOLS.add(self)

    def run(self, work: Work, name: str = "kernel-reader") -> None:
        """Start ``work`` on a waiting thread, or on a new one (``name``) when none waits."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put(work)
            return
        threading.Thread(target=self._serve, args=(work,), name=name, daemon=True).start()

    def _forget_idle(self) -> None:
        """In a forked child: the waiting threads were the parent's."""
        self._lock = threading.Lock()
        self._idle = []

    def idle(self) -> int:
        """How many threads wait for work now."""
        with self._lock:
            return len(self._idle)

    def _serve(self, work: Work) -> None:
        inbox: queue.SimpleQueue[Work] = queue.SimpleQueue()
        while True:
            try:
                work()
            except Exception:  # noqa: BLE001 - the work reports its own failures; the thread goes on
                log.exception("a reader thread's work failed")
            del work
            with self._lock:
                if len(self._idle) >= self._max_idle:
                    return
                self._idle.append(inbox)
            try:
                work = inbox.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody took this thread: it ends
                        self._idle.remove(inbox)
                        return
                work = inbox.get()  # taken just now: its work is on the way


_POOLS: weakref.WeakSet[ReaderThreads] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget_idle()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

#: The process's reader threads (every run's pump uses them).
READERS = ReaderThreads()
