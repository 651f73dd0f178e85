"""The start gate: at most its slots taken, turns in the order asked, a start back from the
disk first, a turn handed over on leaving, and no wait behind holders that do not move."""

from __future__ import annotations

import threading
import time

import pytest

from agui_adapter.ops import start_gate
from agui_adapter.ops.start_gate import NO_SLOT, Slot, StartGate
from tests.support.flow import wait_for


class Starter:
    """A thread that enters the gate and keeps its slot until told to leave."""

    def __init__(self, gate: StartGate, name: str, entered: list[str]) -> None:
        self.slot: Slot | None = None
        self.go = threading.Event()
        self.name = name

        def run() -> None:
            self.slot = gate.enter()
            entered.append(name)
            self.go.wait(30)
            self.slot.leave()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def leave(self) -> None:
        self.go.set()
        self.thread.join(30)


def queued(gate: StartGate, count: int) -> None:
    wait_for(lambda: len(gate._new) + len(gate._back) == count)


def test_no_more_starts_than_slots_and_turns_in_the_order_asked() -> None:
    gate = StartGate(2, stall_seconds=30)
    entered: list[str] = []
    first, second = Starter(gate, "a", entered), Starter(gate, "b", entered)
    wait_for(lambda: len(entered) == 2)
    later = []
    for name in "cde":  # one at a time, so that the order they asked in is known
        later.append(Starter(gate, name, entered))
        queued(gate, len(later))
    assert gate.taken() == 2 and len(entered) == 2
    first.leave()
    wait_for(lambda: len(entered) == 3)
    assert entered[2] == "c" and gate.taken() == 2  # handed over: never a third at once
    second.leave()
    wait_for(lambda: len(entered) == 4)
    assert entered[3] == "d"
    later[0].leave()
    wait_for(lambda: len(entered) == 5)
    assert entered[4] == "e"
    for starter in later[1:]:
        starter.leave()
    assert gate.taken() == 0
    assert all(starter.slot is not None and starter.slot is not NO_SLOT for starter in later)


def test_a_start_waiting_for_the_disk_lets_the_next_one_in_and_goes_first_after() -> None:
    gate = StartGate(1, stall_seconds=30)
    entered: list[str] = []
    disk = threading.Event()
    steps: list[str] = []

    def saving() -> None:
        slot = gate.enter()
        with start_gate.waiting():
            steps.append("waiting")
            disk.wait(30)
        steps.append("back" if slot.holding else "back without a turn")
        slot.leave()

    saver = threading.Thread(target=saving, daemon=True)
    saver.start()
    wait_for(lambda: steps == ["waiting"])
    nxt = Starter(gate, "next", entered)  # gets the turn the saver gave up
    wait_for(lambda: entered == ["next"])
    fresh = Starter(gate, "fresh", entered)
    queued(gate, 1)
    disk.set()  # the saver is back: it waits for a turn, ahead of "fresh"
    queued(gate, 2)
    nxt.leave()
    saver.join(30)
    assert steps == ["waiting", "back"]
    wait_for(lambda: entered == ["next", "fresh"])
    fresh.leave()
    assert gate.taken() == 0


def test_waiting_without_a_slot_is_just_the_wait() -> None:
    gate = StartGate(1)
    with start_gate.waiting():
        pass
    assert gate.taken() == 0


def test_a_start_goes_on_without_a_turn_when_no_holder_moves() -> None:
    gate = StartGate(1, stall_seconds=0.05)
    held = gate.enter()  # never given back while the other waits
    slot = gate.enter()
    assert slot is NO_SLOT and not slot.holding
    slot.leave()  # nothing to give back
    assert gate.taken() == 1 and not gate._new  # it left the queue
    held.leave()
    assert gate.taken() == 0


def test_a_slot_is_given_back_once() -> None:
    gate = StartGate(1)
    slot = gate.enter()
    slot.leave()
    slot.leave()
    assert gate.taken() == 0
    again = gate.enter()
    assert again.holding and gate.taken() == 1
    again.leave()


def test_a_run_closed_from_another_thread_while_its_start_waits_for_the_disk() -> None:
    """The slot was left meanwhile: the turn taken back after the wait is given back at once."""
    gate = StartGate(1, stall_seconds=30)
    slot = gate.enter()
    with start_gate.waiting():
        closer = threading.Thread(target=slot.leave)
        closer.start()
        closer.join(30)
    assert gate.taken() == 0 and not slot.holding


def test_a_gate_has_a_slot_at_least() -> None:
    with pytest.raises(ValueError):
        StartGate(0)


def test_a_wait_for_a_turn_is_handed_over_even_as_it_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn given back just as the waiter's timed wait ran out is its own, not lost."""
    gate = StartGate(1, stall_seconds=0.05)
    holder = gate.enter()
    real_lock = threading.Lock

    class LateLock:
        """A waiter's lock whose first timed wait runs out just as the turn is handed over."""

        def __init__(self) -> None:
            self._lock = real_lock()
            self.timed_out = False

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if blocking and timeout > 0 and not self.timed_out:
                self.timed_out = True
                holder.leave()  # handed over now, after the wait gave up
                time.sleep(0.01)
                return False
            return self._lock.acquire(blocking, timeout)

        def release(self) -> None:
            self._lock.release()

    monkeypatch.setattr(start_gate.threading, "Lock", LateLock)
    slot = gate.enter()
    monkeypatch.undo()
    assert slot.holding and gate.taken() == 1
    slot.leave()
    assert gate.taken() == 0
