"""The thread record's named mutations: each one alone, on records in memory."""

from __future__ import annotations

import pytest

from agui_adapter.state.record import (
    MAX_TERMINAL_EXECUTIONS,
    AcceptAnswer,
    CommitInterrupts,
    Execution,
    PendingInterrupt,
    RecordIds,
    RetireExecution,
    StaleExecution,
    ThreadRecord,
)


def record(**execution: object) -> ThreadRecord:
    return ThreadRecord(
        thread_id="t-1",
        context_id="ctx-1",
        cwd="/tmp/ws",
        user_id=None,
        execution=Execution(execution_id="ex-1", ros_invocation_id="inv-1", **execution),  # type: ignore[arg-type]
    )


def pending(*ids: str) -> dict[str, PendingInterrupt]:
    return {i: PendingInterrupt({"inputId": i}, {"id": i, "expiresAt": "2999-01-01T00:00:00Z"}) for i in ids}


def test_record_ids_fills_the_task_and_a_first_session_only() -> None:
    rec = record()
    RecordIds("ex-1", task_id="task-1", session_id="s-1").apply(rec)
    assert rec.execution.task_id == "task-1" and rec.session_id == "s-1"
    RecordIds("ex-1", session_id="s-2").apply(rec)
    assert rec.session_id == "s-1"  # a session once known is never replaced by this mutation
    RecordIds("ex-old", task_id="task-old").apply(rec)
    assert rec.execution.task_id == "task-1"  # another execution's task is not this one's


def test_commit_interrupts_merges_and_keeps_what_a_resume_needs() -> None:
    rec = record(task_id="task-1", pending=pending("p1"))
    CommitInterrupts("ex-1", "task-1", pending("p1", "q1"), ["d1"], {"highWater": 3}).apply(rec)
    assert list(rec.execution.pending) == ["p1", "q1"]
    assert rec.execution.text_digests == ["d1"] and rec.execution.pipeline == {"highWater": 3}


@pytest.mark.parametrize("execution_id, terminal", [("ex-other", False), ("ex-1", True)])
def test_commit_interrupts_refuses_an_execution_that_moved_on(execution_id: str, terminal: bool) -> None:
    rec = record(terminal=terminal)
    with pytest.raises(StaleExecution):
        CommitInterrupts(execution_id, "task-1", pending("p1"), [], {}).apply(rec)
    assert not rec.execution.pending


def test_accept_answer_leaves_pending_and_is_remembered() -> None:
    rec = record(pending=pending("p1", "q1"))
    AcceptAnswer("ex-1", "p1", "digest-1").apply(rec)
    assert list(rec.execution.pending) == ["q1"]
    assert rec.applied_digest("ex-1", "p1") == "digest-1" and rec.applied_digest("ex-1", "q1") is None
    AcceptAnswer("ex-1", "p1", "digest-2").apply(rec)  # the latest digest wins, one entry per answer
    assert rec.applied_digest("ex-1", "p1") == "digest-2" and len(rec.applied_answers) == 1


def test_retire_execution_and_its_guards() -> None:
    rec = record(pending=pending("p1"))
    RetireExecution("ex-1", unless_waiting=True).apply(rec)
    assert not rec.execution.terminal  # interrupts are pending: kept
    RetireExecution("ex-other").apply(rec)
    assert not rec.execution.terminal  # not this execution
    RetireExecution("ex-1", task_id="task-late").apply(rec)
    assert rec.execution.terminal and not rec.execution.pending
    assert rec.execution.task_id == "task-late" and rec.terminal_executions == {"ex-1": "inv-1"}


def test_retire_forgets_a_lost_session_only_if_it_is_still_the_threads() -> None:
    rec = record()
    rec.session_id = "s-1"
    RetireExecution("ex-1", lost_session="s-0").apply(rec)
    assert rec.session_id == "s-1"
    RetireExecution("ex-1", lost_session="s-1").apply(rec)
    assert rec.session_id is None


def test_a_new_turn_retires_the_current_execution_and_history_is_bounded() -> None:
    rec = record()
    for n in range(MAX_TERMINAL_EXECUTIONS + 5):
        rec.start_execution(f"ex-{n + 2}", "inv-1")
    assert rec.execution.execution_id == f"ex-{MAX_TERMINAL_EXECUTIONS + 6}" and not rec.execution.terminal
    assert len(rec.terminal_executions) == MAX_TERMINAL_EXECUTIONS
    assert "ex-1" not in rec.terminal_executions  # the oldest fell out


def test_json_round_trip_keeps_typed_pending_interrupts() -> None:
    rec = record(task_id="task-1", pending=pending("p1"))
    again = ThreadRecord.from_json(rec.to_json(), "t-1")
    assert again.execution.pending["p1"] == rec.execution.pending["p1"]
    assert again.execution.pending["p1"].expires_at == "2999-01-01T00:00:00Z"
