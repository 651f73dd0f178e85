"""How many runs make their start at once: two, the others wait their turn.

Why this module exists: a run's start (its admission, the thread record's durable write, the
journal's creation, ``RUN_STARTED``) is some 2 ms of Python and about fifty system calls, and
Python runs on one core at a time (the interpreter's lock). When 200 clients start runs at the
same moment, 200 threads make their starts at once; every system call one of them makes hands
the lock to another, and the process spends more time handing the lock over (``futex``, the
scheduler) than on the starts. Let in two at a time, the starts of such a burst take less CPU
in all and the last first delta comes sooner (``README``, "Speed", has the figures). Two, not
one: while one start is in a system call, the other runs Python.

A start holds its slot from its admission until its first chunk (``RUN_STARTED``) is handed
to the server (``RunDriver``), or until it is refused. Turns are taken in the order asked
(first come, first served), except that a start coming back from a wait goes first:

- **Waiting for the disk** (``waiting``): a start waiting for its record's sync
  (``record_log``) gives its slot to the next start meanwhile, so that the starts behind it
  append their records too and share the next sync (group commit), and it takes a slot again
  before those that have not begun.
- **Never stuck behind a stuck holder:** when no slot was given back for ``STALL_SECONDS``
  (a holder waits on the kernel to adopt a thread, say, or on a lock that the waiter holds),
  the start goes on without a slot. So a wait for a turn is never a deadlock, only a delay.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NO_SLOT", "STALL_SECONDS", "STARTS", "Slot", "StartGate", "waiting"]

#: How long a start waits for a slot while none is given back, before it goes on without one.
STALL_SECONDS = 0.1

_held = threading.local()  # ``slot``: the slot this thread holds (``waiting``)


class Slot:
    """One start's turn; ``leave`` gives it back for good (once, whoever calls it)."""

    __slots__ = ("_gate", "holding")

    def __init__(self, gate: StartGate | None) -> None:
        self._gate = gate  # None once left
        self.holding = gate is not None  # False while it waits for the disk (``waiting``)

    def leave(self) -> None:
        """Give the turn back (again: nothing)."""
        gate, self._gate = self._gate, None
        if gate is None:
            return
        if getattr(_held, "slot", None) is self:
            _held.slot = None
        if self.holding:
            self.holding = False
            gate.give_back()


#: What a start that went on without a turn holds.
NO_SLOT = Slot(None)


class StartGate:
    """At most ``slots`` starts at once; the others wait in the order they came, those back
    from a wait (``waiting``) first."""

    def __init__(self, slots: int, stall_seconds: float = STALL_SECONDS) -> None:
        if slots < 1:
            raise ValueError("a start gate has one slot at least")
        self.slots = slots
        self._stall = stall_seconds
        self._lock = threading.Lock()
        self._free = slots
        self._given_back = 0  # how many turns were given back: moving, or stuck?
        self._back: deque[threading.Lock] = deque()  # starts back from a wait
        self._new: deque[threading.Lock] = deque()  # starts that have not begun

    def enter(self) -> Slot:
        """Wait for a turn; ``NO_SLOT`` when the holders are stuck (none gave one back for
        ``stall_seconds``)."""
        if not self.take():
            return NO_SLOT
        slot = Slot(self)
        _held.slot = slot
        return slot

    def take(self, *, returning: bool = False) -> bool:
        """Wait for a turn; False when the holders are stuck (the caller goes on without)."""
        queue = self._back if returning else self._new
        with self._lock:
            if self._free:
                self._free -= 1
                return True
            waiter = threading.Lock()
            waiter.acquire()
            queue.append(waiter)
        while True:
            seen = self._given_back
            if waiter.acquire(timeout=self._stall):
                return True  # handed over by ``give_back``
            with self._lock:
                if waiter.acquire(blocking=False):
                    return True  # handed over as the wait ran out
                if self._given_back == seen:  # nothing moves: go on without a turn
                    queue.remove(waiter)
                    return False

    def give_back(self) -> None:
        with self._lock:
            self._given_back += 1
            queue = self._back or self._new
            if queue:
                queue.popleft().release()  # the turn goes to that start directly
            else:
                self._free += 1

    def taken(self) -> int:
        """How many turns are taken now."""
        with self._lock:
            return self.slots - self._free


@contextmanager
def waiting() -> Iterator[None]:
    """Around a wait for something slow (the disk): the calling thread's turn, if it holds one,
    goes to the next start meanwhile, and it takes one again after, before the starts that have
    not begun."""
    slot = getattr(_held, "slot", None)
    gate = None if slot is None else slot._gate
    if gate is None or not slot.holding:
        yield
        return
    slot.holding = False
    gate.give_back()
    try:
        yield
    finally:
        got = gate.take(returning=True)
        if slot._gate is None:  # left meanwhile (another thread closed the run)
            if got:
                gate.give_back()
        else:
            slot.holding = got


#: The process's gate for runs' starts (``web.app`` enters it, ``run.driver`` leaves it).
STARTS = StartGate(2)
