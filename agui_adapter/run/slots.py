"""The process's run slots: at most ``max_runs`` runs at once (turns, resumes, guidance and
adopted runs alike). A run takes one before anything is written or sent, or is refused
``SERVER_BUSY``; it gives it back when its body is closed (``registry.LiveRuns.ended``).
The count is per process."""

from __future__ import annotations

import threading


class RunSlots:
    __slots__ = ("_semaphore", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._semaphore = threading.BoundedSemaphore(size)

    def take(self) -> bool:
        """A slot, if one is free (never waits)."""
        return self._semaphore.acquire(blocking=False)

    def give(self) -> None:
        self._semaphore.release()
