"""Where a run stands towards its client: the driver's attach lifecycle, as one state.

A run's machine (``machine``) knows where the *run* is (starting, streaming, ended); this
module knows where its *driver* is towards the world around it, which the machine never
sees: whether the server has asked for the first chunk, whether its own client still reads
it or it goes on without one (detached, or adopted from a dead process), whether it was
told to stop (shutdown, hand-over, nobody back within the grace period), and whether it was
left to the kernel or wound up. Three threads move it (the WSGI worker, the detached or
adopted run's own thread, the shutdown), so every move goes through ``Lifecycle.move``,
under one lock, checked against ``MOVES``; an illegal move raises ``IllegalMove`` naming
both states. ``move_if`` is the same move when the state is one of those given, else
nothing: a request that came too late (a shutdown after the run ended) is no error.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Collection


class Attach(enum.Enum):
    """The driver's states (``MOVES`` says which follow which)."""

    NEW = "new"  # admitted; the server has not asked for the first chunk yet
    ATTACHED = "attached"  # its own client reads the stream
    DETACHED = "detached"  # goes on without its own client, on a thread of its own (adopted runs start here)
    ABANDONED = "abandoned"  # detached, and nobody attached for the grace period: it ends (``abandoned``)
    SHUTTING_DOWN = "shutting down"  # the process stops: it ends now with its final event
    HANDING_OVER = "handing over"  # the process stops with ``--on-shutdown handover``: it is left to the kernel
    HANDED_OVER = "handed over"  # its stream stopped, its thread and journal given back; the kernel task goes on
    ENDED = "ended"  # wound up: pump stopped, journal ended, slot given back, summed up


#: The legal moves. ``ENDED`` is reached from anywhere (the body is closed, or the detached
#: run's thread ends), and nothing follows it. An adopted run starts ``DETACHED``.
MOVES: dict[Attach, frozenset[Attach]] = {
    Attach.NEW: frozenset({Attach.ATTACHED, Attach.SHUTTING_DOWN, Attach.HANDING_OVER, Attach.ENDED}),
    Attach.ATTACHED: frozenset({Attach.DETACHED, Attach.SHUTTING_DOWN, Attach.HANDING_OVER, Attach.ENDED}),
    Attach.DETACHED: frozenset({Attach.ABANDONED, Attach.SHUTTING_DOWN, Attach.HANDING_OVER, Attach.ENDED}),
    Attach.ABANDONED: frozenset({Attach.SHUTTING_DOWN, Attach.HANDING_OVER, Attach.ENDED}),
    Attach.SHUTTING_DOWN: frozenset({Attach.ENDED}),
    Attach.HANDING_OVER: frozenset({Attach.HANDED_OVER, Attach.ENDED}),
    Attach.HANDED_OVER: frozenset({Attach.ENDED}),
    Attach.ENDED: frozenset(),
}

#: The states in which the run is told to stop: its stream ends at its next wake-up.
STOPPING = frozenset({Attach.ABANDONED, Attach.SHUTTING_DOWN, Attach.HANDING_OVER})
#: The states that a shutdown may still move (a run stopping already, or over, is left alone).
RUNNING = frozenset({Attach.NEW, Attach.ATTACHED, Attach.DETACHED, Attach.ABANDONED})


class IllegalMove(RuntimeError):
    """A move ``MOVES`` does not allow (a bug in the driver, never a client's doing)."""

    def __init__(self, state: Attach, to: Attach) -> None:
        super().__init__(f"the run's driver cannot go from {state.value!r} to {to.value!r}")
        self.state = state
        self.to = to


class Lifecycle:
    """The driver's one state, and the one place that moves it."""

    __slots__ = ("_lock", "_state")

    def __init__(self, state: Attach = Attach.NEW) -> None:
        self._state = state
        self._lock = threading.Lock()

    @property
    def state(self) -> Attach:
        return self._state

    def move(self, to: Attach) -> Attach:
        """Go to ``to``; the state it left. Raises ``IllegalMove`` if ``MOVES`` forbids it."""
        with self._lock:
            return self._move(to)

    def move_if(self, states: Collection[Attach], to: Attach) -> bool:
        """Go to ``to`` if the state is one of ``states`` (checked and moved at once)."""
        with self._lock:
            if self._state not in states:
                return False
            self._move(to)
            return True

    def _move(self, to: Attach) -> Attach:
        state = self._state
        if to not in MOVES[state]:
            raise IllegalMove(state, to)
        self._state = to
        return state
