"""A Resume's way to the kernel: the checks before its answers, then the answers, one at a time.

Decisions of the run machine (``machine``) for a Resume, each taking the run's knowledge
(``context.RunContext``) and returning the ``Move`` to make, or raising (``AguiError``,
``transitions.Failure``, ``identity.Lost``); none sets the phase or emits. Every answer is
checked first (``resume.plan``); the kernel must still have the session (``RestoreSession``)
and the task (``GetTask``), and a pipeline's snapshot comes back before the answers
(``FetchPipelineState``). Sideband answers go first (unary calls, taken when the call
returns), then the others, one stream each, taken on the stream's first frame. An answer
leaves the durable pending state only once the kernel took it (rule 2: ``AcceptAnswer``).
"""

from __future__ import annotations

from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.run import endings, identity, outbound, pipeline_state, resume, resume_replies
from agui_adapter.run.context import RunContext
from agui_adapter.run.effects import (
    Emit,
    FetchPipelineState,
    Follow,
    GetTask,
    Persist,
    Persisted,
    Reply,
    RestoreSession,
    SendMessage,
    SendStreaming,
)
from agui_adapter.run.identity import Lost
from agui_adapter.run.transitions import Failure, Move, Phase, after
from agui_adapter.state.record import AcceptAnswer


def start(run: RunContext) -> Move:
    """Check every answer, then make sure the kernel still has the session and the task."""
    execution = run.record.execution
    try:
        answers = resume.plan(
            run.run_input.resume or [],
            {} if execution.terminal else execution.pending,
            lambda interrupt_id: run.record.applied_digest(run.execution_id, interrupt_id),
            task_id=run.task_id,
            now=run.now,
        )
    except resume.Expired as exc:
        error = AguiError(Code.EXECUTION_EXPIRED, msg.EXECUTION_EXPIRED, {"expiresAt": exc.expires_at})
        raise Failure(error, run.cancel_and_retire()) from None
    except resume.CancelExecution:
        raise Failure(AguiError(Code.CANCELLED, msg.CANCELLED_BY_RESPONSE), run.cancel_and_retire()) from None
    run.answers.pending = answers
    if not run.task_id:
        raise Lost(msg.RESUME_TASK_UNAVAILABLE)
    if run.session_id:
        return Move(Phase.RESTORING_SESSION, [RestoreSession(run.record.cwd, run.session_id, run.task_id)])
    return Move(Phase.CHECKING_TASK, [GetTask(run.task_id)])


def on_restored(run: RunContext, reply: Reply) -> Move:
    resume_replies.check_restored(reply, run.run_input.run_id)
    return Move(Phase.CHECKING_TASK, [GetTask(run.task_id or "")])


def on_task(run: RunContext, reply: Reply) -> Move:
    resume_replies.check_task(
        reply, run.run_input.run_id, task_id=run.task_id, context_id=run.record.context_id, session_id=run.session_id
    )
    reopened = Emit(run.translator.reopen_steps(run.ts))
    if run.translator.pipeline_seen or run.run_input.props.run_mode == "pipeline":
        params = pipeline_state.journal_params(run.task_id, run.translator.pipeline, snapshot=True)
        return Move(Phase.RECOVERING_PIPELINE, [reopened, FetchPipelineState(params)])
    move = send_answers(run)
    move.effects.insert(0, reopened)
    return move


def on_snapshot(run: RunContext, reply: Reply) -> Move:
    events = pipeline_state.events_from(reply, run.translator, run.ts, run.run_input.run_id, snapshot=True)
    return after(events, lambda: send_answers(run))


def send_answers(run: RunContext) -> Move:
    """Sideband answers first (unary calls), then the others, one stream each."""
    sideband = run.answers.next_sideband()
    if sideband is not None:
        return Move(Phase.SENDING_SIDEBAND, [SendMessage(_message(run, sideband))])
    if run.answers:
        return send_next(run)
    return Move(Phase.STREAMING, [Follow(run.task_id or "")])  # only sideband answers: follow the task


def send_next(run: RunContext) -> Move:
    return Move(Phase.ANSWERING, [SendStreaming(_message(run, run.answers.next()))])


def _message(run: RunContext, answer: resume.Answer) -> dict[str, Any]:
    metadata = run.metadata()
    if answer.input_response:
        metadata["inputResponse"] = answer.input_response
    return outbound.user_turn(
        message_id=identity.answer_message_id(run.run_input.run_id, answer.interrupt_id),
        context_id=run.record.context_id,
        parts=[answer.part],
        metadata=metadata,
        task_id=run.task_id,
    )


def on_sideband_sent(run: RunContext, reply: Reply) -> Move:
    refused = resume_replies.check_sideband(reply, run.run_input.run_id)
    if refused is not None:
        raise endings.rejection(refused, run.run_input.run_id, answering=True)
    assert run.answers.current is not None
    return accept(run, run.answers.current)


def accept(run: RunContext, answer: resume.Answer) -> Move:
    """The kernel took the answer: only now does it leave the durable pending state (rule 2)."""
    mutation = AcceptAnswer(run.execution_id, answer.interrupt_id, answer.digest)
    return Move(Phase.ACCEPTING_ANSWER, [Persist(mutation, required=True)])


def on_answer_accepted(run: RunContext, reply: Reply) -> Move:
    if not isinstance(reply, Persisted):
        raise run.write_failed(reply, "commit an accepted answer", msg.ANSWER_NOT_COMMITTED)
    run.record = reply.record
    if run.answers.accepted().sideband:
        return send_answers(run)
    return Move(Phase.STREAMING)
