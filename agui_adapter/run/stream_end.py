"""The end of a kernel stream: the next answer, or the interrupts, or the run's verdict.

Decisions of the run machine (``machine``), each taking the run's knowledge
(``context.RunContext``) and returning the ``Move`` to make, or raising; none sets the phase
or emits. When a stream ends (or asks for input), the events it skipped are fetched from
the kernel's pipeline journal first (``FetchPipelineState``); then the interrupts are
committed before they are announced (rule 1: ``CommitInterrupts``, then
``RUN_FINISHED(interrupt)``), or the run concludes from the kernel's last states
(``endings.stream_error``).
"""

from __future__ import annotations

from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.run import endings, pipeline_state, resume_steps
from agui_adapter.run import interrupts as intr
from agui_adapter.run.context import RunContext
from agui_adapter.run.effects import Effect, Emit, FetchPipelineState, Outcome, Persist, Persisted, Reply
from agui_adapter.run.transitions import Carried, Failure, InterruptsToCommit, Move, Phase, after
from agui_adapter.state.record import CommitInterrupts, PendingInterrupt


def on_stream_end(run: RunContext, phase: Phase) -> Move:
    """The stream being read in ``phase`` closed."""
    if phase is Phase.GUIDING or phase is Phase.ANSWERING:
        raise AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_NOT_ACCEPTED)
    if run.answers and run.bad_state is None:
        return resume_steps.send_next(run)
    return end_of_stream(run)


def end_of_stream(run: RunContext) -> Move:
    if run.answers.new_inputs and run.bad_state is None:
        return interrupt(run, run.answers.take_new_inputs())
    return _fill_gaps(run, None)


def interrupt(run: RunContext, inputs: list[dict[str, Any]]) -> Move:
    """Build the interrupts; after gap filling they are committed, then announced (rule 1)."""
    pending = intr.pending_interrupts(
        inputs,
        run.run_input.run_id,
        task_id=run.task_id,
        context_id=run.record.context_id,
        expires_at=rfc3339(run.now + run.interrupt_ttl),
        language=run.language,
        sideband_ids=run.answers.sideband_ids,
    )
    return _fill_gaps(run, pending) if pending else end_of_stream(run)


def _fill_gaps(run: RunContext, interrupts: dict[str, PendingInterrupt] | None) -> Move:
    """Events the live stream skipped exist in the kernel's journal: deliver them too;
    then commit the interrupts, if the stream ended in some, or conclude."""
    if run.translator.pipeline_seen and run.task_id:
        fetch = FetchPipelineState(pipeline_state.journal_params(run.task_id, run.translator.pipeline, snapshot=False))
        if interrupts is None:
            return Move(Phase.FILLING_GAPS, [fetch])
        return Move(Phase.FILLING_GAPS_BEFORE_INTERRUPT, [fetch], InterruptsToCommit(interrupts))
    return _conclude(run) if interrupts is None else _commit(run, interrupts)


def on_gaps(run: RunContext, reply: Reply) -> Move:
    return after(_gap_events(run, reply), lambda: _conclude(run))


def on_gaps_before_interrupt(run: RunContext, reply: Reply, carried: Carried) -> Move:
    assert isinstance(carried, InterruptsToCommit)
    pending = dict(carried.pending)
    return after(_gap_events(run, reply), lambda: _commit(run, pending))


def _gap_events(run: RunContext, reply: Reply) -> list[Any]:
    return pipeline_state.events_from(reply, run.translator, run.ts, run.run_input.run_id, snapshot=False)


def _conclude(run: RunContext) -> Move:
    effects: list[Effect] = [Emit([run.announcement()])] if run.announced is None and run.task_id else []
    error = endings.stream_error(run.bad_state, run.last_state, run.translator.failure_detail)
    if error is not None:
        raise Failure(error, effects)
    move = run.success(retire=True)
    move.effects[:0] = effects
    return move


def _commit(run: RunContext, pending: dict[str, PendingInterrupt]) -> Move:
    mutation = CommitInterrupts(
        run.execution_id, run.task_id, pending, run.translator.text_digests(), run.translator.pipeline.to_json()
    )
    return Move(Phase.COMMITTING_INTERRUPTS, [Persist(mutation, required=True)])


def on_interrupts_committed(run: RunContext, reply: Reply) -> Move:
    if not isinstance(reply, Persisted):
        raise run.write_failed(reply, "persist the interrupt", msg.INTERRUPT_NOT_COMMITTED)
    run.record = reply.record
    effects: list[Effect] = [Emit([run.announcement()])] if run.announced is None else []
    interrupts = [entry.interrupt for entry in reply.record.execution.pending.values()]
    events = run.translator.finish(run.ts, {"type": "interrupt", "interrupts": interrupts})
    move = run.end(Outcome.INTERRUPT, events, retire=False)
    move.effects[:0] = effects
    return move
