"""Threads kept warm: work starts on a thread that finished its last piece, without a thread's birth.

Why this module exists: the built-in server runs each request it cannot answer at once on a
worker thread (``http.server``), and each run reads its kernel stream on a reader thread of
its own (the design card's reader thread, ``run.pump``). Starting a new ``threading.Thread``
for each costs a thread's birth: ``start()`` waits until the new thread runs, and on a busy
machine that wait is the scheduler's (and the GIL's), up to milliseconds. So a thread that
finished its work waits a while for the next piece (``idle_seconds``), and work is handed to
such a thread with one queue put, the caller going on at once. At most ``max_idle`` threads
wait at any time; the others end, as does a waiting thread nobody called for within
``idle_seconds``, so a burst leaves no crowd of threads behind. A thread still does one piece
of work at a time. Each waiting thread has an inbox of its own, taken under the lock before
work is put in it, so work never waits for a thread that is about to end. A forked child (a
WSGI server's worker forked after the application was loaded) forgets the parent's waiting
threads, which it does not have.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger("agui_adapter.ops.warm_threads")

Work = Callable[[], None]


class WarmThreads:
    """Runs each piece of work given to ``run`` on a thread of its own, reusing idle ones."""

    def __init__(self, *, idle_seconds: float, max_idle: int, name: str) -> None:
        self._idle_seconds = idle_seconds
        self._max_idle = max_idle
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Work]] = []  # one inbox per waiting thread, newest last
        _POOLS.add(self)

    def run(self, work: Work) -> bool:
        """Start ``work`` on a waiting thread, or on a new one when none waits; False when no
        thread can start (the system's limit)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put(work)
            return True
        try:
            threading.Thread(target=self._serve, args=(work,), name=self._name, daemon=True).start()
        except RuntimeError:  # can't start new thread
            return False
        return True

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
                log.exception("a %s thread's work failed", self._name)
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


_POOLS: weakref.WeakSet[WarmThreads] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget_idle()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
