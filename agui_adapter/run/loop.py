"""The one loop that carries the run machine's effects out and feeds the replies back.

``run.driver`` (production) and the unit tests' bench (``tests/unit/test_run_machine.py``)
both carry a batch of effects out with ``carry_out``, so the protocol the tests check is the
one production runs: effects in order; a request's reply (``effects.Reply``) goes back to the
machine at once (``RunMachine.replied``), and what the machine answers is carried out in
turn, until no effect is left. How an effect is performed is the caller's (``perform``), and
so is what becomes of the events (``emit``); the loop does no I/O.

The loop yields each effect that may take a while (a disk write, a kernel call, a kernel
stream to open) just before performing it, so that the caller can first write the events
already decided (the driver writes RUN_STARTED before a Resume's checks, and a run's last
deltas before the write that records its end). A stream opens on the pump's thread, and
starting that thread hands it the GIL while it makes the call: what is decided goes first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from agui_adapter.protocol.events import Event
from agui_adapter.run.effects import (
    Effect,
    Emit,
    FetchPipelineState,
    Follow,
    GetTask,
    Persist,
    Reply,
    RestoreSession,
    SendMessage,
    SendStreaming,
    StopTask,
)


class Replied(Protocol):
    """What the loop needs of the machine (``RunMachine.replied``)."""

    def replied(self, reply: Reply, now: float) -> list[Effect]: ...


def carry_out(
    machine: Replied,
    effects: list[Effect],
    perform: Callable[[Effect], Reply | None],
    emit: Callable[[list[Event]], object],
    now: Callable[[], float],
) -> Iterator[Effect]:
    """Carry ``effects`` out in order: events to ``emit``, every other effect to ``perform``;
    a reply goes back to the machine and its answer is carried out in turn. Yields each
    effect that may take a while just before performing it (see the module docstring)."""
    while effects:
        reply: Reply | None = None
        for effect in effects:
            match effect:
                case Emit(events=events):
                    emit(events)
                    continue
                case (
                    Persist()
                    | SendStreaming()
                    | Follow()
                    | StopTask()
                    | RestoreSession()
                    | GetTask()
                    | FetchPipelineState()
                    | SendMessage()
                ):
                    yield effect  # what is decided goes out before a disk write or a kernel call
            reply = perform(effect)
        effects = machine.replied(reply, now()) if reply is not None else []
