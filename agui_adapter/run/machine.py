"""One AG-UI run as a pure state machine: fed what the kernel says, it answers what to do.

(Longer than the other modules on purpose: it is all the decisions of a run, and the
order rules below are only trustworthy if the code that keeps them can be read in one
place. Sections: inputs, endings, frames, the end of a stream, pipelines, interrupts,
resume; the values it exchanges with the driver are in ``run_effects``.)

Theory of operation
-------------------
A ``RunMachine`` is made for one admitted run. It is fed inputs (``start``, kernel
``frames``, ``stream_ended``, ``kernel_rejected``, ``kernel_unavailable``,
``client_gone``, ``shutting_down``, and ``replied`` for the effects that wait for an answer), each with
the current time, and returns *effects* (``run_effects``): events to emit, store
mutations to apply, kernel calls to make, the thread to release, and the run's end.
It does no I/O and reads no clock; ``run_driver`` carries the effects out in order.
Its progress is one ``Phase``; what it remembers besides is data (ids, answers still
to send, inputs seen), never a flag standing for a state.

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

import enum
import hashlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import AguiError, Code, clip_detail
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.i18n import translate
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run import interrupts as intr
from agui_adapter.run import outbound, resume
from agui_adapter.run.effects import (
    CancelTask,
    CancelWhenKnown,
    Effect,
    Emit,
    Failed,
    FetchPipelineState,
    Finish,
    Follow,
    GetTask,
    KernelAnswer,
    KernelRefused,
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
from agui_adapter.run.pipeline_progress import PipelineProgress
from agui_adapter.run.translation import (
    BUSY_STATES,
    FAILURE_STATES,
    SESSION_EVENT,
    FrameInfo,
    RunTranslator,
    inspect_frame,
)
from agui_adapter.state.record import (
    AcceptAnswer,
    CommitInterrupts,
    PendingInterrupt,
    RecordIds,
    RetireExecution,
    ThreadRecord,
)

log = logging.getLogger("agui_adapter.run")

#: Kernel task states after which a Resume has nothing to answer.
_TASK_GONE_STATES = frozenset({"canceled", "completed"}) | FAILURE_STATES
#: The last kernel states of a stream that ends a run well.
_GOOD_END_STATES = frozenset({"completed", "input-required"})


class Phase(enum.Enum):
    READY = "ready"  # admitted; nothing sent to the kernel yet
    STOPPING_STALE_TASK = "stopping-stale-task"  # a new turn waits for a dead run's task to stop
    RESTORING_SESSION = "restoring-session"  # resume: waiting for the kernel to restore the session
    CHECKING_TASK = "checking-task"  # resume: waiting for GetTask
    RECOVERING_PIPELINE = "recovering-pipeline"  # resume: waiting for the pipeline snapshot
    SENDING_SIDEBAND = "sending-sideband"  # resume: waiting for a unary answer's return
    STREAMING = "streaming"  # reading a kernel stream
    ANSWERING = "answering"  # reading an answer's stream; the kernel has not taken the answer yet
    GUIDING = "guiding"  # guidance: waiting for the kernel to take the message
    RECORDING_IDS = "recording-ids"  # waiting for the task/session ids to be on disk
    ACCEPTING_ANSWER = "accepting-answer"  # waiting for an accepted answer to be on disk
    FILLING_GAPS = "filling-gaps"  # waiting for the journal events the live stream skipped
    COMMITTING_INTERRUPTS = "committing-interrupts"  # waiting for the interrupts to be on disk
    ENDED = "ended"


# The phases that read a kernel stream, as plain names: the frame path runs once per
# kernel frame, and looking an enum member up on its class is slow on Python 3.11.
_STREAMING, _ANSWERING, _GUIDING = Phase.STREAMING, Phase.ANSWERING, Phase.GUIDING


def _reading(phase: Phase) -> bool:
    """Whether the phase reads a kernel stream and takes frames."""
    return phase is _STREAMING or phase is _ANSWERING or phase is _GUIDING


def run_tag(run_id: str) -> str:
    """A short stable tag of a run id, for ids the run mints."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:8]


