"""The C heap's free memory given back to the system once the adapter is idle.

Why this module exists: glibc keeps what a burst of runs freed in its heaps (an arena per
group of threads, up to eight per core), so an adapter that served a burst stayed at the
burst's size while it waited for the next one, and the next burst grew from there. Once no
run has been live for ``QUIET_SECONDS`` the heaps are trimmed (``malloc_trim``, glibc only;
elsewhere nothing is done). Measured with the shared bench's phases in a row (a stream of
20,000 deltas, then 50 and 200 concurrent streams), trimming every 2 s against not at all,
twice each: 2.2 MiB less RSS before the 200 streams and on their plateau; with this trimmer,
the 200-stream plateau of a full bench run was 65.4 MiB, against 67.6 MiB in the run before it.

Trimming waits for a quiet second rather than following every run's end: a client sending
runs one after the other would otherwise have its next run fault the pages back in. And the
trimmer's thread is woken only to begin an idle spell: a run's start, and a spell begun again
while it times one, are seen when its quiet second is over (a run starting after an idle spell
does not hand the interpreter's lock to a thread that has nothing to do).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agui_adapter.protocol.decode_budget import release_memory

#: How long no run must be live before the heaps are trimmed.
QUIET_SECONDS = 1.0


class HeapTrimmer:
    """Told when the process becomes idle (``idle``) or busy (``busy``); trims on a thread of
    its own once an idle spell has lasted ``quiet_seconds``."""

    def __init__(self, quiet_seconds: float = QUIET_SECONDS, trim: Callable[[], None] = release_memory) -> None:
        self.quiet_seconds = quiet_seconds
        self._trim = trim
        self._changed = threading.Condition()
        self._moves = 0  # idle spells begun and ended so far
        self._idle = False
        self._trimmed_at = -1  # ``_moves`` when the heaps were last trimmed
        self._thread: threading.Thread | None = None
        self._waiting = False  # the thread waits for an idle spell to begin (no timeout)
        self.trims = 0

    def busy(self) -> None:
        """A run started: whatever idle spell there was is over (seen by the thread when the
        spell's quiet time is over: nothing to wake it for)."""
        with self._changed:
            if self._idle:
                self._idle = False
                self._moves += 1

    def idle(self) -> None:
        """The last live run ended: trim unless a run starts within ``quiet_seconds``."""
        with self._changed:
            if self._idle:
                return
            self._idle = True
            self._moves += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="heap-trim", daemon=True)
                self._thread.start()
            if self._waiting:
                self._changed.notify()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not (self._idle and self._trimmed_at != self._moves):
                    self._waiting = True
                    self._changed.wait()
                    self._waiting = False
                moves = self._moves
                if self._changed.wait_for(lambda moves=moves: self._moves != moves, self.quiet_seconds):
                    continue  # it did not stay idle: look again
                self._trimmed_at = moves
            self._trim()
            self.trims += 1


#: The process's trimmer (the heaps are the process's): told by the live runs (``run.registry``).
HEAP = HeapTrimmer()
