"""One AG-UI run as a pure state machine: fed what the kernel says, it answers what to do.

The decisions of a run, and the contract's order rules below, live here; the pure helpers it
asks live beside it, each returning values or raising: ``identity`` (ids, the session event),
``answers`` (a Resume's answers on their way), ``resume_replies`` (what the kernel's replies to
a Resume's checks mean), ``interrupts`` (pending interrupts), ``pipeline_state`` (the kernel's
pipeline journal as events), ``endings`` (the error a run ends with). Its legal moves are data
(``transitions``); the values it exchanges with the driver are in ``effects``, and the loop
that feeds the driver's replies back is ``loop``.

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
needs to go on is data carried on it (``IdsWrite``, ``InterruptsToCommit``); what the
machine remembers besides is data too (ids, answers still to send, inputs seen, the
session event as announced), never a flag standing for a state.

The order rules of the contract live here, and only here:

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
(``RunTranslator.reconcile``); a kernel that no longer has the task ends it ``EXECUTION_LOST``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.i18n import translate
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run import endings, identity, outbound, pipeline_state, resume, resume_replies
from agui_adapter.run import interrupts as intr
from agui_adapter.run.answers import AnswerQueue
from agui_adapter.run.effects import (
    CancelTask,
    CancelWhenKnown,
    Effect,
    Emit,
    FetchPipelineState,
    Finish,
    Follow,
    GetTask,
    KernelRejected,
    Mode,
    Outcome,
    Persist,
    Persisted,
    ReleaseThread,
    Reply,
    RestoreSession,
    SendMessage,
    SendStreaming,
    StopStream,
    StopTask,
)
from agui_adapter.run.identity import Lost, run_tag
from agui_adapter.run.pipeline_progress import PipelineProgress
from agui_adapter.run.resume_replies import reason
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
    InterruptsToCommit,
    Move,
    Phase,
)
from agui_adapter.run.translation import FAILURE_STATES, SESSION_EVENT, FrameInfo, RunTranslator, inspect_frame
from agui_adapter.state.record import (
    AcceptAnswer,
    CommitInterrupts,
    Mutation,
    PendingInterrupt,
    RecordIds,
    RetireExecution,
    ThreadRecord,
)

log = logging.getLogger("agui_adapter.run")

__all__ = ["IllegalMove", "Phase", "RunMachine", "run_tag"]

# The phases the frame path compares with, as plain names: it runs once per kernel frame,
# and looking an enum member up on its class is slow on Python 3.11.
_STREAMING, _RECONCILING, _ANSWERING, _GUIDING = Phase.STREAMING, Phase.RECONCILING, Phase.ANSWERING, Phase.GUIDING
_ENDED = Phase.ENDED
#: A frame that leads to these waits for their write, then is taken again.
_RETAKE = frozenset({Phase.RECORDING_IDS, Phase.ACCEPTING_ANSWER})
_FAILURES = (AguiError, Failure, Lost)


class RunMachine:
    """The decisions of one run; see the module docstring.

    The *core* (the public inputs, ``_make``, ``_emit``, ``_fail``, ``_take_frames``) is the only
    code that sets ``phase`` and emits effects. Every other method returns its decision: a
    ``Move`` (effects, then the next phase), a list of effects, or a value; or raises
    (``AguiError``, ``Failure``, ``identity.Lost``), which the core turns into the run's end.
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
        self.run_input = run_input
        self.mode = mode
        self.record = record  # a copy kept in step with every mutation the run makes
        self.language = language
        self.parts = parts or []
        self.interrupt_ttl = interrupt_ttl_seconds
        self.stale_task_id = stale_task_id  # a task of an earlier execution that may still run
        self.phase = Phase.READY
        self._carried: Carried = None  # what the phase carries (``transitions``)
        self._input = Input.START  # the input being taken, for ``IllegalMove``
        self.outcome: Outcome | None = None
        execution = record.execution
        self.execution_id = execution.execution_id
        self.task_id = execution.task_id
        self._written_task = execution.task_id  # the task id on disk
        self.session_id = record.session_id
        resuming = mode is Mode.RESUME
        self.translator = RunTranslator(
            run_input.thread_id,
            run_input.run_id,
            id_namespace=run_tag(run_input.run_id) if resuming else None,
            prior_text_digests=execution.text_digests if resuming else (),
            pipeline=PipelineProgress.from_json(execution.pipeline) if resuming else None,
        )
        self.answers = AnswerQueue()
        self.last_state: str | None = None  # the kernel task's last state
        self.bad_state: str | None = None  # "canceled" if the kernel said so, else its first failure state
        self.announced: dict[str, Any] | None = None  # the session event's value, as emitted
        self._backlog: list[Any] = []  # frames not yet taken, while a write is awaited
        self._effects: list[Effect] = []
        self._ts = 0
        self._now = 0.0
        # adoption: a run another process began and died in (``adoption``); its journal's events
        self.adopted = adopted_events is not None
        if adopted_events is not None:
            self.translator.restore(adopted_events)
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
            self._emit([ev.run_started(self._ts, run_input.thread_id, run_input.run_id, run_input.parent_run_id)])
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
            self._decide(self._on_stream_end)
        return self._take()

    def kernel_rejected(self, error: KernelRejected, now: float) -> list[Effect]:
        """The kernel refused the call that opened the stream (JSON-RPC error)."""
        if self._enter(Input.KERNEL_REJECTED, now):
            if self.adopted and error.rpc_code == -32001:  # the kernel no longer has the task
                self._fail(Lost(msg.RUN_PROCESS_GONE))
            else:
                self._fail(self._rejection(error))
        return self._take()

    def kernel_unavailable(self, detail: str, now: float) -> list[Effect]:
        """The kernel could not be reached, or the stream broke."""
        if self._enter(Input.KERNEL_UNAVAILABLE, now):
            log.warning("run %s: kernel unavailable: %s", self.run_input.run_id, detail)
            retire = self.mode is not Mode.GUIDANCE and not self.record.execution.waiting
            effects = self._cancel_and_retire() if retire else []
            self._fail(Failure(AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE), effects))
        return self._take()

    def client_gone(self, now: float) -> list[Effect]:
        """The client went away (or the server closed the response) before the run ended.
        Its closing events (spans closed, ``RUN_ERROR CANCELLED``) reach nobody now; they
        are for the run's journal, which a client reattaching later replays to the end."""
        if self._enter(Input.CLIENT_GONE, now):
            self._make(self._unattended("client went away", msg.CLIENT_GONE))
        return self._take()

    def abandoned(self, now: float) -> list[Effect]:
        """A detached run nobody reattached to within the disconnect grace period: it ends
        as if the client had just gone away (``journal``, ``--disconnect-grace-seconds``)."""
        if self._enter(Input.ABANDONED, now):
            self._make(self._unattended("nobody reattached in the grace period", msg.NOBODY_REATTACHED))
        return self._take()

    def shutting_down(self, now: float) -> list[Effect]:
        """The adapter is stopping and the run did not end in its grace period: its kernel
        work stops as on a disconnect, and the client gets a final ``RUN_ERROR CANCELLED``."""
        if self._enter(Input.SHUTTING_DOWN, now):
            effects = self._let_go("the adapter is shutting down")
            events = self.translator.fail(self._ts, Code.CANCELLED, self._t(msg.SHUTTING_DOWN))
            self._make(Move(_ENDED, [*effects, Emit(events), Finish(Outcome.ERROR, Code.CANCELLED)]))
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
        self._ts = int(now * 1000)
        self._now = now
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

    def _decide(self, handler: Callable[..., Move], *args: Any) -> None:
        """Make the move a handler decides, or end the run with the failure it raises."""
        try:
            move = handler(*args)
        except _FAILURES as failure:
            self._fail(failure)
            return
        self._make(move)

    def _fail(self, failure: AguiError | Failure | Lost) -> None:
        """RUN_ERROR after the failure's effects, every span closed first (rule 4)."""
        if isinstance(failure, Lost):
            failure = self._lost(failure)
        elif isinstance(failure, AguiError):
            failure = Failure(failure)
        self._add(failure.effects)
        if self.phase is _ENDED:
            return
        err = failure.error
        events = self.translator.fail(self._ts, err.code, self._t(err.message, **err.params))
        retire = self.mode is not Mode.GUIDANCE and not self.record.execution.waiting
        self._make(self._end(Outcome.ERROR, events, retire=retire, code=err.code))

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

    # ================================================================== plumbing (no effects)
    def _persist(self, mutation: Mutation) -> Persist:
        """A best-effort write, mirrored in the machine's copy of the record."""
        mutation.apply(self.record)
        return Persist(mutation)

    def _t(self, template: str, **params: Any) -> str:
        return translate(self.language, template, **params)

    def _metadata(self) -> dict[str, Any]:
        return outbound.turn_metadata(self.run_input.props, self.record.cwd, self.language)

    def _announcement(self) -> Event:
        """The ``iac-code.session.v1`` event, remembered as announced."""
        value = identity.session_value(
            self.run_input, self.execution_id, self.record.context_id, self.task_id, self.session_id
        )
        self.announced = value
        return ev.custom(self._ts, SESSION_EVENT, value)

    def _rejection(self, exc: KernelRejected) -> AguiError:
        answering = self.phase is _ANSWERING or self.phase is Phase.SENDING_SIDEBAND
        return endings.rejection(exc, self.run_input.run_id, answering=answering)

    # ================================================================== endings
    def _end(self, outcome: Outcome, events: list[Event], *, retire: bool, code: str | None = None) -> Move:
        """Rule 3: stop reading, record the end, release the thread, then the final events."""
        effects: list[Effect] = [StopStream()]
        if retire:
            effects.append(self._persist(RetireExecution(self.execution_id, unless_waiting=True)))
        effects += [ReleaseThread(), Emit(events), Finish(outcome, code)]
        return Move(_ENDED, effects)

    def _success(self, *, retire: bool) -> Move:
        return self._end(Outcome.SUCCESS, self.translator.finish(self._ts, {"type": "success"}), retire=retire)

    def _unattended(self, why: str, message: str) -> Move:
        effects = self._let_go(why)
        if self.phase is not Phase.READY:
            effects.append(Emit(self.translator.fail(self._ts, Code.CANCELLED, self._t(message))))
        return Move(_ENDED, [*effects, Finish(Outcome.ABANDONED)])

    def _let_go(self, why: str) -> list[Effect]:
        """Rule 5: stop reading and give the thread back at once, then cancel the kernel task
        and retire the execution, unless interrupts are pending (they stay answerable) or the
        run is guidance (the pipeline is not its own). A next run that starts before the
        retirement is written finds the task stale and stops it first; the retirement itself
        names this execution, so it never touches the next one."""
        effects: list[Effect] = [StopStream(), ReleaseThread()]
        started = self.phase is not Phase.READY
        if started and self.mode is not Mode.GUIDANCE and not self.record.execution.waiting:
            log.info("run %s: %s; cancelling the kernel task", self.run_input.run_id, why)
            effects += self._cancel_and_retire() if self.task_id else [CancelWhenKnown(self.execution_id)]
        return effects

    def _lost(self, lost: Lost) -> Failure:
        """Rule 6: the kernel lost the execution (or its session): retire it, and its
        interrupts, in one write; the error to end the run with."""
        if lost.task_id and self.task_id is None:
            self.task_id = lost.task_id  # named by the frame that showed the loss
        effects: list[Effect] = [CancelTask(self.task_id)] if self.task_id else []
        lost_session = self.session_id if lost.session else None
        effects.append(self._persist(RetireExecution(self.execution_id, lost_session=lost_session)))
        if lost.session:
            self.session_id = None
        log.warning("run %s: the kernel lost the %s", self.run_input.run_id, "session" if lost.session else "task")
        return Failure(AguiError(Code.EXECUTION_LOST, lost.template), effects)

    def _cancel_and_retire(self) -> list[Effect]:
        """Fail closed: stop the kernel work and forget what cannot be resumed."""
        effects: list[Effect] = [CancelTask(self.task_id)] if self.task_id else []
        effects.append(self._persist(RetireExecution(self.execution_id, task_id=self.task_id)))
        return effects

    def _write_failed(self, reply: Reply, what: str, template: str) -> Failure:
        """A required write failed: fail closed (rule 1)."""
        log.error("run %s: cannot %s: %s", self.run_input.run_id, what, reason(reply))
        return Failure(AguiError(Code.STATE_PERSISTENCE_FAILED, template), self._cancel_and_retire())

    # ================================================================== the first call
    def _first_call(self) -> Move:
        if self.adopted:  # follow the kernel task again: its snapshot, then its live events
            if not self.task_id:
                raise Lost(msg.RUN_PROCESS_GONE)
            return Move(_RECONCILING, [Follow(self.task_id)])
        if self.mode is Mode.RESUME:
            return self._start_resume()
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
            metadata=self._metadata(),
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
            return self._success(retire=False)
        if self.task_id != self._written_task or identity.differs(
            info, self.task_id, self.session_id, self.record.context_id
        ):
            write = self._learn_ids(info)
            if write is not None:
                return write
        answers = self.answers
        if phase is _ANSWERING and answers.current is not None:
            return self._accept(answers.current)
        ts = self._ts
        if phase is _RECONCILING and info.kind == "task":
            out += self.translator.reconcile(info.body, ts)
        if self.announced is None and self.task_id and self.session_id:
            out.append(self._announcement())
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
                fresh = answers.fresh(info.inputs, self._applied)
                answers.sideband_ids.update(sideband)
                if fresh and not answers:
                    return self._interrupt(fresh)
                answers.hold(fresh)
        return Move(_STREAMING) if phase is _RECONCILING else None

    def _applied(self, kernel_input: dict[str, Any]) -> bool:
        input_id = kernel_input.get("inputId")
        return isinstance(input_id, str) and self.record.applied_digest(self.execution_id, input_id) is not None

    def _learn_ids(self, info: FrameInfo) -> Move | None:
        """Check the frame's identity; a move to write the new ids first (rule 1), if any."""
        learned = identity.learned_ids(
            info,
            task_id=self.task_id,
            session_id=self.session_id,
            context_id=self.record.context_id,
            written_task=self._written_task,
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
            raise self._write_failed(reply, "persist the mapping", template)
        self.record = reply.record
        self._written_task = self.task_id if mutation.task_id else self._written_task
        execution = reply.record.execution
        effects: list[Effect] = []
        if mutation.task_id and execution.execution_id == self.execution_id and execution.terminal:
            effects.append(CancelTask(mutation.task_id))  # cancelled before the kernel named its task
        return Move(write.back_to, effects)

    # ================================================================== the end of a stream
    def _on_stream_end(self) -> Move:
        if self.phase is _GUIDING or self.phase is _ANSWERING:
            raise AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_NOT_ACCEPTED)
        if self.answers and self.bad_state is None:
            return self._send_next_answer()
        return self._end_of_stream()

    def _end_of_stream(self) -> Move:
        if self.answers.new_inputs and self.bad_state is None:
            return self._interrupt(self.answers.take_new_inputs())
        return self._fill_gaps(None)

    def _fill_gaps(self, interrupts: dict[str, PendingInterrupt] | None) -> Move:
        """Events the live stream skipped exist in the kernel's journal: deliver them too;
        then commit the interrupts, if the stream ended in some, or conclude."""
        if self.translator.pipeline_seen and self.task_id:
            params = pipeline_state.journal_params(self.task_id, self.translator.pipeline, snapshot=False)
            fetch = FetchPipelineState(params)
            if interrupts is None:
                return Move(Phase.FILLING_GAPS, [fetch])
            return Move(Phase.FILLING_GAPS_BEFORE_INTERRUPT, [fetch], InterruptsToCommit(interrupts))
        return self._conclude() if interrupts is None else self._commit_interrupts(interrupts)

    def _on_gaps(self, reply: Reply) -> Move:
        return self._after(self._pipeline_events(reply, snapshot=False), self._conclude)

    def _on_gaps_before_interrupt(self, reply: Reply) -> Move:
        carried = self._carried
        assert isinstance(carried, InterruptsToCommit)
        pending = dict(carried.pending)
        return self._after(self._pipeline_events(reply, snapshot=False), lambda: self._commit_interrupts(pending))

    def _after(self, events: list[Event], then: Callable[[], Move]) -> Move:
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

    def _conclude(self) -> Move:
        effects: list[Effect] = [Emit([self._announcement()])] if self.announced is None and self.task_id else []
        error = endings.stream_error(self.bad_state, self.last_state, self.translator.failure_detail)
        if error is not None:
            raise Failure(error, effects)
        move = self._success(retire=True)
        move.effects[:0] = effects
        return move

    def _pipeline_events(self, reply: Reply, *, snapshot: bool) -> list[Event]:
        return pipeline_state.events_from(reply, self.translator, self._ts, self.run_input.run_id, snapshot=snapshot)

    # ================================================================== interrupts
    def _interrupt(self, inputs: list[dict[str, Any]]) -> Move:
        """Build the interrupts; after gap filling they are committed, then announced (rule 1)."""
        pending = intr.pending_interrupts(
            inputs,
            self.run_input.run_id,
            task_id=self.task_id,
            context_id=self.record.context_id,
            expires_at=intr.rfc3339(self._now + self.interrupt_ttl),
            language=self.language,
            sideband_ids=self.answers.sideband_ids,
        )
        return self._fill_gaps(pending) if pending else self._end_of_stream()

    def _commit_interrupts(self, pending: dict[str, PendingInterrupt]) -> Move:
        mutation = CommitInterrupts(
            self.execution_id,
            self.task_id,
            pending,
            self.translator.text_digests(),
            self.translator.pipeline.to_json(),
        )
        return Move(Phase.COMMITTING_INTERRUPTS, [Persist(mutation, required=True)])

    def _on_interrupts_committed(self, reply: Reply) -> Move:
        if not isinstance(reply, Persisted):
            raise self._write_failed(reply, "persist the interrupt", msg.INTERRUPT_NOT_COMMITTED)
        self.record = reply.record
        effects: list[Effect] = [Emit([self._announcement()])] if self.announced is None else []
        interrupts = [entry.interrupt for entry in reply.record.execution.pending.values()]
        events = self.translator.finish(self._ts, {"type": "interrupt", "interrupts": interrupts})
        move = self._end(Outcome.INTERRUPT, events, retire=False)
        move.effects[:0] = effects
        return move

    # ================================================================== resume
    def _start_resume(self) -> Move:
        """Check every answer, then make sure the kernel still has the session and the task."""
        execution = self.record.execution
        try:
            answers = resume.plan(
                self.run_input.resume or [],
                {} if execution.terminal else execution.pending,
                lambda interrupt_id: self.record.applied_digest(self.execution_id, interrupt_id),
                task_id=self.task_id,
                now=self._now,
            )
        except resume.Expired as exc:
            error = AguiError(Code.EXECUTION_EXPIRED, msg.EXECUTION_EXPIRED, {"expiresAt": exc.expires_at})
            raise Failure(error, self._cancel_and_retire()) from None
        except resume.CancelExecution:
            raise Failure(AguiError(Code.CANCELLED, msg.CANCELLED_BY_RESPONSE), self._cancel_and_retire()) from None
        self.answers.pending = answers
        if not self.task_id:
            raise Lost(msg.RESUME_TASK_UNAVAILABLE)
        if self.session_id:
            return Move(Phase.RESTORING_SESSION, [RestoreSession(self.record.cwd, self.session_id, self.task_id)])
        return Move(Phase.CHECKING_TASK, [GetTask(self.task_id)])

    def _on_restored(self, reply: Reply) -> Move:
        resume_replies.check_restored(reply, self.run_input.run_id)
        return Move(Phase.CHECKING_TASK, [GetTask(self.task_id or "")])

    def _on_task(self, reply: Reply) -> Move:
        resume_replies.check_task(
            reply,
            self.run_input.run_id,
            task_id=self.task_id,
            context_id=self.record.context_id,
            session_id=self.session_id,
        )
        reopened = Emit(self.translator.reopen_steps(self._ts))
        if self.translator.pipeline_seen or self.run_input.props.run_mode == "pipeline":
            params = pipeline_state.journal_params(self.task_id, self.translator.pipeline, snapshot=True)
            return Move(Phase.RECOVERING_PIPELINE, [reopened, FetchPipelineState(params)])
        move = self._send_answers()
        move.effects.insert(0, reopened)
        return move

    def _on_snapshot(self, reply: Reply) -> Move:
        return self._after(self._pipeline_events(reply, snapshot=True), self._send_answers)

    def _send_answers(self) -> Move:
        """Sideband answers first (unary calls), then the others, one stream each."""
        sideband = self.answers.next_sideband()
        if sideband is not None:
            return Move(Phase.SENDING_SIDEBAND, [SendMessage(self._answer_message(sideband))])
        if self.answers:
            return self._send_next_answer()
        return Move(_STREAMING, [Follow(self.task_id or "")])  # only sideband answers: follow the task

    def _send_next_answer(self) -> Move:
        return Move(_ANSWERING, [SendStreaming(self._answer_message(self.answers.next()))])

    def _answer_message(self, answer: resume.Answer) -> dict[str, Any]:
        metadata = self._metadata()
        if answer.input_response:
            metadata["inputResponse"] = answer.input_response
        return outbound.user_turn(
            message_id=identity.answer_message_id(self.run_input.run_id, answer.interrupt_id),
            context_id=self.record.context_id,
            parts=[answer.part],
            metadata=metadata,
            task_id=self.task_id,
        )

    def _on_sideband_sent(self, reply: Reply) -> Move:
        refused = resume_replies.check_sideband(reply, self.run_input.run_id)
        if refused is not None:
            raise self._rejection(refused)
        assert self.answers.current is not None
        return self._accept(self.answers.current)

    def _accept(self, answer: resume.Answer) -> Move:
        """The kernel took the answer: only now does it leave the durable pending state (rule 2)."""
        mutation = AcceptAnswer(self.execution_id, answer.interrupt_id, answer.digest)
        return Move(Phase.ACCEPTING_ANSWER, [Persist(mutation, required=True)])

    def _on_answer_accepted(self, reply: Reply) -> Move:
        if not isinstance(reply, Persisted):
            raise self._write_failed(reply, "commit an accepted answer", msg.ANSWER_NOT_COMMITTED)
        self.record = reply.record
        if self.answers.accepted().sideband:
            return self._send_answers()
        return Move(_STREAMING)


#: What a reply means depends on the phase that waits for it (``transitions.WAITING``).
_REPLY_HANDLERS: dict[Phase, Callable[[RunMachine, Reply], Move]] = {
    Phase.STOPPING_STALE_TASK: RunMachine._on_stale_task_stopped,
    Phase.RESTORING_SESSION: RunMachine._on_restored,
    Phase.CHECKING_TASK: RunMachine._on_task,
    Phase.RECOVERING_PIPELINE: RunMachine._on_snapshot,
    Phase.SENDING_SIDEBAND: RunMachine._on_sideband_sent,
    Phase.RECORDING_IDS: RunMachine._on_ids_recorded,
    Phase.ACCEPTING_ANSWER: RunMachine._on_answer_accepted,
    Phase.FILLING_GAPS: RunMachine._on_gaps,
    Phase.FILLING_GAPS_BEFORE_INTERRUPT: RunMachine._on_gaps_before_interrupt,
    Phase.COMMITTING_INTERRUPTS: RunMachine._on_interrupts_committed,
}
