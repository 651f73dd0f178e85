"""What one run knows, and the effects any of its decisions may need (sans-I/O).

``RunContext`` is the run machine without its phase: the run's input, a copy of its thread
record kept in step with every mutation the run makes, its ids, its translator, its answers
on their way, the kernel states seen, and the clock of the input being taken. The machine's
decisions (``machine``, ``stream_end``, ``resume_steps``) read and update it and return their
``Move``; only the machine (``RunMachine``, which is a ``RunContext``) sets the phase and emits.

The effects every decision may need are built here, returned, never emitted: the endings
(rule 3: stop reading, record the end, release the thread, then the final events), failing
closed (a cancelled task and a retired execution), and rule 6 (the kernel lost the task or
the session: retire the execution, and its interrupts, in one write).
"""

from __future__ import annotations

import logging
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.i18n import translate
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run import identity, outbound
from agui_adapter.run.answers import AnswerQueue
from agui_adapter.run.effects import (
    CancelTask,
    CancelWhenKnown,
    Effect,
    Emit,
    Finish,
    Mode,
    Outcome,
    Persist,
    ReleaseThread,
    Reply,
    StopStream,
)
from agui_adapter.run.identity import Lost, run_tag
from agui_adapter.run.pipeline_progress import PipelineProgress
from agui_adapter.run.resume_replies import reason
from agui_adapter.run.transitions import Failure, Move, Phase
from agui_adapter.run.translation import SESSION_EVENT, RunTranslator
from agui_adapter.state.record import Mutation, RetireExecution, ThreadRecord

log = logging.getLogger("agui_adapter.run")


class RunContext:
    """One run's knowledge; see the module docstring."""

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
    ) -> None:
        self.run_input = run_input
        self.mode = mode
        self.record = record  # a copy kept in step with every mutation the run makes
        self.language = language
        self.parts = parts or []
        self.interrupt_ttl = interrupt_ttl_seconds
        self.stale_task_id = stale_task_id  # a task of an earlier execution that may still run
        execution = record.execution
        self.execution_id = execution.execution_id
        self.task_id = execution.task_id
        self.written_task = execution.task_id  # the task id on disk
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
        self.ts = 0  # the input's time, in ms (event timestamps)
        self.now = 0.0  # the input's time, in seconds

    # ------------------------------------------------------------------ values
    def t(self, template: str, **params: Any) -> str:
        return translate(self.language, template, **params)

    def metadata(self) -> dict[str, Any]:
        return outbound.turn_metadata(self.run_input.props, self.record.cwd, self.language)

    def announcement(self) -> Event:
        """The ``iac-code.session.v1`` event, remembered as announced."""
        value = identity.session_value(
            self.run_input, self.execution_id, self.record.context_id, self.task_id, self.session_id
        )
        self.announced = value
        return ev.custom(self.ts, SESSION_EVENT, value)

    def applied(self, kernel_input: dict[str, Any]) -> bool:
        """Whether an answer to this kernel input was applied already."""
        input_id = kernel_input.get("inputId")
        return isinstance(input_id, str) and self.record.applied_digest(self.execution_id, input_id) is not None

    # ------------------------------------------------------------------ effects, returned
    def persist(self, mutation: Mutation) -> Persist:
        """A best-effort write, mirrored in the run's copy of the record."""
        mutation.apply(self.record)
        return Persist(mutation)

    def cancel_and_retire(self) -> list[Effect]:
        """Fail closed: stop the kernel work and forget what cannot be resumed."""
        effects: list[Effect] = [CancelTask(self.task_id)] if self.task_id else []
        effects.append(self.persist(RetireExecution(self.execution_id, task_id=self.task_id)))
        return effects

    def write_failed(self, reply: Reply, what: str, template: str) -> Failure:
        """A required write failed: fail closed (rule 1)."""
        log.error("run %s: cannot %s: %s", self.run_input.run_id, what, reason(reply))
        return Failure(AguiError(Code.STATE_PERSISTENCE_FAILED, template), self.cancel_and_retire())

    def lost(self, lost: Lost) -> Failure:
        """Rule 6: the kernel lost the execution (or its session): retire it, and its
        interrupts, in one write; the error to end the run with."""
        if lost.task_id and self.task_id is None:
            self.task_id = lost.task_id  # named by the frame that showed the loss
        effects: list[Effect] = [CancelTask(self.task_id)] if self.task_id else []
        lost_session = self.session_id if lost.session else None
        effects.append(self.persist(RetireExecution(self.execution_id, lost_session=lost_session)))
        if lost.session:
            self.session_id = None
        log.warning("run %s: the kernel lost the %s", self.run_input.run_id, "session" if lost.session else "task")
        return Failure(AguiError(Code.EXECUTION_LOST, lost.template), effects)

    def end(self, outcome: Outcome, events: list[Event], *, retire: bool, code: str | None = None) -> Move:
        """Rule 3: stop reading, record the end, release the thread, then the final events."""
        effects: list[Effect] = [StopStream()]
        if retire:
            effects.append(self.persist(RetireExecution(self.execution_id, unless_waiting=True)))
        effects += [ReleaseThread(), Emit(events), Finish(outcome, code)]
        return Move(Phase.ENDED, effects)

    def success(self, *, retire: bool) -> Move:
        return self.end(Outcome.SUCCESS, self.translator.finish(self.ts, {"type": "success"}), retire=retire)

    def error_end(self, err: AguiError) -> Move:
        """RUN_ERROR, after closing every span (rule 4)."""
        events = self.translator.fail(self.ts, err.code, self.t(err.message, **err.params))
        retire = self.mode is not Mode.GUIDANCE and not self.record.execution.waiting
        return self.end(Outcome.ERROR, events, retire=retire, code=err.code)

    def let_go(self, why: str, *, started: bool) -> list[Effect]:
        """Rule 5: stop reading and give the thread back at once, then cancel the kernel task
        and retire the execution, unless interrupts are pending (they stay answerable) or the
        run is guidance (the pipeline is not its own). A next run that starts before the
        retirement is written finds the task stale and stops it first; the retirement itself
        names this execution, so it never touches the next one."""
        effects: list[Effect] = [StopStream(), ReleaseThread()]
        if started and self.mode is not Mode.GUIDANCE and not self.record.execution.waiting:
            log.info("run %s: %s; cancelling the kernel task", self.run_input.run_id, why)
            effects += self.cancel_and_retire() if self.task_id else [CancelWhenKnown(self.execution_id)]
        return effects

    def unattended(self, why: str, message: str, *, started: bool) -> Move:
        """The end of a run nobody follows any more (rule 5); its closing events are for its journal."""
        effects = self.let_go(why, started=started)
        if started:
            effects.append(Emit(self.translator.fail(self.ts, Code.CANCELLED, self.t(message))))
        return Move(Phase.ENDED, [*effects, Finish(Outcome.ABANDONED)])

    def shut_down(self, *, started: bool) -> Move:
        """The adapter stops: the kernel work stops as on a disconnect; a final RUN_ERROR CANCELLED."""
        effects = self.let_go("the adapter is shutting down", started=started)
        events = self.translator.fail(self.ts, Code.CANCELLED, self.t(msg.SHUTTING_DOWN))
        return Move(Phase.ENDED, [*effects, Emit(events), Finish(Outcome.ERROR, Code.CANCELLED)])
