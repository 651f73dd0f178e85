"""The built-in server's worker threads: requests the I/O thread cannot answer at once run here.

Why it exists: the server (``server.py``) reads requests on one I/O thread and hands every one
it cannot answer without blocking (a run, a stream, a slow or partial request) to a thread of
its own. Starting a thread per request would cost a thread start each time (which, with many
threads busy, waits for the GIL), so a finished worker waits for the next request, up to
``idle_seconds``, and at most ``keep_idle`` of them wait at once; a request with no worker
waiting starts a new one. What a worker does with a request is the server's (``run``).

Bookkeeping: ``_idle`` counts the workers that will take a job from the queue; the I/O thread
takes one of them (under the lock) before it puts a job, so a job never waits for a worker
that is about to exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_WORKERS = 32
"""Workers kept waiting for the next request; more exit once done."""
WORKER_IDLE_SECONDS = 30.0
"""A waiting worker exits after this long without a request."""


class WorkerPool:
    """Threads that call ``run(*job)`` for each job submitted, then wait for the next one."""

    def __init__(
        self,
        run: Callable[..., None],
        *,
        keep_idle: int = IDLE_WORKERS,
        idle_seconds: float = WORKER_IDLE_SECONDS,
        name: str = "http-worker",
    ) -> None:
        self._run = run
        self._keep_idle = keep_idle
        self._idle_seconds = idle_seconds
        self._name = name
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()

    def submit(self, job: tuple[Any, ...]) -> bool:
        """Run ``job`` on a waiting worker, else on a new one; False when no thread can start."""
        with self._lock:
            waiting = self._idle > 0
            if waiting:
                self._idle -= 1
        if waiting:
            self._jobs.put(job)
            return True
        try:
            threading.Thread(target=self._work, args=(job,), name=self._name, daemon=True).start()
        except RuntimeError:  # can't start new thread
            return False
        return True

    def _work(self, job: tuple[Any, ...]) -> None:
        while True:
            self._run(*job)
            with self._lock:
                if self._idle >= self._keep_idle:
                    return
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self._idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody counts on this worker: it exits
                        self._idle -= 1
                        return
                job = self._jobs.get()  # a job is on its way to this worker
