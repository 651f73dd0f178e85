"""One AG-UI run as a pure state machine: fed what the kernel says, it answers what to do.

This module is the machine's core: its inputs, its phase and the effects it emits, and the
reading of kernel frames. Its decisions elsewhere take the run's knowledge
(``context.RunContext``, which the machine is) and return the move to make: ``stream_end``
(the next answer, the interrupts, or the verdict), ``resume_steps`` (a Resume's checks and
answers). The pure helpers they ask return values or raise: ``identity`` (ids, the session
event), ``answers`` (a Resume's answers on their way), ``resume_replies`` (what the kernel's
replies to a Resume's checks mean), ``interrupts`` (pending interrupts), ``pipeline_state``
(the kernel's pipeline journal as events), ``endings`` (the error a run ends with). Its legal
moves are data (``transitions``); the values it exchanges with the driver are in ``effects``,
and the loop that carries them out and feeds the replies back is ``loop``.

Theory of operation
-------------------
A ``RunMachine`` is made for one admitted run. It is fed inputs (``start``, kernel
``frames``, ``stream_ended``, ``kernel_rejected``, ``kernel_unavailable``,
``client_gone``, ``shutting_down``, and ``replied`` for the effects that wait for an answer), each with
the current time, and returns *effects* (``effects``): events to emit, store
mutations to apply, kernel calls to make, the thread to release, and the run's end.
It does no I/O and reads no clock; ``run.driver`` carries the effects out in order
(``run.loop``). Its progress is one ``Phase``, set at one place (``_make``) and checked
against the tables of ``transitions``: an input the phase does not take, or a move the
table does not list, raises ``IllegalMove`` naming the phase and the input. What a phase
needs to go on is data carried on it (``IdsWrite``, ``InterruptsToCommit``, and ``Ended``:
the phase a run ended in); what the machine remembers besides is data too (ids, answers
still to send, inputs seen, the session event as announced), never a flag standing for a
state.

The order rules of the contract live in the machine and its decisions, and only there:

1. **Persist before announcing.** Nothing the client could act on is emitted before
   it is on disk: the task and session ids before the ``iac-code.session.v1`` event
   (``RECORDING_IDS``), pending interrupts before ``RUN_FINISHED(interrupt)``
   (``COMMITTING_INTERRUPTS``), an accepted answer before its tool result
   (``ACCEPTING_ANSWER``). A required write that fails ends the run with
   ``STATE_PERSISTENCE_FAILED`` and the kernel task cancelled (fail closed).
2. **An answer leaves the pending state only once the kernel took it**: the first
   frame of its stream (or the unary call's return for a sideband answer).
3. **Release the thread before the final event**: every ending is
   ``StopStream``, the best-effort end-of-execution write, ``ReleaseThread``, then the
   ``Emit`` of the final events, then ``Finish``; a client reacting to
   ``RUN_FINISHED`` at once is never told THREAD_BUSY.
4. **Every span is closed before the terminal event** (``RunTranslator.finish`` and
   ``fail`` close them), so a ``RUN_ERROR`` never leaves a START without its END.
5. **Cancel on disconnect**: a client that goes away during a live run gives its
   thread back at once, then gets its kernel task cancelled and the execution
   retired, unless interrupts are pending (they stay answerable); if the task id is
   not known yet, it is cancelled as soon as the reader learns it. Guidance never
   cancels: the pipeline belongs to its run.
6. **No dead ends**: when the kernel no longer has the task or the session the thread
   is bound to (it restarted, or lost them), the run ends with ``EXECUTION_LOST`` and,
   in the same write, the execution and its pending interrupts are retired and a lost
   session forgotten, so the next run on the thread starts cleanly. A task left running
   by a run whose adapter died (``stale_task_id``) is stopped before a new turn starts.

An *adopted* run (``adopted_events``: a run another process began and died in, ``adoption``)
starts from its journal's events instead of RUN_STARTED: the translator takes up the ids, spans
and text they hold, the machine follows the kernel task again (``Follow``), and the task's
snapshot, its first frame, gives back the text produced while nobody followed
(``reconcile.Reconciliation``); a kernel that no longer has the task ends it ``EXECUTION_LOST``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agui_adapter.kernel_client.failures import KernelRejected
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run import endings, identity, outbound, pipeline_state, resume_replies, resume_steps, stream_end
from agui_adapter.run import interrupts as intr
from agui_adapter.run.context import RunContext
from agui_adapter.run.effects import (
    CancelTask,
    Effect,
    Emit,
    Finish,
    Follow,
    Mode,
    Outcome,
    Persist,
    Persisted,
    Reply,
    SendStreaming,
    StopTask,
)
from agui_adapter.run.identity import Lost
from agui_adapter.run.reconcile import Reconciliation
from agui_adapter.run.task_lost import refusal_says_lost
from agui_adapter.run.transitions import (
    MOVES,
    READING,
    TAKES,
    Carried,
    Ended,
    Failure,
    IdsWrite,
    IllegalMove,
    Input,
    Move,
    Phase,
)
from agui_adapter.run.translation import FAILURE_STATES, FrameInfo, inspect_frame
from agui_adapter.state.record import RecordIds, ThreadRecord

log = logging.getLogger("agui_adapter.run")

__all__ = ["IllegalMove", "Phase", "RunMachine"]

# The phases the frame path compares with, as plain names: it runs once per kernel frame,
# and looking an enum member up on its class is slow on Python 3.11.
_STREAMING, _RECONCILING, _ANSWERING, _GUIDING = Phase.STREAMING, Phase.RECONCILING, Phase.ANSWERING, Phase.GUIDING
_ENDED = Phase.ENDED
#: A frame that leads to these waits for their write, then is taken again.
_RETAKE = frozenset({Phase.RECORDING_IDS, Phase.ACCEPTING_ANSWER})
_FAILURES = (AguiError, Failure, Lost)


class RunMachine(RunContext):
    """The decisions of one run; see the module docstring.

    The *core* (the public inputs, ``_make``, ``_emit``, ``_fail``, ``_take_frames``) is the only
    code that sets ``phase`` and emits effects. Every decision returns a ``Move`` (effects, then
    the next phase) or raises (``AguiError``, ``Failure``, ``identity.Lost``), which the core
    turns into the run's end; the decisions elsewhere (``stream_end``, ``resume_steps``) take
    the run's knowledge (``RunContext``), never the machine.
    """

    def __init__(
        self,
        run_input: RunInput,
        *,
        mode: Mode,
        record: ThreadRecord,
        language: str,
        parts: list[dict[str, Any]] | None = None,
        interrupt_ttl_seconds: float = 86400,
        stale_task_id: str | None = None,
        adopted_events: list[dict[str, Any]] | None = None,
        adopted_pipeline: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            run_input,
            mode=mode,
            record=record,
            language=language,
            parts=parts,
            interrupt_ttl_seconds=interrupt_ttl_seconds,
            stale_task_id=stale_task_id,
        )
        self.phase = Phase.READY
        self._carried: Carried = None  # what the phase carries (``transitions``)
        self._input = Input.START  # the input being taken, for ``IllegalMove``
        self.outcome: Outcome | None = None
        self._backlog: list[Any] = []  # frames not yet taken, while a write is awaited
        self._effects: list[Effect] = []
        # adoption: a run another process began and died in (``adoption``); its journal's events
        self.adopted = adopted_events is not None
        self.reconciliation: Reconciliation | None = None  # the adopted run's catching up
        if adopted_events is not None:
            self.reconciliation = Reconciliation(self.translator, adopted_events)
            if adopted_pipeline is not None:  # the sequences the dead process delivered (``pipeline.json``)
                pipeline_state.adopt_progress(self.translator, adopted_pipeline)
            self.announced = identity.announced_in(adopted_events)

    @property
    def reconciling(self) -> bool:
        """Adopted, and the kernel's first frame (the task's snapshot) not taken yet (also
        once the run ended before it came, until the thread is given back)."""
        if not self.adopted:
            return False
        phase, carried = self.phase, self._carried
        if isinstance(carried, Ended):
            phase, carried = carried.phase, carried.carried
        if isinstance(carried, IdsWrite):
            phase = carried.back_to
        return phase is Phase.READY or phase is _RECONCILING

    @property
    def ended(self) -> bool:
        return self.phase is _ENDED

    # ================================================================== inputs (core)
    def start(self, now: float) -> list[Effect]:
        """RUN_STARTED (unless adopted: it is in the journal already), then the first kernel call."""
        self._enter(Input.START, now)
        if not self.adopted:
            run_input = self.run_input
            self._emit([ev.run_started(self.ts, run_input.thread_id, run_input.run_id, run_input.parent_run_id)])
        self._decide(self._first_call)
        return self._take()

    def frames(self, frames: list[Any], now: float) -> list[Effect]:
        """Decoded JSON-RPC frames of the kernel stream being read."""
        if self._enter(Input.FRAMES, now):
            self._take_frames(frames)
        return self._take()

    def stream_ended(self, now: float) -> list[Effect]:
        """The kernel closed the stream being read."""
        if self._enter(Input.STREAM_ENDED, now):
            self._decide(stream_end.on_stream_end, self, self.phase)
        return self._take()

    def kernel_rejected(self, error: KernelRejected, now: float) -> list[Effect]:
        """The kernel refused the call that opened the stream (JSON-RPC error)."""
        if self._enter(Input.KERNEL_REJECTED, now):
            if self.adopted and refusal_says_lost(error.rpc_code):  # the kernel no longer has the task
                self._fail(Lost(msg.RUN_PROCESS_GONE))
            else:
                self._fail(self._rejection(error))
        return self._take()

    def kernel_unavailable(self, detail: str, now: float) -> list[Effect]:
        """The kernel could not be reached, or the stream broke."""
        if self._enter(Input.KERNEL_UNAVAILABLE, now):
            log.warning("run %s: kernel unavailable: %s", self.run_input.run_id, detail)
            retire = self.mode is not Mode.GUIDANCE and not self.record.execution.waiting
            effects = self.cancel_and_retire() if retire else []
            self._fail(Failure(AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE), effects))
        return self._take()

    def client_gone(self, now: float) -> list[Effect]:
        """The client went away (or the server closed the response) before the run ended.
        Its closing events (spans closed, ``RUN_ERROR CANCELLED``) reach nobody now; they
        are for the run's journal, which a client reattaching later replays to the end."""
        if self._enter(Input.CLIENT_GONE, now):
            self._make(self.unattended("client went away", msg.CLIENT_GONE, started=self._started))
        return self._take()

    def abandoned(self, now: float) -> list[Effect]:
        """A detached run nobody reattached to within the disconnect grace period: it ends
        as if the client had just gone away (``state.journal``, ``--disconnect-grace-seconds``)."""
        if self._enter(Input.ABANDONED, now):
            why = "nobody reattached in the grace period"
            self._make(self.unattended(why, msg.NOBODY_REATTACHED, started=self._started))
        return self._take()

    def shutting_down(self, now: float) -> list[Effect]:
        """The adapter is stopping and the run did not end in its grace period: its kernel
        work stops as on a disconnect, and the client gets a final ``RUN_ERROR CANCELLED``."""
        if self._enter(Input.SHUTTING_DOWN, now):
            self._make(self.shut_down(started=self._started))
        return self._take()

    def replied(self, reply: Reply, now: float) -> list[Effect]:
        """The answer to the request that ended the last batch of effects. A reading phase
        then takes the frames kept back while the write was awaited."""
        self._enter(Input.REPLIED, now)
        self._decide(_REPLY_HANDLERS[self.phase], self, reply)
        if self.phase in READING and self._backlog:
            backlog, self._backlog = self._backlog, []
            self._take_frames(backlog)
        return self._take()

    # ================================================================== the core
    def _enter(self, kind: Input, now: float) -> bool:
        """Take an input the phase takes (else ``IllegalMove``); False when the run is over."""
        phase = self.phase
        if phase not in TAKES[kind]:
            raise IllegalMove(phase, kind)
        self._input = kind
        self.ts = int(now * 1000)
        self.now = now
        return phase is not _ENDED

    def _make(self, move: Move) -> None:
        """The one place that sets the phase: the move's effects, then its phase (``MOVES``)."""
        phase = self.phase
        if move.to not in MOVES[phase]:
            raise IllegalMove(phase, self._input, move.to)
        self._add(move.effects)
        if move.to is _ENDED:
            finish = move.effects[-1]
            assert isinstance(finish, Finish)
            self.outcome, self._backlog = finish.outcome, []
            self.phase, self._carried = _ENDED, Ended(phase, self._carried)
        else:
            self.phase, self._carried = move.to, move.carried

    def _add(self, effects: list[Effect]) -> None:
        for effect in effects:
            if type(effect) is Emit:
                self._emit(effect.events)  # type: ignore[union-attr]
            else:
                self._effects.append(effect)

    def _emit(self, events: list[Event]) -> None:
        """Events for the client, in the batch's last ``Emit`` when it is the last effect."""
        if not events:
            return
        effects = self._effects
        if effects and type(effects[-1]) is Emit:
            effects[-1].events.extend(events)  # type: ignore[union-attr]
        else:
            effects.append(Emit(list(events)))

    def _decide(self, decision: Callable[..., Move], *args: Any) -> None:
        """Make the move a decision returns, or end the run with the failure it raises."""
        try:
            move = decision(*args)
        except _FAILURES as failure:
            self._fail(failure)
            return
        self._make(move)

    def _fail(self, failure: AguiError | Failure | Lost) -> None:
        """RUN_ERROR after the failure's effects, every span closed first (rule 4)."""
        if isinstance(failure, Lost):
            failure = self.lost(failure)
        elif isinstance(failure, AguiError):
            failure = Failure(failure)
        self._add(failure.effects)
        if self.phase is not _ENDED:
            self._make(self.error_end(failure.error))

    def _take_frames(self, frames: list[Any]) -> None:
        """Take frames while the phase reads; those after a move to a write wait for its reply."""
        out: list[Event] = []
        for index, frame in enumerate(frames):
            try:
                move = self._on_frame(frame, out)
            except _FAILURES as failure:
                self._emit(out)
                self._fail(failure)
                return
            if move is None:
                continue
            self._emit(out)
            out = []
            self._make(move)
            if self.phase not in READING:  # waiting for a write, or over
                if self.phase is not _ENDED:
                    self._backlog = frames[index + (0 if self.phase in _RETAKE else 1) :]
                return
        self._emit(out)

    def _take(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects

    @property
    def _started(self) -> bool:
        return self.phase is not Phase.READY

    def _rejection(self, exc: KernelRejected) -> AguiError:
        answering = self.phase is _ANSWERING or self.phase is Phase.SENDING_SIDEBAND
        return endings.rejection(exc, self.run_input.run_id, answering=answering)

    # ================================================================== the first call
    def _first_call(self) -> Move:
        if self.adopted:  # follow the kernel task again: its snapshot, then its live events
            if not self.task_id:
                raise Lost(msg.RUN_PROCESS_GONE)
            return Move(_RECONCILING, [Follow(self.task_id)])
        if self.mode is Mode.RESUME:
            return resume_steps.start(self)
        if self.mode is Mode.TURN and self.stale_task_id:
            return Move(Phase.STOPPING_STALE_TASK, [StopTask(self.stale_task_id)])
        return self._send_turn()

    def _send_turn(self) -> Move:
        """A new turn starts a task; guidance is sent into the running pipeline task."""
        guidance = self.mode is Mode.GUIDANCE
        message = outbound.user_turn(
            message_id=identity.turn_message_id(self.mode.value),
            context_id=self.record.context_id,
            parts=self.parts,
            metadata=self.metadata(),
            task_id=self.task_id if guidance else None,
        )
        return Move(_GUIDING if guidance else _STREAMING, [SendStreaming(message)])

    def _on_stale_task_stopped(self, reply: Reply) -> Move:
        resume_replies.check_stale_task_stopped(reply, self.run_input.run_id)
        return self._send_turn()

    # ================================================================== frames
    def _on_frame(self, frame: Any, out: list[Event]) -> Move | None:
        """Take one frame, its events into ``out``; the move it decides, if any (a move to a
        write takes the frame again after the write, ``_RETAKE``)."""
        info = inspect_frame(frame)
        if info.kind == "error":
            raise self._rejection(KernelRejected(info.error or {}))
        if info.kind == "unknown":
            log.warning("run %s: ignoring an unrecognised kernel frame", self.run_input.run_id)
            return None
        phase = self.phase
        if phase is _GUIDING:
            identity.check_guidance(info, task_id=self.task_id, context_id=self.record.context_id)
            return self.success(retire=False)
        if self.task_id != self.written_task or identity.differs(
            info, self.task_id, self.session_id, self.record.context_id
        ):
            write = self._learn_ids(info)
            if write is not None:
                return write
        answers = self.answers
        if phase is _ANSWERING and answers.current is not None:
            return resume_steps.accept(self, answers.current)
        ts = self.ts
        if phase is _RECONCILING and info.kind == "task" and self.reconciliation is not None:
            out += self.reconciliation.reconcile(info.body, ts)
        if self.announced is None and self.task_id and self.session_id:
            out.append(self.announcement())
        if answers.owed:
            for tool_id, content in answers.take_owed():
                self.translator.emit_tool_result(tool_id, content, ts, out)
        out += self.translator.map(info, ts)
        state = info.state
        if state:
            self.last_state = state
            if state == "canceled" or (state in FAILURE_STATES and self.bad_state is None):
                self.bad_state = state  # a cancellation outranks a failure
        if info.inputs:
            sideband = intr.sideband_ids(info.iac)
            # A candidate-scope permission is a wait of its own: the kernel keeps the task
            # WORKING while it waits for that answer, so it interrupts the run all the same.
            if state == "input-required" or any(i.get("inputId") in sideband for i in info.inputs):
                fresh = answers.fresh(info.inputs, self.applied)
                answers.sideband_ids.update(sideband)
                if fresh and not answers:
                    return stream_end.interrupt(self, fresh)
                answers.hold(fresh)
        return Move(_STREAMING) if phase is _RECONCILING else None

    def _learn_ids(self, info: FrameInfo) -> Move | None:
        """Check the frame's identity; a move to write the new ids first (rule 1), if any."""
        learned = identity.learned_ids(
            info,
            task_id=self.task_id,
            session_id=self.session_id,
            context_id=self.record.context_id,
            written_task=self.written_task,
        )
        self.task_id, self.session_id = learned.task_id, learned.session_id
        if learned.new_task is None and learned.new_session is None:
            return None
        mutation = RecordIds(self.execution_id, learned.new_task, learned.new_session)
        return Move(Phase.RECORDING_IDS, [Persist(mutation, required=True)], IdsWrite(mutation, self.phase))

    def _on_ids_recorded(self, reply: Reply) -> Move:
        write = self._carried
        assert isinstance(write, IdsWrite)
        mutation = write.mutation
        if not isinstance(reply, Persisted):
            template = msg.MAPPING_NOT_COMMITTED if mutation.task_id else msg.SESSION_MAPPING_NOT_COMMITTED
            raise self.write_failed(reply, "persist the mapping", template)
        self.record = reply.record
        self.written_task = self.task_id if mutation.task_id else self.written_task
        execution = reply.record.execution
        effects: list[Effect] = []
        if mutation.task_id and execution.execution_id == self.execution_id and execution.terminal:
            effects.append(CancelTask(mutation.task_id))  # cancelled before the kernel named its task
        return Move(write.back_to, effects)


#: What a reply means depends on the phase that waits for it (``transitions.WAITING``).
_REPLY_HANDLERS: dict[Phase, Callable[[RunMachine, Reply], Move]] = {
    Phase.STOPPING_STALE_TASK: RunMachine._on_stale_task_stopped,
    Phase.RESTORING_SESSION: resume_steps.on_restored,
    Phase.CHECKING_TASK: resume_steps.on_task,
    Phase.RECOVERING_PIPELINE: resume_steps.on_snapshot,
    Phase.SENDING_SIDEBAND: resume_steps.on_sideband_sent,
    Phase.RECORDING_IDS: RunMachine._on_ids_recorded,
    Phase.ACCEPTING_ANSWER: resume_steps.on_answer_accepted,
    Phase.FILLING_GAPS: stream_end.on_gaps,
    Phase.FILLING_GAPS_BEFORE_INTERRUPT: lambda run, reply: stream_end.on_gaps_before_interrupt(
        run, reply, run._carried
    ),
    Phase.COMMITTING_INTERRUPTS: stream_end.on_interrupts_committed,
}
