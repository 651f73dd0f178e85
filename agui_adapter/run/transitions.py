"""The run machine's legal moves, as data: its phases, its inputs, and two tables.

``RunMachine`` (``run.machine``) consults these tables at the one place that takes an input
(``TAKES``: which inputs a phase accepts) and at the one place that sets its phase
(``MOVES``: which phases may follow a phase). A move or an input the tables do not list
raises ``IllegalMove`` naming the phase and the input: a driver that feeds the machine out
of turn, or a decision that would break the contract's order, fails loudly instead of
going on in a state nobody wrote down. The same shape as h11's ``_state.py``.

What a phase needs to know to go on ("where to go after this write", "the interrupts to
commit after the gaps are filled", "the phase the run ended in") is data carried on the move
(``IdsWrite``, ``InterruptsToCommit``, ``Ended``), set together with the phase and replaced by
the next move, never a flag kept beside it. A decision is a ``Move`` (its effects, then its
phase) or a raised ``Failure`` (the effects before the end, and the error).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agui_adapter.protocol.errors import AguiError
from agui_adapter.protocol.events import Event
from agui_adapter.run.effects import Effect, Emit
from agui_adapter.state.record import PendingInterrupt, RecordIds


class Phase(enum.Enum):
    READY = "ready"  # admitted; nothing sent to the kernel yet
    STOPPING_STALE_TASK = "stopping-stale-task"  # a new turn waits for a dead run's task to stop
    RESTORING_SESSION = "restoring-session"  # resume: waiting for the kernel to restore the session
    CHECKING_TASK = "checking-task"  # resume: waiting for GetTask
    RECOVERING_PIPELINE = "recovering-pipeline"  # resume: waiting for the pipeline snapshot
    SENDING_SIDEBAND = "sending-sideband"  # resume: waiting for a unary answer's return
    STREAMING = "streaming"  # reading a kernel stream
    RECONCILING = "reconciling"  # adopted: reading a followed task, its snapshot (first frame) not taken yet
    ANSWERING = "answering"  # reading an answer's stream; the kernel has not taken the answer yet
    GUIDING = "guiding"  # guidance: waiting for the kernel to take the message
    RECORDING_IDS = "recording-ids"  # waiting for the task/session ids to be on disk (carries IdsWrite)
    ACCEPTING_ANSWER = "accepting-answer"  # waiting for an accepted answer to be on disk
    FILLING_GAPS = "filling-gaps"  # waiting for the journal events the live stream skipped; then the end
    FILLING_GAPS_BEFORE_INTERRUPT = "filling-gaps-before-interrupt"  # the same, then the interrupts (carried)
    COMMITTING_INTERRUPTS = "committing-interrupts"  # waiting for the interrupts to be on disk
    ENDED = "ended"


class Input(enum.Enum):
    """What the machine is fed (one public method each)."""

    START = "start"
    FRAMES = "frames"
    STREAM_ENDED = "stream_ended"
    KERNEL_REJECTED = "kernel_rejected"
    KERNEL_UNAVAILABLE = "kernel_unavailable"
    CLIENT_GONE = "client_gone"
    ABANDONED = "abandoned"
    SHUTTING_DOWN = "shutting_down"
    REPLIED = "replied"


class IllegalMove(RuntimeError):
    """An input a phase does not take, or a move the table does not list."""

    def __init__(self, phase: Phase, input: Input, to: Phase | None = None) -> None:
        self.phase, self.input, self.to = phase, input, to
        if to is None:
            text = f"phase {phase.value} does not take the input {input.value}"
        else:
            text = f"phase {phase.value} cannot move to {to.value} on the input {input.value}"
        super().__init__(text)


P = Phase
#: Phases that read a kernel stream and take its frames.
READING = frozenset({P.STREAMING, P.RECONCILING, P.ANSWERING, P.GUIDING})
#: Phases that wait for the reply to the request that ended the last batch of effects.
WAITING = frozenset(
    {
        P.STOPPING_STALE_TASK,
        P.RESTORING_SESSION,
        P.CHECKING_TASK,
        P.RECOVERING_PIPELINE,
        P.SENDING_SIDEBAND,
        P.RECORDING_IDS,
        P.ACCEPTING_ANSWER,
        P.FILLING_GAPS,
        P.FILLING_GAPS_BEFORE_INTERRUPT,
        P.COMMITTING_INTERRUPTS,
    }
)
_EVERYWHERE = frozenset(P)
_STREAM_INPUTS = (Input.FRAMES, Input.STREAM_ENDED, Input.KERNEL_REJECTED, Input.KERNEL_UNAVAILABLE)

#: Which inputs each phase takes. An ended run takes every input but ``start`` and ``replied``
#: and ignores it (a stream's last frames, a client leaving after the end); a run ends from any
#: phase when its client goes, nobody reattaches, or the adapter stops.
TAKES: Mapping[Input, frozenset[Phase]] = {
    Input.START: frozenset({P.READY}),
    **{kind: READING | {P.ENDED} for kind in _STREAM_INPUTS},
    Input.CLIENT_GONE: _EVERYWHERE,
    Input.ABANDONED: _EVERYWHERE,
    Input.SHUTTING_DOWN: _EVERYWHERE,
    Input.REPLIED: WAITING,
}

#: The phases that may follow each phase. Every phase but ENDED may end (a failure, the
#: client gone, the adapter stopping); ENDED is final.
_ANSWERS = {P.SENDING_SIDEBAND, P.ANSWERING}  # a Resume has one answer at least: sideband ones first
_STREAM_END = {P.FILLING_GAPS, P.FILLING_GAPS_BEFORE_INTERRUPT, P.COMMITTING_INTERRUPTS}
MOVES: Mapping[Phase, frozenset[Phase]] = {
    phase: frozenset(nexts | ({P.ENDED} if phase is not P.ENDED else set()))
    for phase, nexts in {
        P.READY: {P.STOPPING_STALE_TASK, P.STREAMING, P.GUIDING, P.RESTORING_SESSION, P.CHECKING_TASK, P.RECONCILING},
        P.STOPPING_STALE_TASK: {P.STREAMING},
        P.RESTORING_SESSION: {P.CHECKING_TASK},
        P.CHECKING_TASK: {P.RECOVERING_PIPELINE, *_ANSWERS},
        P.RECOVERING_PIPELINE: _ANSWERS,
        P.SENDING_SIDEBAND: {P.ACCEPTING_ANSWER},
        P.ACCEPTING_ANSWER: {*_ANSWERS, P.STREAMING},  # the next answer; or read on (only sideband ones: follow)
        P.STREAMING: {P.RECORDING_IDS, P.ANSWERING, *_STREAM_END},
        P.RECONCILING: {P.STREAMING, P.RECORDING_IDS, *_STREAM_END},
        P.ANSWERING: {P.RECORDING_IDS, P.ACCEPTING_ANSWER},
        P.GUIDING: set(),
        P.RECORDING_IDS: {P.STREAMING, P.RECONCILING, P.ANSWERING},  # back to the reading phase carried
        P.FILLING_GAPS: set(),
        P.FILLING_GAPS_BEFORE_INTERRUPT: {P.COMMITTING_INTERRUPTS},
        P.COMMITTING_INTERRUPTS: set(),
        P.ENDED: set(),
    }.items()
}


# ====================================================================== what a move carries
@dataclass(frozen=True, slots=True)
class IdsWrite:
    """RECORDING_IDS: the ids being written, and the reading phase to go back to."""

    mutation: RecordIds
    back_to: Phase


@dataclass(frozen=True, slots=True)
class InterruptsToCommit:
    """FILLING_GAPS_BEFORE_INTERRUPT: the interrupts to commit once the gaps are filled."""

    pending: Mapping[str, PendingInterrupt]


@dataclass(frozen=True, slots=True)
class Ended:
    """ENDED: the phase the run ended in, and what that phase carried."""

    phase: Phase
    carried: IdsWrite | InterruptsToCommit | None


Carried = IdsWrite | InterruptsToCommit | Ended | None


@dataclass(slots=True)
class Move:
    """A decision: the effects to emit, in order, then the phase to move to (and what it
    carries). Decided by the machine's handlers, made by its core (``RunMachine._make``)."""

    to: Phase
    effects: list[Effect] = field(default_factory=list)
    carried: Carried = None


class Failure(Exception):
    """A handler's decision that the run fails with ``error``, after ``effects`` (e.g. a
    cancelled task and a retired execution); the core ends the run (``RunMachine._fail``)."""

    def __init__(self, error: AguiError, effects: list[Effect] | None = None) -> None:
        super().__init__(error.code)
        self.error = error
        self.effects = effects or []


def after(events: list[Event], then: Callable[[], Move]) -> Move:
    """The events first, then the move ``then`` decides (or the failure it raises, after them)."""
    try:
        move = then()
    except AguiError as err:
        raise Failure(err, [Emit(events)]) from None
    except Failure as failure:
        failure.effects.insert(0, Emit(events))
        raise
    move.effects.insert(0, Emit(events))
    return move
