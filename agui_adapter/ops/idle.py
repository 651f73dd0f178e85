"""Idle shutdown (``--idle-shutdown SECONDS``), as upstream's ``iac-code agui`` does it.

Why it exists: deployments that start the adapter on demand (a desktop app, socket
activation, a per-user service) let it exit when nobody uses it. Upstream's rule, kept
here: the adapter is idle when no run is active **and** no thread it has run has an
interrupt pending (a thread waiting for an answer keeps the process alive however long),
and it stops when it has been idle for ``SECONDS`` since the last activity. Activity is a
run admitted or a run ended (and the start); health checks, ``/metrics``, cancels and
refused requests are not. A monitor wakes every ``min(5, max(0.1, SECONDS/4))`` seconds,
like upstream's, and asks for the same graceful stop as SIGTERM.

Where it differs: upstream looks at the thread bindings it holds in memory; this adapter
keeps none, so ``IdleWatch`` remembers the threads this process admitted runs on and reads
their records for pending interrupts. ``IdleWatch`` is pure bookkeeping (a clock is
injected); ``start_monitor`` is the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("agui_adapter.ops.idle")


def check_interval(idle_seconds: float) -> float:
    """How often the monitor looks (upstream's formula)."""
    return min(5.0, max(0.1, idle_seconds / 4))


class IdleWatch:
    """The last activity, and the threads this process has run."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.last_activity = clock()
        self._threads: set[str] = set()

    def touch(self, thread_id: str | None = None) -> None:
        """A run was admitted or ended (on ``thread_id``)."""
        with self._lock:
            self.last_activity = self.clock()
            if thread_id is not None:
                self._threads.add(thread_id)

    def threads(self) -> list[str]:
        with self._lock:
            return list(self._threads)

    def forget(self, thread_ids: Iterable[str]) -> None:
        """These threads wait for nothing any more: no need to read their records again."""
        with self._lock:
            self._threads.difference_update(thread_ids)

    def idle_seconds(self, live_runs: int, waiting: bool) -> float:
        """How long the adapter has been idle (0 while a run is live or an interrupt waits)."""
        if live_runs or waiting:
            return 0.0
        with self._lock:
            return max(0.0, self.clock() - self.last_activity)


def start_monitor(
    idle_seconds: float,
    watch: IdleWatch,
    live_runs: Callable[[], int],
    waiting_threads: Callable[[list[str]], list[str]],
    on_idle: Callable[[], None],
) -> threading.Event:
    """A daemon thread calling ``on_idle`` once the adapter has been idle for ``idle_seconds``;
    ``waiting_threads(ids)`` returns those of ``ids`` with an interrupt pending. Set the
    returned event to stop it."""
    stop = threading.Event()

    def loop() -> None:
        interval = check_interval(idle_seconds)
        while not stop.wait(interval):
            threads = watch.threads()
            waiting = waiting_threads(threads) if threads else []
            watch.forget(set(threads) - set(waiting))
            if watch.idle_seconds(live_runs(), bool(waiting)) >= idle_seconds:
                log.info("idle for %gs (--idle-shutdown): stopping", idle_seconds)
                on_idle()
                return

    threading.Thread(target=loop, name="idle-shutdown", daemon=True).start()
    return stop