class RunMachine:
    """The decisions of one run; see the module docstring."""

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
        self.answers: list[resume.Answer] = []  # answers still to send, in order
        self.answer: resume.Answer | None = None  # the answer being sent or accepted
        self.owed_results: list[tuple[str, str]] = []  # (toolCallId, text) of accepted answers
        self.new_inputs: list[dict[str, Any]] = []  # inputs seen while answers were still to send
        self.sideband_ids: set[str] = set()
        self.last_state: str | None = None  # the kernel task's last state
        self.bad_state: str | None = None  # "canceled" if the kernel said so, else its first failure state
        self.announced: dict[str, Any] | None = None  # the session event's value, once emitted
        self._reading = Phase.STREAMING  # the reading phase to go back to after the ids are written
        self._pending_ids = RecordIds(self.execution_id)  # the ids being written
        self._commit: dict[str, PendingInterrupt] | None = None  # interrupts to commit after gap filling
        self._backlog: list[Any] = []  # frames not yet taken, while a write is awaited
        self._effects: list[Effect] = []
        self._ts = 0
        # adoption: a run another process began and died in (``adoption``); its journal's events
        self.adopted = adopted_events is not None
        self._reconciling = self.adopted  # the first frame (the task's snapshot) gives back the gap
        if adopted_events is not None:
            self.translator.restore(adopted_events)
            if adopted_pipeline is not None:  # the sequences the dead process delivered (``pipeline.json``)
                noted, progress = PipelineProgress.from_json(adopted_pipeline), self.translator.pipeline
                for sequence in sorted(noted.delivered | set(range(progress.high_water + 1, noted.high_water + 1))):
                    progress.mark(sequence)
                progress.run_id = progress.run_id or noted.run_id
                self.translator.pipeline_seen = True
            for event in adopted_events:
                if event.get("type") == "CUSTOM" and event.get("name") == SESSION_EVENT:
                    value = event.get("value")
                    self.announced = value if isinstance(value, dict) else None

    @property
    def reconciling(self) -> bool:
        """Adopted, and the kernel's first frame (the task's snapshot) not taken yet."""
        return self._reconciling

    @property
    def ended(self) -> bool:
        return self.phase is Phase.ENDED

    # ================================================================== inputs
    def start(self, now: float) -> list[Effect]:
        """RUN_STARTED, then the first kernel call."""
        self._clock(now)
        run_input = self.run_input
        if self.adopted:
            return self._adopt()
        self._emit([ev.run_started(self._ts, run_input.thread_id, run_input.run_id, run_input.parent_run_id)])
        try:
            if self.mode is Mode.RESUME:
                self._start_resume(now)
            elif self.mode is Mode.TURN and self.stale_task_id:
                self._effects.append(StopTask(self.stale_task_id))
                self.phase = Phase.STOPPING_STALE_TASK
            else:
                self._send_turn()
        except AguiError as err:
            self._fail(err)
        return self._take()

    def _adopt(self) -> list[Effect]:
        """Adoption: RUN_STARTED and the first events are in the journal already; follow
        the kernel task again (``SubscribeToTask``: its snapshot, then its live events; a
        task that no longer runs: its last snapshot)."""
        if not self.task_id:
            self._fail(self._lose(msg.RUN_PROCESS_GONE))
        else:
            self.phase = Phase.STREAMING
            self._effects.append(Follow(self.task_id))
        return self._take()

    def _send_turn(self) -> None:
        """A new turn starts a task; guidance is sent into the running pipeline task."""
        message = outbound.user_turn(
            message_id=f"agui-{self.mode.value}-{uuid.uuid4().hex}",
            context_id=self.record.context_id,
            parts=self.parts,
            metadata=self._metadata(),
            task_id=self.task_id if self.mode is Mode.GUIDANCE else None,
        )
        self.phase = Phase.GUIDING if self.mode is Mode.GUIDANCE else Phase.STREAMING
        self._effects.append(SendStreaming(message))

    def frames(self, frames: list[Any], now: float) -> list[Effect]:
        """Decoded JSON-RPC frames of the kernel stream being read."""
        self._clock(now)
        if _reading(self.phase):
            self._take_frames(frames)
        return self._take()

    def stream_ended(self, now: float) -> list[Effect]:
        """The kernel closed the stream being read."""
        self._clock(now)
        if self.ended:
            return []
        try:
            if self.phase is Phase.GUIDING or self.phase is Phase.ANSWERING:
                raise AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_NOT_ACCEPTED)
            if self.answers and self.bad_state is None:
                self._send_next_answer()
            else:
                self._end_of_stream()
        except AguiError as err:
            self._fail(err)
        return self._take()

    def kernel_rejected(self, error: KernelRejected, now: float) -> list[Effect]:
        """The kernel refused the call that opened the stream (JSON-RPC error)."""
        self._clock(now)
        if self.ended:
            return []
        if self.adopted and error.rpc_code == -32001:  # the kernel no longer has the task
            self._fail(self._lose(msg.RUN_PROCESS_GONE))
            return self._take()
        self._fail(self._rejection(error))
        return self._take()

    def kernel_unavailable(self, detail: str, now: float) -> list[Effect]:
        """The kernel could not be reached, or the stream broke."""
        self._clock(now)
        if self.ended:
            return []
        log.warning("run %s: kernel unavailable: %s", self.run_input.run_id, detail)
        if self.mode is not Mode.GUIDANCE and not self.record.execution.waiting:
            self._cancel_and_retire()
        self._fail(AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE))
        return self._take()

    def client_gone(self, now: float) -> list[Effect]:
        """The client went away (or the server closed the response) before the run ended.
        Its closing events (spans closed, ``RUN_ERROR CANCELLED``) reach nobody now; they
        are for the run's journal, which a client reattaching later replays to the end."""
        return self._end_unattended(now, "client went away", msg.CLIENT_GONE)

    def abandoned(self, now: float) -> list[Effect]:
        """A detached run nobody reattached to within the disconnect grace period: it ends
        as if the client had just gone away (``journal``, ``--disconnect-grace-seconds``)."""
        return self._end_unattended(now, "nobody reattached in the grace period", msg.NOBODY_REATTACHED)

    def _end_unattended(self, now: float, why: str, message: str) -> list[Effect]:
        self._clock(now)
        if self.ended:
            return []
        started = self.phase is not Phase.READY
        self._let_go(why)
        if started:
            self._effects.append(Emit(self.translator.fail(self._ts, Code.CANCELLED, self._t(message))))
        self.phase, self.outcome = Phase.ENDED, Outcome.ABANDONED
        self._effects.append(Finish(Outcome.ABANDONED))
        return self._take()

    def shutting_down(self, now: float) -> list[Effect]:
        """The adapter is stopping and the run did not end in its grace period: its kernel
        work stops as on a disconnect, and the client gets a final ``RUN_ERROR CANCELLED``."""
        self._clock(now)
        if self.ended:
            return []
        self._let_go("the adapter is shutting down")
        events = self.translator.fail(self._ts, Code.CANCELLED, self._t(msg.SHUTTING_DOWN))
        self._effects += [Emit(events), Finish(Outcome.ERROR, Code.CANCELLED)]
        self.phase, self.outcome = Phase.ENDED, Outcome.ERROR
        return self._take()

    def _let_go(self, why: str) -> None:
        """Rule 5: stop reading and give the thread back at once, then cancel the kernel task
        and retire the execution, unless interrupts are pending (they stay answerable) or the
        run is guidance (the pipeline is not its own). A next run that starts before the
        retirement is written finds the task stale and stops it first; the retirement itself
        names this execution, so it never touches the next one."""
        self._effects += [StopStream(), ReleaseThread()]
        started = self.phase is not Phase.READY
        if started and self.mode is not Mode.GUIDANCE and not self.record.execution.waiting:
            log.info("run %s: %s; cancelling the kernel task", self.run_input.run_id, why)
            if self.task_id:
                self._cancel_and_retire()
            else:
                self._effects.append(CancelWhenKnown(self.execution_id))

    def replied(self, reply: Reply, now: float) -> list[Effect]:
        """The answer to the request that ended the last batch of effects."""
        self._clock(now)
        handler = _REPLY_HANDLERS.get(self.phase)
        if handler is None:
            raise RuntimeError(f"unexpected reply in phase {self.phase.value}")
        try:
            handler(self, reply)
        except AguiError as err:
            self._fail(err)
        return self._take()

    # ================================================================== plumbing
    def _clock(self, now: float) -> None:
        self._ts = int(now * 1000)
        self._now = now

    def _take(self) -> list[Effect]:
        effects, self._effects = self._effects, []
        return effects

    def _emit(self, events: list[Event]) -> None:
        if not events:
            return
        effects = self._effects
        if effects and type(effects[-1]) is Emit:
            effects[-1].events.extend(events)
        else:
            effects.append(Emit(list(events)))

    def _persist(self, mutation: Any) -> None:
        """A best-effort write, mirrored in the machine's copy of the record."""
        self._effects.append(Persist(mutation))
        mutation.apply(self.record)

    def _await_write(self, mutation: Any, phase: Phase) -> None:
        self._effects.append(Persist(mutation, required=True))
        self.phase = phase

    def _t(self, template: str, **params: Any) -> str:
        return translate(self.language, template, **params)

    def _metadata(self) -> dict[str, Any]:
        return outbound.turn_metadata(self.run_input.props, self.record.cwd, self.language)

    # ================================================================== endings
    def _end(self, outcome: Outcome, events: list[Event], *, retire: bool, code: str | None = None) -> None:
        """Rule 3: stop reading, record the end, release the thread, then the final events."""
        self._effects.append(StopStream())
        if retire:
            self._persist(RetireExecution(self.execution_id, unless_waiting=True))
        self._effects.append(ReleaseThread())
        self._emit(events)
        self._effects.append(Finish(outcome, code))
        self.phase, self.outcome = Phase.ENDED, outcome
        self._backlog = []

    def _fail(self, err: AguiError) -> None:
        """RUN_ERROR, after closing every span (rule 4)."""
        if self.ended:
            return
        events = self.translator.fail(self._ts, err.code, self._t(err.message, **err.params))
        retire = self.mode is not Mode.GUIDANCE and not self.record.execution.waiting
        self._end(Outcome.ERROR, events, retire=retire, code=err.code)

    def _succeed(self, *, retire: bool) -> None:
        self._end(Outcome.SUCCESS, self.translator.finish(self._ts, {"type": "success"}), retire=retire)

    def _lose(self, template: str, *, session: bool = False) -> AguiError:
        """Rule 6: the kernel lost the execution (or its session): retire it, and its
        interrupts, in one write; the error to end the run with."""
        if self.task_id:
            self._effects.append(CancelTask(self.task_id))
        lost_session = self.session_id if session else None
        self._persist(RetireExecution(self.execution_id, lost_session=lost_session))
        if session:
            self.session_id = None
        log.warning("run %s: the kernel lost the %s", self.run_input.run_id, "session" if session else "task")
        return AguiError(Code.EXECUTION_LOST, template)

    def _on_stale_task_stopped(self, reply: Reply) -> None:
        if isinstance(reply, KernelAnswer):
            state = inspect_frame({"result": reply.body}).state
            if state in BUSY_STATES:
                log.warning("run %s: an earlier task is still %s; starting anyway", self.run_input.run_id, state)
        elif isinstance(reply, Failed):
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        self._send_turn()  # KernelRefused: the kernel no longer knows the task

    def _cancel_and_retire(self) -> None:
        """Fail closed: stop the kernel work and forget what cannot be resumed."""
        if self.task_id:
            self._effects.append(CancelTask(self.task_id))
        self._persist(RetireExecution(self.execution_id, task_id=self.task_id))

    def _rejection(self, exc: KernelRejected) -> AguiError:
        """The RUN_ERROR for a JSON-RPC error: a retryable backup wait, a refused answer
        (the interrupt stays pending), or a refused request."""
        data = exc.data
        if isinstance(data, dict) and data.get("code") == Code.SESSION_BACKUP_NOT_READY:
            return AguiError(Code.SESSION_BACKUP_NOT_READY, msg.SESSION_BACKUP_NOT_READY)
        log.warning("run %s: the kernel rejected the request: %s", self.run_input.run_id, exc)
        if self.phase is Phase.ANSWERING or self.phase is Phase.SENDING_SIDEBAND:
            return AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_REJECTED)
        return AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_REJECTED, {"detail": clip_detail(exc.detail)})

    # ================================================================== frames
    def _take_frames(self, frames: list[Any]) -> None:
        for index, frame in enumerate(frames):
            try:
                done = self._on_frame(frame)
            except AguiError as err:
                self._fail(err)
                return
            if not _reading(self.phase):  # waiting for a write, or over
                if not self.ended:
                    self._backlog = frames[index + (1 if done else 0) :]
                return

    def _on_frame(self, frame: Any) -> bool:
        """Take one frame; False when it must be taken again after an awaited write."""
        info = inspect_frame(frame)
        if info.kind == "error":
            raise self._rejection(KernelRejected(info.error or {}))
        if info.kind == "unknown":
            log.warning("run %s: ignoring an unrecognised kernel frame", self.run_input.run_id)
            return True
        phase = self.phase
        if phase is _GUIDING:
            self._on_guidance_frame(info)
            return True
        if (
            (info.task_id and info.task_id != self.task_id)
            or (info.session_id and info.session_id != self.session_id)
            or (info.context_id and info.context_id != self.record.context_id)
            or self.task_id != self._written_task
        ) and self._learn_ids(info):
            return False
        if phase is _ANSWERING and self.answer is not None:
            self._accept(self.answer)
            return False
        ts = self._ts
        if self._reconciling:
            self._reconciling = False
            if info.kind == "task":
                self._emit(self.translator.reconcile(info.body, ts))
        if self.announced is None and self.task_id and self.session_id:
            self._announce()
        if self.owed_results:
            out: list[Event] = []
            for tool_id, content in self.owed_results:
                self.translator.emit_tool_result(tool_id, content, ts, out)
            self.owed_results = []
            self._emit(out)
        self._emit(self.translator.map(info, ts))
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
                waiting = {a.interrupt_id for a in self.answers}
                fresh = [i for i in info.inputs if i.get("inputId") not in waiting and not self._applied(i)]
                self.sideband_ids.update(sideband)
                if fresh and not self.answers:
                    self._interrupt(fresh)
                    return True
                self.new_inputs.extend(i for i in fresh if i not in self.new_inputs)
        return True

    def _on_guidance_frame(self, info: FrameInfo) -> None:
        """Guidance only needs the kernel to take the message; the pipeline's own run shows the rest."""
        if info.task_id and info.task_id != self.task_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.TASK_IDENTITY_CHANGED)
        if info.context_id and info.context_id != self.record.context_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.CONTEXT_IDENTITY_CHANGED)
        if info.state in FAILURE_STATES:
            raise AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED)
        if info.state == "canceled":
            raise AguiError(Code.CANCELLED, msg.CANCELLED)
        self._succeed(retire=False)

    def _applied(self, kernel_input: dict[str, Any]) -> bool:
        input_id = kernel_input.get("inputId")
        return isinstance(input_id, str) and self.record.applied_digest(self.execution_id, input_id) is not None

    def _learn_ids(self, info: FrameInfo) -> bool:
        """Check the frame's identity; True when ids must be written first (rule 1).

        The kernel's first task snapshot names the task and the next frame its session:
        the task id waits for that frame (the snapshot announces nothing), so one write
        records both, on the path to the first delta."""
        session_id = None
        if info.task_id:
            if self.task_id is None:
                self.task_id = info.task_id
            elif info.task_id != self.task_id:
                raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.TASK_IDENTITY_CHANGED)
        if info.context_id and info.context_id != self.record.context_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.CONTEXT_IDENTITY_CHANGED)
        if info.session_id:
            if self.session_id is None:
                self.session_id = session_id = info.session_id
            elif info.session_id != self.session_id:  # the kernel lost our session and made a new one
                raise self._lose(msg.SESSION_LOST, session=True)
        task_id = self.task_id if self.task_id != self._written_task else None
        if task_id is None and session_id is None:
            return False
        if session_id is None and self.session_id is None and info.kind == "task" and not info.iac:
            return False
        self._reading = self.phase
        self._pending_ids = RecordIds(self.execution_id, task_id, session_id)
        self._await_write(self._pending_ids, Phase.RECORDING_IDS)
        return True

    def _on_ids_recorded(self, reply: Reply) -> None:
        mutation = self._pending_ids
        if not isinstance(reply, Persisted):
            log.error("run %s: cannot persist the mapping: %s", self.run_input.run_id, _reason(reply))
            self._cancel_and_retire()
            template = msg.MAPPING_NOT_COMMITTED if mutation.task_id else msg.SESSION_MAPPING_NOT_COMMITTED
            raise AguiError(Code.STATE_PERSISTENCE_FAILED, template)
        self.record = reply.record
        self._written_task = self.task_id if mutation.task_id else self._written_task
        execution = reply.record.execution
        if mutation.task_id and execution.execution_id == self.execution_id and execution.terminal:
            self._effects.append(CancelTask(mutation.task_id))  # cancelled before the kernel named its task
        self.phase = self._reading
        self._continue_backlog()

    def _continue_backlog(self) -> None:
        backlog, self._backlog = self._backlog, []
        if backlog:
            self._take_frames(backlog)

    def _announce(self) -> None:
        value: dict[str, Any] = {
            "schemaVersion": 1,
            "threadId": self.run_input.thread_id,
            "aguiRunId": self.run_input.run_id,
            "executionId": self.execution_id,
            "contextId": self.record.context_id,
            "rosInvocationId": self.run_input.props.ros_invocation_id,
        }
        if self.task_id:
            value["taskId"] = self.task_id
        if self.session_id:
            value["sessionId"] = self.session_id
        self.announced = value
        self._emit([ev.custom(self._ts, SESSION_EVENT, value)])

    # ================================================================== the end of a stream
    def _end_of_stream(self) -> None:
        if self.new_inputs and self.bad_state is None:
            inputs, self.new_inputs = self.new_inputs, []
            self._interrupt(inputs)
            return
        self._commit = None
        self._fill_gaps()

    def _fill_gaps(self) -> None:
        """Events the live stream skipped exist in the kernel's journal: deliver them too."""
        if self.translator.pipeline_seen and self.task_id:
            self._effects.append(FetchPipelineState(self._journal_params(snapshot=False)))
            self.phase = Phase.FILLING_GAPS
        else:
            self._after_gaps()

    def _on_gaps(self, reply: Reply) -> None:
        self._on_pipeline_state(reply, snapshot=False)
        self._after_gaps()

    def _on_snapshot(self, reply: Reply) -> None:
        self._on_pipeline_state(reply, snapshot=True)
        self._send_answers()

    def _after_gaps(self) -> None:
        if self._commit is not None:
            self._commit_interrupts(self._commit)
        else:
            self._conclude()

    def _conclude(self) -> None:
        if self.announced is None and self.task_id:
            self._announce()
        if self.bad_state == "canceled":
            raise AguiError(Code.CANCELLED, msg.CANCELLED)
        if self.bad_state is not None or self.last_state not in _GOOD_END_STATES:
            detail = self.translator.failure_detail
            if detail:
                raise AguiError(
                    Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED_DETAIL, {"detail": clip_detail(detail)}
                )
            raise AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED)
        self._succeed(retire=True)

    # ================================================================== pipelines
    def _journal_params(self, *, snapshot: bool) -> dict[str, Any]:
        params: dict[str, Any] = {"taskId": self.task_id, "afterSequence": self.translator.pipeline.high_water}
        if not snapshot:
            params["includeSnapshot"] = "false"
        return params

    def _on_pipeline_state(self, reply: Reply, *, snapshot: bool) -> None:
        """Map what the kernel's journal holds after what the client has (absent: nothing)."""
        if isinstance(reply, Failed):
            log.warning("run %s: pipeline state unavailable: %s", self.run_input.run_id, reply.reason)
            return
        if not isinstance(reply, KernelAnswer) or reply.status != 200 or not isinstance(reply.body, dict):
            if isinstance(reply, KernelAnswer) and reply.status != 404:
                log.warning("run %s: pipeline state answered HTTP %s", self.run_input.run_id, reply.status)
            return
        out: list[Event] = []
        if snapshot and isinstance(reply.body.get("snapshot"), dict):
            out.append(self.translator.snapshot_event(reply.body["snapshot"], self._ts))
        for envelope in reply.body.get("events") or []:
            if isinstance(envelope, dict):
                self.translator.map_envelope(envelope, self._ts, out)
        self._emit(out)

    # ================================================================== interrupts
    def _interrupt(self, inputs: list[dict[str, Any]]) -> None:
        """Build the interrupts; after gap filling they are committed, then announced (rule 1)."""
        expires_at = intr.rfc3339(self._now + self.interrupt_ttl)
        pending: dict[str, PendingInterrupt] = {}
        for kernel_input in inputs:
            input_id = kernel_input.get("inputId")
            if not isinstance(input_id, str) or not input_id:
                log.warning("run %s: ignoring a kernel input without inputId", self.run_input.run_id)
                continue
            request_task = kernel_input.get("requestTaskId")
            if request_task and request_task != self.task_id:
                raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.INTERRUPT_OTHER_TASK)
            context = kernel_input.get("contextId")
            if context and context != self.record.context_id:
                raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.INTERRUPT_OTHER_CONTEXT)
            pending[input_id] = PendingInterrupt(
                intr.allowlisted(kernel_input),
                intr.build_interrupt(kernel_input, expires_at=expires_at, language=self.language),
                input_id in self.sideband_ids,
            )
        if not pending:
            self._end_of_stream()
            return
        self._commit = pending
        self._fill_gaps()

    def _commit_interrupts(self, pending: dict[str, PendingInterrupt]) -> None:
        mutation = CommitInterrupts(
            self.execution_id,
            self.task_id,
            pending,
            self.translator.text_digests(),
            self.translator.pipeline.to_json(),
        )
        self._await_write(mutation, Phase.COMMITTING_INTERRUPTS)

    def _on_interrupts_committed(self, reply: Reply) -> None:
        if not isinstance(reply, Persisted):
            log.error("run %s: cannot persist the interrupt: %s", self.run_input.run_id, _reason(reply))
            self._cancel_and_retire()
            raise AguiError(Code.STATE_PERSISTENCE_FAILED, msg.INTERRUPT_NOT_COMMITTED)
        self.record = reply.record
        if self.announced is None:
            self._announce()
        interrupts = [entry.interrupt for entry in reply.record.execution.pending.values()]
        events = self.translator.finish(self._ts, {"type": "interrupt", "interrupts": interrupts})
        self._end(Outcome.INTERRUPT, events, retire=False)

    # ================================================================== resume
    def _start_resume(self, now: float) -> None:
        """Check every answer, then make sure the kernel still has the session and the task."""
        execution = self.record.execution
        try:
            answers = resume.plan(
                self.run_input.resume or [],
                {} if execution.terminal else execution.pending,
                lambda interrupt_id: self.record.applied_digest(self.execution_id, interrupt_id),
                task_id=self.task_id,
                now=now,
            )
        except resume.Expired as exc:
            self._cancel_and_retire()
            raise AguiError(Code.EXECUTION_EXPIRED, msg.EXECUTION_EXPIRED, {"expiresAt": exc.expires_at}) from None
        except resume.CancelExecution:
            self._cancel_and_retire()
            raise AguiError(Code.CANCELLED, msg.CANCELLED_BY_RESPONSE) from None
        self.answers = answers
        if not self.task_id:
            raise self._lose(msg.RESUME_TASK_UNAVAILABLE)
        if self.session_id:
            self._effects.append(RestoreSession(self.record.cwd, self.session_id, self.task_id))
            self.phase = Phase.RESTORING_SESSION
        else:
            self._effects.append(GetTask(self.task_id))
            self.phase = Phase.CHECKING_TASK

    def _on_restored(self, reply: Reply) -> None:
        if isinstance(reply, Failed):
            log.warning("run %s: kernel unavailable before resume: %s", self.run_input.run_id, reply.reason)
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        if isinstance(reply, KernelAnswer):
            error = reply.body.get("error") if isinstance(reply.body, dict) else None
            if reply.status == 409 and isinstance(error, dict) and error.get("code") == Code.SESSION_BACKUP_NOT_READY:
                raise AguiError(Code.SESSION_BACKUP_NOT_READY, msg.SESSION_BACKUP_NOT_READY)
            if reply.status == 404:
                raise self._lose(msg.RESUME_SESSION_UNAVAILABLE, session=True)
            if reply.status >= 400:
                log.warning("ensure-restored answered HTTP %s", reply.status)
                raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        self._effects.append(GetTask(self.task_id or ""))
        self.phase = Phase.CHECKING_TASK

    def _on_task(self, reply: Reply) -> None:
        if isinstance(reply, KernelRefused):
            if reply.error.rpc_code == -32001:
                raise self._lose(msg.RESUME_TASK_UNAVAILABLE)
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        if not isinstance(reply, KernelAnswer):
            log.warning("run %s: kernel unavailable before resume: %s", self.run_input.run_id, _reason(reply))
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        info = inspect_frame({"result": reply.body})
        if info.task_id != self.task_id or (info.context_id and info.context_id != self.record.context_id):
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.RESUME_TASK_MISMATCH)
        if info.session_id and self.session_id and info.session_id != self.session_id:
            raise self._lose(msg.SESSION_LOST, session=True)
        if info.state in _TASK_GONE_STATES:
            raise self._lose(msg.RESUME_TASK_UNAVAILABLE)
        self._emit(self.translator.reopen_steps(self._ts))
        if self.translator.pipeline_seen or self.run_input.props.run_mode == "pipeline":
            self._effects.append(FetchPipelineState(self._journal_params(snapshot=True)))
            self.phase = Phase.RECOVERING_PIPELINE
        else:
            self._send_answers()

    def _send_answers(self) -> None:
        """Sideband answers first (unary calls), then the others, one stream each."""
        sideband = next((a for a in self.answers if a.sideband), None)
        if sideband is not None:
            self.answers.remove(sideband)
            self.answer = sideband
            self._effects.append(SendMessage(self._answer_message(sideband)))
            self.phase = Phase.SENDING_SIDEBAND
        elif self.answers:
            self._send_next_answer()
        else:  # only sideband answers: follow the task they unblocked
            self._effects.append(Follow(self.task_id or ""))
            self.phase = Phase.STREAMING

    def _send_next_answer(self) -> None:
        self.answer = self.answers.pop(0)
        self._effects.append(SendStreaming(self._answer_message(self.answer)))
        self.phase = Phase.ANSWERING

    def _answer_message(self, answer: resume.Answer) -> dict[str, Any]:
        metadata = self._metadata()
        if answer.input_response:
            metadata["inputResponse"] = answer.input_response
        return outbound.user_turn(
            message_id=f"agui-resume-{run_tag(self.run_input.run_id)}-{answer.interrupt_id}",
            context_id=self.record.context_id,
            parts=[answer.part],
            metadata=metadata,
            task_id=self.task_id,
        )

    def _on_sideband_sent(self, reply: Reply) -> None:
        if isinstance(reply, KernelRefused):
            raise self._rejection(reply.error)
        if not isinstance(reply, KernelAnswer):
            log.warning("run %s: kernel unavailable for an answer: %s", self.run_input.run_id, _reason(reply))
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
        if _refused_ack(reply.body):  # a permission_ack saying accepted: false
            raise AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_REJECTED)
        assert self.answer is not None
        self._accept(self.answer)

    def _accept(self, answer: resume.Answer) -> None:
        """The kernel took the answer: only now does it leave the durable pending state (rule 2)."""
        self._await_write(AcceptAnswer(self.execution_id, answer.interrupt_id, answer.digest), Phase.ACCEPTING_ANSWER)

    def _on_answer_accepted(self, reply: Reply) -> None:
        answer = self.answer
        assert answer is not None
        if not isinstance(reply, Persisted):
            log.error("run %s: cannot commit an accepted answer: %s", self.run_input.run_id, _reason(reply))
            self._cancel_and_retire()
            raise AguiError(Code.STATE_PERSISTENCE_FAILED, msg.ANSWER_NOT_COMMITTED)
        self.record = reply.record
        self.answer = None
        if answer.result and answer.tool_use_id:
            self.owed_results.append((answer.tool_use_id, answer.result))
        if answer.sideband:
            self._send_answers()
        else:
            self.phase = Phase.STREAMING
            self._continue_backlog()


