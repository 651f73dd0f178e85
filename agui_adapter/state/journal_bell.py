"""A run journal's bell: its writer rings it, its followers in the same process wake.

Why: a reader of a run's journal (``journal.follow``, the events route and a reattaching
``POST /``) cannot count on a word from the journal's writer, which may be another process
(gunicorn ``-w 4``, or the process that adopted the run), so it looks into the files every
``journal.POLL_SECONDS``. That cost 0.25 s of CPU a second for 200 readers of silent runs, and
an event reached a reader up to a poll later than the run's own client. When the writer is in
the reader's process (the built-in server, or the same gunicorn worker), it rings the
journal's bell after each append and when it lets the journal go; a follower that finds a
bell for its journal waits for it (or for its heartbeat, or its client's hang-up) instead of
polling, and reads at once. A follower that finds none polls, as before.

The other way, a reader here that leaves rings the writer (``reader_left``): a run whose own
client left and that goes on for its readers (``run.detached``) looks at once whether any is
left, instead of at its next tick.

The bells are this process's only: a dictionary from the journal's directory to its bell,
put there by the writer holding the journal (``hang``) and taken away when it lets go
(``take_down``, which rings once more so that its followers look again: an end, or a writer
that is gone). A follower listens with an ``Event`` of its own, which it clears before each
read: a ring between its read and its wait is not lost.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

_bells: dict[str, Bell] = {}


class Bell:
    """Rung by a journal's writer after each append; wakes the followers listening."""

    __slots__ = ("_listeners", "_writer", "readers_left")

    def __init__(self) -> None:
        self._listeners: set[threading.Event] = set()
        self._writer: weakref.WeakMethod[Callable[[], None]] | None = None
        #: A reader here left since the writer last looked (``JournalWriter.readers_left``).
        self.readers_left = False

    def ring(self) -> None:
        if self._listeners:  # the usual case: nobody follows but the run's own client
            for listener in tuple(self._listeners):  # a copy: followers come and go meanwhile
                listener.set()

    def listen(self, wake: threading.Event) -> None:
        self._listeners.add(wake)

    def leave(self, wake: threading.Event) -> None:
        self._listeners.discard(wake)

    def hear_readers(self, wake: Callable[[], None]) -> None:
        """Have the writer's run woken when a reader here leaves (held weakly: a bound method
        of the run, which holds the writer that holds this bell)."""
        self._writer = weakref.WeakMethod(wake)  # type: ignore[arg-type]

    def reader_left(self) -> None:
        self.readers_left = True
        wake = None if self._writer is None else self._writer()
        if wake is not None:
            wake()


def hang(directory: str) -> Bell:
    """The bell of the journal at ``directory``, which this process's writer now holds."""
    bell = _bells[directory] = Bell()
    return bell


def take_down(directory: str, bell: Bell) -> None:
    """The writer let the journal go: its followers look again (an end, or no writer here)."""
    if _bells.get(directory) is bell:
        del _bells[directory]
    bell.ring()


def of(directory: str) -> Bell | None:
    """The journal's bell when its writer is in this process, else None (poll the files)."""
    return _bells.get(directory)