#: What a reply means depends on the phase that waits for it (every other phase takes none).
_REPLY_HANDLERS: dict[Phase, Callable[[RunMachine, Reply], None]] = {
    Phase.STOPPING_STALE_TASK: RunMachine._on_stale_task_stopped,
    Phase.RESTORING_SESSION: RunMachine._on_restored,
    Phase.CHECKING_TASK: RunMachine._on_task,
    Phase.RECOVERING_PIPELINE: RunMachine._on_snapshot,
    Phase.SENDING_SIDEBAND: RunMachine._on_sideband_sent,
    Phase.RECORDING_IDS: RunMachine._on_ids_recorded,
    Phase.ACCEPTING_ANSWER: RunMachine._on_answer_accepted,
    Phase.FILLING_GAPS: RunMachine._on_gaps,
    Phase.COMMITTING_INTERRUPTS: RunMachine._on_interrupts_committed,
}


def _refused_ack(body: Any) -> bool:
    """Whether a unary answer's reply holds an acknowledgement with ``accepted: false``."""
    if isinstance(body, dict):
        if body.get("accepted") is False:
            return True
        return any(_refused_ack(value) for value in body.values())
    if isinstance(body, list):
        return any(_refused_ack(item) for item in body)
    return False


def _reason(reply: Reply) -> str:
    return reply.reason if isinstance(reply, Failed) else type(reply).__name__
