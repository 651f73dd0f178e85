"""The run machine, fed recorded kernel frames: no sockets, no threads, no clock.

A small bench plays the driver: it applies the machine's store mutations to an
in-memory record, answers its kernel requests from a script, and keeps every effect,
so each test can check both what the client sees and the order of things (persist
before announcing, release before the final event, spans closed before RUN_ERROR).
It carries the effects out with production's own loop (``run.loop``). The last section
replays this module's scenarios to check the transition table (``run.transitions``)
against what the machine does.
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.kernel_client.failures import KernelRejected
from agui_adapter.kernel_client.sse import SSEDecoder
from agui_adapter.protocol.errors import Code
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.protocol.validation import validate_run_input
from agui_adapter.run import driver as run_driver
from agui_adapter.run import interrupts as intr
from agui_adapter.run import loop as run_loop
from agui_adapter.run import machine as machine_module
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
from agui_adapter.run.loop import carry_out
from agui_adapter.run.machine import Phase, RunMachine
from agui_adapter.run.transitions import MOVES, TAKES, IllegalMove, Input, Move
from agui_adapter.run.translation import inspect_frame
from agui_adapter.state.record import (
    AcceptAnswer,
    CommitInterrupts,
    Execution,
    PendingInterrupt,
    RecordIds,
    RetireExecution,
    StaleExecution,
    ThreadRecord,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "a2a"
NOW = 1_800_000_000.0


def frames(name: str) -> list[Any]:
    return [json.loads(p) for p in SSEDecoder().feed((DATA / name).read_bytes())]


def context_of(name: str) -> str:
    return next(info.context_id for info in map(inspect_frame, frames(name)) if info.context_id)


def body(text: str | None = "hello", *, resume: list[dict[str, Any]] | None = None, **props: Any) -> dict[str, Any]:
    iac = {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": "/tmp/ws", **props}
    payload: dict[str, Any] = {
        "threadId": "thread-1",
        "runId": "run-1" if resume is None else "run-2",
        "state": {},
        "messages": [] if text is None else [{"id": "m1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {"iacCode": iac},
    }
    if resume is not None:
        payload["resume"] = resume
    return payload


def record_for(context_id: str, **execution: Any) -> ThreadRecord:
    return ThreadRecord(
        thread_id="thread-1",
        context_id=context_id,
        cwd="/tmp/ws",
        user_id=None,
        execution=Execution(execution_id="exec-1", ros_invocation_id="inv-1", **execution),
    )


class Bench:
    """Plays the driver: a record in memory, scripted kernel answers, every effect kept."""

    def __init__(self, machine: RunMachine, record: ThreadRecord, replies: dict[type, Any] | None = None) -> None:
        self.machine = machine
        self.disk = copy.deepcopy(record)  # what the store holds
        self.replies = replies or {}
        self.failing: set[type] = set()  # mutation types whose writes fail
        self.effects: list[Effect] = []

    def feed(self, effects: list[Effect]) -> None:
        """Carry the effects out with production's loop (``run.loop``), keeping each one."""
        for _request in carry_out(self.machine, effects, self._perform, self._emit, lambda: NOW):
            pass

    def _emit(self, events: list[dict[str, Any]]) -> None:
        self.effects.append(Emit(events))

    def _perform(self, effect: Effect) -> Reply | None:
        self.effects.append(effect)
        if isinstance(effect, Persist):
            if type(effect.mutation) in self.failing:
                return Failed("disk full") if effect.required else None
            scratch = copy.deepcopy(self.disk)
            try:
                effect.mutation.apply(scratch)
            except StaleExecution:
                return Failed("stale") if effect.required else None
            self.disk = scratch
            return Persisted(copy.deepcopy(scratch)) if effect.required else None
        if isinstance(effect, (StopTask, RestoreSession, GetTask, FetchPipelineState, SendMessage)):
            reply = self.replies[type(effect)]
            return reply(effect) if callable(reply) else reply
        return None

    # --- reading what happened ----------------------------------------------------------
    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for effect in self.effects if isinstance(effect, Emit) for e in effect.events]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def index(self, predicate: Any) -> int:
        return next(i for i, effect in enumerate(self.effects) if predicate(effect))

    def emitted_at(self, event_type: str, name: str | None = None) -> int:
        def has(effect: Effect) -> bool:
            return isinstance(effect, Emit) and any(
                e["type"] == event_type and (name is None or e.get("name") == name) for e in effect.events
            )

        return self.index(has)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]

    def mutations(self, kind: type) -> list[Any]:
        return [e.mutation for e in self.of(Persist) if isinstance(e.mutation, kind)]

    @property
    def finish(self) -> Finish:
        [finish] = self.of(Finish)
        return finish


def turn(capture: str, text: str = "hello", **props: Any) -> tuple[RunMachine, Bench]:
    record = record_for(context_of(capture))
    machine = RunMachine(
        validate_run_input(body(text, **props)), mode=Mode.TURN, record=copy.deepcopy(record), language="en"
    )
    bench = Bench(machine, record)
    bench.feed(machine.start(NOW))
    return machine, bench


def assert_spans_balanced(types: list[str]) -> None:
    for start, end in (
        ("TEXT_MESSAGE_START", "TEXT_MESSAGE_END"),
        ("TOOL_CALL_START", "TOOL_CALL_END"),
        ("REASONING_START", "REASONING_END"),
        ("STEP_STARTED", "STEP_FINISHED"),
    ):
        assert types.count(start) == types.count(end), (start, types)
    assert types[0] == "RUN_STARTED"
    assert types[-1] in ("RUN_FINISHED", "RUN_ERROR")
    assert sum(t in ("RUN_FINISHED", "RUN_ERROR") for t in types) == 1


def assert_release_before_final(bench: Bench) -> None:
    final = bench.emitted_at(bench.types()[-1])
    assert bench.index(lambda e: isinstance(e, ReleaseThread)) < final
    assert isinstance(bench.effects[-1], Finish)


# ====================================================================== normal turns
def test_normal_turn_persists_ids_before_announcing_and_releases_before_the_end() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    assert [type(e) for e in bench.effects] == [Emit, SendStreaming] and machine.phase is Phase.STREAMING
    bench.feed(machine.frames(frames("01-normal-text.sse.txt"), NOW))
    bench.feed(machine.stream_ended(NOW))

    [ids, *more_ids] = bench.mutations(RecordIds)
    assert ids.task_id  # the first ids persisted name the task
    assert all(m.session_id for m in more_ids)  # any later ones bring the session
    assert bench.disk.execution.task_id == machine.task_id and bench.disk.session_id == machine.session_id
    first_ids_write = bench.index(lambda e: isinstance(e, Persist) and isinstance(e.mutation, RecordIds))
    assert first_ids_write < bench.emitted_at("CUSTOM", "iac-code.session.v1")
    assert_release_before_final(bench)
    types = bench.types()
    assert_spans_balanced(types)
    assert (
        "".join(e["delta"] for e in bench.events if e["type"] == "TEXT_MESSAGE_CONTENT") == "Hello from the fake LLM."
    )
    assert bench.finish.outcome is Outcome.SUCCESS and machine.ended
    assert bench.disk.execution.terminal  # retired: its cancel answers already_terminal


def test_frames_split_anywhere_give_the_same_events() -> None:
    capture = frames("32-thinking-raw.sse.txt")
    machine, whole = turn("32-thinking-raw.sse.txt")
    whole.feed(machine.frames(capture, NOW))
    whole.feed(machine.stream_ended(NOW))
    machine, split = turn("32-thinking-raw.sse.txt")
    for frame in capture:
        split.feed(machine.frames([frame], NOW))
    split.feed(machine.stream_ended(NOW))
    assert whole.events == split.events
    assert "REASONING_MESSAGE_CONTENT" in whole.types()


def test_tool_call_then_its_result_and_artifact() -> None:
    machine, bench = turn("02-permission.sse.txt", "[WRITE] create hello.txt")
    bench.feed(machine.frames(frames("02-permission.sse.txt"), NOW))
    types = bench.types()
    assert types[types.index("TOOL_CALL_START") : types.index("TOOL_CALL_END") + 1] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
    ]
    [start] = [e for e in bench.events if e["type"] == "TOOL_CALL_START"]
    assert start["toolCallName"] == "write_file"
    # the stream after the permission was allowed: the tool's result and its artifact
    machine, bench = turn("04-permission-allow.sse.txt")
    bench.feed(machine.frames(frames("04-permission-allow.sse.txt"), NOW))
    bench.feed(machine.stream_ended(NOW))
    assert_spans_balanced(bench.types())
    [result] = [e for e in bench.events if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == start["toolCallId"] and "Successfully wrote" in result["content"]
    assert any(e.get("name") == "iac-code.artifact.v1" for e in bench.events)
    assert bench.finish.outcome is Outcome.SUCCESS


def test_kernel_failure_and_cancellation_end_in_run_error() -> None:
    machine, bench = turn("23-llm-http500.sse.txt")
    bench.feed(machine.frames(frames("23-llm-http500.sse.txt"), NOW))
    bench.feed(machine.stream_ended(NOW))
    assert bench.finish.code == Code.A2A_EXECUTION_FAILED and bench.types()[-1] == "RUN_ERROR"

    machine, bench = turn("12-cancel-during-stream.sse.txt")
    bench.feed(machine.frames(frames("12-cancel-during-stream.sse.txt"), NOW))
    bench.feed(machine.stream_ended(NOW))
    assert bench.finish.code == Code.CANCELLED
    assert_spans_balanced(bench.types())


def test_kernel_gone_mid_stream_closes_spans_and_cancels_the_task() -> None:
    capture = frames("01-normal-text.sse.txt")
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames(capture[:5], NOW))  # a text message is open
    assert bench.types()[-1] == "TEXT_MESSAGE_CONTENT"
    bench.feed(machine.kernel_unavailable("connection reset", NOW))
    types = bench.types()
    assert types[-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"] and bench.finish.code == Code.A2A_UNAVAILABLE
    assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id]
    assert bench.disk.execution.terminal
    assert_release_before_final(bench)


def test_a_session_the_kernel_lost_retires_the_execution_and_is_forgotten() -> None:
    capture = frames("01-normal-text.sse.txt")
    record = record_for(context_of("01-normal-text.sse.txt"))
    record.session_id = "a-session-the-kernel-forgot"
    machine = RunMachine(validate_run_input(body()), mode=Mode.TURN, record=copy.deepcopy(record), language="en")
    bench = Bench(machine, record)
    bench.feed(machine.start(NOW))
    bench.feed(machine.frames(capture, NOW))
    assert bench.finish.code == Code.EXECUTION_LOST
    assert "new session" in bench.events[-1]["message"]
    assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id]  # the task it started in a new session
    assert bench.disk.session_id is None and bench.disk.execution.terminal  # the next run starts cleanly


def test_a_task_left_running_by_a_dead_adapter_is_stopped_before_the_new_turn() -> None:
    record = record_for(context_of("01-normal-text.sse.txt"))
    payload = validate_run_input(body())
    machine = RunMachine(payload, mode=Mode.TURN, record=copy.deepcopy(record), language="en", stale_task_id="old")
    bench = Bench(machine, record, {StopTask: KernelAnswer(200, {"id": "old", "status": {"state": "canceled"}})})
    bench.feed(machine.start(NOW))
    assert [type(e) for e in bench.effects] == [Emit, StopTask, SendStreaming] and machine.phase is Phase.STREAMING
    # a kernel that restarted does not know the task any more: the turn starts all the same
    machine = RunMachine(payload, mode=Mode.TURN, record=copy.deepcopy(record), language="en", stale_task_id="old")
    refused = KernelRefused(KernelRejected({"code": -32001, "message": "Task not found"}))
    bench = Bench(machine, record, {StopTask: refused})
    bench.feed(machine.start(NOW))
    assert isinstance(bench.effects[-1], SendStreaming)


def test_ids_that_cannot_be_written_fail_closed() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    bench.failing.add(RecordIds)
    bench.feed(machine.frames(frames("01-normal-text.sse.txt"), NOW))
    assert bench.finish.code == Code.STATE_PERSISTENCE_FAILED
    assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id]
    assert "CUSTOM" not in bench.types()  # nothing announced that is not on disk


def test_a_rejected_call_is_an_execution_failure_and_a_backup_wait_is_retryable() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.kernel_rejected(KernelRejected({"code": -32602, "message": "bad params"}), NOW))
    assert bench.finish.code == Code.A2A_EXECUTION_FAILED and "bad params" in bench.events[-1]["message"]
    machine, bench = turn("01-normal-text.sse.txt")
    error = {"code": -32000, "message": "wait", "data": {"code": "SESSION_BACKUP_NOT_READY"}}
    bench.feed(machine.kernel_rejected(KernelRejected(error), NOW))
    assert bench.finish.code == Code.SESSION_BACKUP_NOT_READY


# ====================================================================== interrupts
def test_permission_interrupt_is_committed_before_it_is_announced() -> None:
    machine, bench = turn("02-permission.sse.txt", "[WRITE] create hello.txt")
    bench.feed(machine.frames(frames("02-permission.sse.txt"), NOW))
    assert bench.finish.outcome is Outcome.INTERRUPT
    [commit] = bench.mutations(CommitInterrupts)
    commit_at = bench.index(lambda e: isinstance(e, Persist) and isinstance(e.mutation, CommitInterrupts))
    assert commit_at < bench.emitted_at("RUN_FINISHED")
    assert_release_before_final(bench)
    [interrupt] = bench.events[-1]["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["expiresAt"] == rfc3339(NOW + 86400)
    assert set(bench.disk.execution.pending) == {interrupt["id"]} and not bench.disk.execution.terminal
    assert not bench.mutations(RetireExecution)
    assert_spans_balanced(bench.types())


def test_question_interrupt_fills_pipeline_gaps_first() -> None:
    capture = frames("34-pipeline-ask.sse.txt")
    machine, bench = turn("34-pipeline-ask.sse.txt", runMode="pipeline", pipelineName="selling")
    # the live stream skipped sequence 12; the kernel's journal has it
    skipped = {"sequence": 12, "eventId": "evt-skipped", "eventType": "stack_progress", "scope": "pipeline"}
    skipped |= {"pipelineRunId": "ctx-pipe-2", "pipelineName": "selling", "data": {"stack": "s-1"}}
    bench.replies[FetchPipelineState] = KernelAnswer(200, {"events": [skipped]})
    bench.feed(machine.frames(capture, NOW))
    assert bench.finish.outcome is Outcome.INTERRUPT
    [fetch] = bench.of(FetchPipelineState)
    assert fetch.params == {"taskId": machine.task_id, "afterSequence": 9, "includeSnapshot": "false"}
    fetch_at = bench.index(lambda e: isinstance(e, FetchPipelineState))
    commit_at = bench.index(lambda e: isinstance(e, Persist) and isinstance(e.mutation, CommitInterrupts))
    assert fetch_at < commit_at < bench.emitted_at("RUN_FINISHED")
    pipeline = [e["value"] for e in bench.events if e.get("name") == "iac-code.pipeline.v1"]
    assert pipeline[-1]["eventId"] == "evt-skipped"
    assert bench.disk.execution.pipeline["delivered"] == [12]  # remembered: never sent twice
    [interrupt] = bench.events[-1]["outcome"]["interrupts"]
    assert interrupt["reason"] != "tool_call" and interrupt["responseSchema"]
    assert_spans_balanced(bench.types())


# ====================================================================== resume
PERMISSION = {"kind": "permission", "inputId": "p1", "toolUseId": "call-1", "required": True, "toolName": "write_file"}
QUESTION = {
    "kind": "ask_user_question",
    "inputId": "q1",
    "required": True,
    "question": "Which region?",
    "options": [{"id": "hz", "label": "cn-hangzhou"}],
    "allowFreeText": True,
}


def resumed(
    *inputs: dict[str, Any], answers: list[dict[str, Any]], session_id: str | None = "sess-1"
) -> tuple[RunMachine, Bench]:
    expires = rfc3339(NOW + 3600)
    pending = {
        i["inputId"]: PendingInterrupt(i, intr.build_interrupt(i, expires_at=expires, language="en")) for i in inputs
    }
    record = record_for("ctx-1", task_id="task-1", pending=pending)
    record.session_id = session_id
    machine = RunMachine(
        validate_run_input(body(None, resume=answers)), mode=Mode.RESUME, record=copy.deepcopy(record), language="en"
    )
    task = {"id": "task-1", "contextId": "ctx-1", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}}
    bench = Bench(machine, record, {RestoreSession: KernelAnswer(200, {}), GetTask: KernelAnswer(200, task)})
    return machine, bench


def status(state: str, text: str | None = None, **iac: Any) -> dict[str, Any]:
    update: dict[str, Any] = {"taskId": "task-1", "contextId": "ctx-1", "status": {"state": state}}
    if text:
        update["status"]["message"] = {"messageId": "m-a", "role": "ROLE_AGENT", "parts": [{"text": text}]}
    update["metadata"] = {"iac_code": {"iacCodeSessionId": "sess-1", **iac}}
    return {"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": update}}


def test_several_answers_are_each_delivered_and_accepted_on_their_first_frame() -> None:
    answers = [
        {"interruptId": "q1", "status": "resolved", "payload": {"selectedId": "hz"}},
        {"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}},
    ]
    machine, bench = resumed(PERMISSION, QUESTION, answers=answers)
    bench.feed(machine.start(NOW))
    kinds = [type(e) for e in bench.effects]
    assert kinds[:4] == [Emit, RestoreSession, GetTask, SendStreaming] and machine.phase is Phase.ANSWERING
    first = bench.of(SendStreaming)[0].message
    assert first["parts"][0]["data"]["decision"] == "allow_once"  # permissions go first

    bench.feed(machine.frames([status("TASK_STATE_WORKING")], NOW))
    assert [m.interrupt_id for m in bench.mutations(AcceptAnswer)] == ["p1"] and machine.phase is Phase.STREAMING
    assert set(bench.disk.execution.pending) == {"q1"}
    bench.feed(machine.stream_ended(NOW))  # the next answer's stream
    assert len(bench.of(SendStreaming)) == 2 and machine.phase is Phase.ANSWERING
    assert bench.of(SendStreaming)[1].message["parts"] == [{"text": "cn-hangzhou"}]
    bench.feed(machine.frames([status("TASK_STATE_WORKING"), status("TASK_STATE_COMPLETED", "Done.")], NOW))
    bench.feed(machine.stream_ended(NOW))
    assert [m.interrupt_id for m in bench.mutations(AcceptAnswer)] == ["p1", "q1"]
    assert bench.finish.outcome is Outcome.SUCCESS and not bench.disk.execution.pending
    assert bench.disk.applied_digest("exec-1", "q1") and bench.disk.execution.terminal
    assert_spans_balanced(bench.types())


def test_an_answer_the_kernel_refuses_stays_pending() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.feed(machine.start(NOW))
    bench.feed(machine.kernel_rejected(KernelRejected({"code": -32602, "message": "no such input"}), NOW))
    assert bench.finish.code == Code.A2A_UNAVAILABLE
    assert not bench.mutations(AcceptAnswer) and not bench.mutations(RetireExecution)
    assert set(bench.disk.execution.pending) == {"p1"}


def test_an_answer_stream_that_ends_without_a_frame_was_not_accepted() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "deny"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.feed(machine.start(NOW))
    bench.feed(machine.stream_ended(NOW))
    assert bench.finish.code == Code.A2A_UNAVAILABLE and set(bench.disk.execution.pending) == {"p1"}


def test_sideband_answers_are_unary_calls_then_the_task_is_followed() -> None:
    sideband = dict(PERMISSION, inputId="s1", scope="candidate")
    answers = [{"interruptId": "s1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(sideband, answers=answers)
    bench.disk.execution.pending["s1"].sideband = True
    machine.record.execution.pending["s1"].sideband = True
    bench.replies[SendMessage] = KernelAnswer(200, {})
    bench.feed(machine.start(NOW))
    assert [type(e) for e in bench.effects][-3:] == [SendMessage, Persist, Follow]
    assert machine.phase is Phase.STREAMING and not bench.disk.execution.pending


def test_resume_of_a_task_the_kernel_lost_retires_its_interrupts() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.replies[GetTask] = KernelRefused(KernelRejected({"code": -32001, "message": "Task not found"}))
    bench.feed(machine.start(NOW))
    assert bench.finish.code == Code.EXECUTION_LOST
    assert bench.disk.execution.terminal and not bench.disk.execution.pending  # no RESUME_REQUIRED after this
    assert bench.disk.session_id == "sess-1"
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.replies[RestoreSession] = KernelAnswer(404, {})
    bench.feed(machine.start(NOW))
    assert bench.finish.code == Code.EXECUTION_LOST and not bench.of(GetTask)
    assert bench.disk.execution.terminal and bench.disk.session_id is None
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.replies[RestoreSession] = Failed("refused")
    bench.feed(machine.start(NOW))
    assert bench.finish.code == Code.A2A_UNAVAILABLE and set(bench.disk.execution.pending) == {"p1"}


def test_an_expired_interrupt_cancels_the_task() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.feed(machine.start(NOW + 7200))
    assert bench.finish.code == Code.EXECUTION_EXPIRED
    assert [c.task_id for c in bench.of(CancelTask)] == ["task-1"] and bench.disk.execution.terminal


def test_an_accepted_answer_that_cannot_be_written_fails_closed() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.failing.add(AcceptAnswer)
    bench.feed(machine.start(NOW))
    bench.feed(machine.frames([status("TASK_STATE_WORKING")], NOW))
    assert bench.finish.code == Code.STATE_PERSISTENCE_FAILED and bench.of(CancelTask)


# ====================================================================== guidance
def test_guidance_ends_when_the_kernel_takes_the_message() -> None:
    record = record_for("ctx-1", task_id="task-1")
    payload = body("go faster", runMode="pipeline", pipelineName="selling", activeGuidance=True)
    machine = RunMachine(validate_run_input(payload), mode=Mode.GUIDANCE, record=copy.deepcopy(record), language="en")
    bench = Bench(machine, record)
    bench.feed(machine.start(NOW))
    [send] = bench.of(SendStreaming)
    assert send.message["taskId"] == "task-1" and machine.phase is Phase.GUIDING
    bench.feed(machine.frames([status("TASK_STATE_WORKING")], NOW))
    assert bench.finish.outcome is Outcome.SUCCESS and bench.types() == ["RUN_STARTED", "RUN_FINISHED"]
    assert not bench.of(Persist)  # the pipeline's own run owns the execution

    machine = RunMachine(validate_run_input(payload), mode=Mode.GUIDANCE, record=copy.deepcopy(record), language="en")
    bench = Bench(machine, record)
    bench.feed(machine.start(NOW))
    bench.feed(machine.client_gone(NOW))
    assert not bench.of(CancelTask) and not bench.of(CancelWhenKnown)


# ====================================================================== the client goes away
@pytest.mark.parametrize("frames_seen", [0, 3])
def test_a_client_gone_cancels_the_task_when_known(frames_seen: int) -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    if frames_seen:
        bench.feed(machine.frames(frames("01-normal-text.sse.txt")[:frames_seen], NOW))
    bench.feed(machine.client_gone(NOW))
    if frames_seen:
        assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id] and bench.disk.execution.terminal
    else:
        assert bench.of(CancelWhenKnown) and not bench.of(CancelTask)
    assert bench.of(ReleaseThread) and bench.finish.outcome is Outcome.ABANDONED
    assert machine.client_gone(NOW) == []  # once


def test_a_client_gone_keeps_pending_interrupts() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.feed(machine.start(NOW))
    bench.feed(machine.client_gone(NOW))
    assert not bench.of(CancelTask) and not bench.mutations(RetireExecution)
    assert set(bench.disk.execution.pending) == {"p1"} and bench.of(StopStream) and bench.of(ReleaseThread)


def test_a_body_closed_before_the_first_write_only_releases_the_thread() -> None:
    record = record_for("ctx-1")
    machine = RunMachine(validate_run_input(body()), mode=Mode.TURN, record=record, language="en")
    effects = machine.client_gone(NOW)
    assert [type(e) for e in effects] == [StopStream, ReleaseThread, Finish]


def test_shutting_down_ends_the_run_with_a_final_event_and_stops_the_task() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames(frames("01-normal-text.sse.txt")[:5], NOW))  # a text message is open
    bench.feed(machine.shutting_down(NOW))
    types = bench.types()
    assert types[-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
    assert bench.finish.code == Code.CANCELLED and "shutting down" in bench.events[-1]["message"]
    assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id] and bench.disk.execution.terminal
    assert_release_before_final(bench)
    assert machine.shutting_down(NOW) == [] and machine.client_gone(NOW) == []


def test_shutting_down_keeps_pending_interrupts() -> None:
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers)
    bench.feed(machine.start(NOW))
    bench.feed(machine.shutting_down(NOW))
    assert bench.finish.code == Code.CANCELLED and not bench.of(CancelTask)
    assert set(bench.disk.execution.pending) == {"p1"}


def test_task_and_session_ids_are_written_once_however_the_frames_arrive() -> None:
    capture = frames("01-normal-text.sse.txt")
    for batches in ([capture], [[frame] for frame in capture]):
        machine, bench = turn("01-normal-text.sse.txt")
        for batch in batches:
            bench.feed(machine.frames(batch, NOW))
        [ids] = bench.mutations(RecordIds)
        assert ids.task_id and ids.session_id and not ids.durable  # the kernel can tell them again
        write = bench.index(lambda e: isinstance(e, Persist) and isinstance(e.mutation, RecordIds))
        assert write < bench.emitted_at("CUSTOM", "iac-code.session.v1")
        types = bench.types()
        assert types.index("CUSTOM") < types.index("TEXT_MESSAGE_CONTENT")
    assert CommitInterrupts.durable and AcceptAnswer.durable and RetireExecution.durable


def test_a_task_id_without_a_session_is_written_before_anything_is_announced() -> None:
    first = frames("01-normal-text.sse.txt")[0]  # the task snapshot: no session id
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames([first], NOW))
    assert not bench.mutations(RecordIds)
    bench.feed(machine.frames([status("TASK_STATE_WORKING", "Hi.")], NOW))  # another task, another context
    assert bench.finish.code == Code.A2A_PROTOCOL_ERROR and not bench.mutations(RecordIds)
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames([first], NOW))
    update = {
        "taskId": machine.task_id,
        "contextId": machine.record.context_id,
        "status": {"state": "TASK_STATE_WORKING"},
    }
    bench.feed(machine.frames([{"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": update}}], NOW))
    [ids] = bench.mutations(RecordIds)
    assert ids.task_id == machine.task_id and ids.session_id is None
    assert bench.disk.execution.task_id == machine.task_id


def selling_frames(name: str) -> list[Any]:
    path = DATA.parent / "a2a-selling" / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_candidate_step_permission_interrupts_while_the_task_keeps_working() -> None:
    capture = selling_frames("05-candidate-step-permissions-first-25s.jsonl")
    context = next(info.context_id for info in map(inspect_frame, capture) if info.context_id)
    record = record_for(context)
    payload = validate_run_input(body("[PIPE-SELL]", runMode="pipeline", pipelineName="selling"))
    machine = RunMachine(payload, mode=Mode.TURN, record=copy.deepcopy(record), language="en")
    bench = Bench(machine, record, {FetchPipelineState: KernelAnswer(404, {})})
    bench.feed(machine.start(NOW))
    bench.feed(machine.frames(capture, NOW))
    assert bench.finish.outcome is Outcome.INTERRUPT
    assert machine.last_state == "working"  # no INPUT_REQUIRED came: the kernel waits in WORKING
    [interrupt] = bench.events[-1]["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["metadata"]["toolName"] == "write_file"
    [pending] = bench.disk.execution.pending.values()
    assert pending.sideband  # answered with a unary SendMessage on Resume
    assert_spans_balanced(bench.types())


def test_a_sideband_answer_acknowledged_as_not_accepted_stays_pending() -> None:
    sideband = dict(PERMISSION, inputId="s1", scope="candidate")
    answers = [{"interruptId": "s1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(sideband, answers=answers)
    bench.disk.execution.pending["s1"].sideband = True
    machine.record.execution.pending["s1"].sideband = True
    ack = {"role": "ROLE_AGENT", "parts": [{"data": {"kind": "permission_ack", "accepted": False}}]}
    bench.replies[SendMessage] = KernelAnswer(200, {"message": ack})
    bench.feed(machine.start(NOW))
    assert bench.finish.code == Code.A2A_UNAVAILABLE and not bench.mutations(AcceptAnswer)
    assert set(bench.disk.execution.pending) == {"s1"}


# ====================================================================== detached runs (reattach)
def test_a_detached_run_nobody_came_back_to_ends_cancelled_with_its_spans_closed() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames(frames("01-normal-text.sse.txt")[:5], NOW))  # a text message is open
    bench.feed(machine.abandoned(NOW))
    assert bench.types()[-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
    assert bench.events[-1]["code"] == Code.CANCELLED and "reattached" in bench.events[-1]["message"]
    assert [c.task_id for c in bench.of(CancelTask)] == [machine.task_id] and bench.disk.execution.terminal
    assert bench.finish.outcome is Outcome.ABANDONED
    assert machine.abandoned(NOW) == [] and machine.client_gone(NOW) == []


def test_a_client_gone_mid_run_leaves_a_closing_event_for_the_journal() -> None:
    machine, bench = turn("01-normal-text.sse.txt")
    bench.feed(machine.frames(frames("01-normal-text.sse.txt")[:5], NOW))
    bench.feed(machine.client_gone(NOW))
    assert bench.types()[-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
    assert bench.events[-1]["code"] == Code.CANCELLED and "went away" in bench.events[-1]["message"]


# ====================================================================== the transition table
def test_an_input_the_phase_does_not_take_raises_naming_the_phase_and_the_input() -> None:
    machine, _ = turn("01-normal-text.sse.txt")
    assert machine.phase is Phase.STREAMING
    with pytest.raises(IllegalMove, match="phase streaming does not take the input replied"):
        machine.replied(Failed("nobody asked"), NOW)
    with pytest.raises(IllegalMove, match="phase streaming does not take the input start"):
        machine.start(NOW)
    effects = machine.frames(frames("01-normal-text.sse.txt")[:2], NOW)  # not carried out: the write is awaited
    assert isinstance(effects[-1], Persist) and machine.phase is Phase.RECORDING_IDS
    with pytest.raises(IllegalMove, match="phase recording-ids does not take the input frames") as caught:
        machine.frames(frames("01-normal-text.sse.txt"), NOW)
    assert (caught.value.phase, caught.value.input) == (Phase.RECORDING_IDS, Input.FRAMES)


def test_a_move_the_table_does_not_list_raises_naming_the_phase_and_the_input(monkeypatch: Any) -> None:
    record = record_for("ctx-1")
    machine = RunMachine(validate_run_input(body()), mode=Mode.TURN, record=record, language="en")
    monkeypatch.setattr(machine, "_first_call", lambda: Move(Phase.COMMITTING_INTERRUPTS))
    with pytest.raises(IllegalMove, match="phase ready cannot move to committing-interrupts on the input start"):
        machine.start(NOW)
    assert machine.phase is Phase.READY


def test_every_phase_that_waits_for_a_reply_knows_what_the_reply_means() -> None:
    assert set(machine_module._REPLY_HANDLERS) == TAKES[Input.REPLIED]


def test_the_bench_and_the_driver_carry_effects_out_with_the_same_loop() -> None:
    assert carry_out is run_loop.carry_out and run_driver.carry_out is run_loop.carry_out
    for method in (Bench.feed, run_driver.RunDriver._carry_out, run_driver.RunDriver._carry_out_quietly):
        assert "carry_out" in method.__code__.co_names, method  # each calls the loop, none has its own


class Recorder:
    """Every move the machines make, and a copy of a machine in each phase it reached."""

    def __init__(self) -> None:
        self.moves: set[tuple[Phase, Phase]] = set()
        self.samples: dict[Phase, RunMachine] = {}

    def install(self, monkeypatch: Any) -> None:
        make, enter = RunMachine._make, RunMachine._enter

        def recording_make(machine: RunMachine, move: Move) -> None:
            before = machine.phase
            make(machine, move)
            self.moves.add((before, machine.phase))
            self.sample(machine)

        def sampling_enter(machine: RunMachine, kind: Input, now: float) -> bool:
            self.sample(machine)
            return enter(machine, kind, now)

        monkeypatch.setattr(RunMachine, "_make", recording_make)
        monkeypatch.setattr(RunMachine, "_enter", sampling_enter)

    def sample(self, machine: RunMachine) -> None:
        if machine.phase not in self.samples:
            self.samples[machine.phase] = copy.deepcopy(machine)


def adopted(record: ThreadRecord, pipeline: dict[str, Any] | None = None) -> tuple[RunMachine, Bench]:
    started = [{"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-1"}]
    machine = RunMachine(
        validate_run_input(body()),
        mode=Mode.TURN,
        record=copy.deepcopy(record),
        language="en",
        adopted_events=started,
        adopted_pipeline=pipeline,
    )
    bench = Bench(machine, record, {FetchPipelineState: KernelAnswer(404, {})})
    bench.feed(machine.start(NOW))
    assert machine.phase is Phase.RECONCILING and machine.reconciling
    return machine, bench


def adopted_scenarios() -> None:
    """An adopted run reconciles on its first frame (after writing a session it learns there),
    or ends, or is interrupted, on it."""
    machine, bench = adopted(record_for("ctx-1", task_id="task-1"))
    bench.feed(machine.frames([status("TASK_STATE_WORKING")], NOW))  # names the session: written first
    assert bench.mutations(RecordIds) and machine.phase is Phase.STREAMING and not machine.reconciling
    machine, bench = adopted(record_for("ctx-1", task_id="task-1"))
    bench.feed(machine.kernel_rejected(KernelRejected({"code": -32001, "message": "Task not found"}), NOW))
    assert machine.ended and machine.reconciling  # settling until the thread is given back (``adoption``)
    assert bench.finish.code == Code.EXECUTION_LOST
    for pipeline in (None, {"highWater": 3}):
        machine, bench = adopted(record_for("ctx-1", task_id="task-1"), pipeline)
        bench.feed(machine.stream_ended(NOW))
        assert machine.ended
        machine, bench = adopted(record_for("ctx-1", task_id="task-1"), pipeline)
        bench.feed(machine.frames([status("TASK_STATE_INPUT_REQUIRED", input=PERMISSION)], NOW))
        assert bench.finish.outcome is Outcome.INTERRUPT


def resume_scenarios() -> None:
    """A Resume without a session checks the task at once and records the session its answer's
    stream names; two sideband answers, then a streamed one; a pipeline Resume's sideband answer."""
    answers = [{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]
    machine, bench = resumed(PERMISSION, answers=answers, session_id=None)
    bench.feed(machine.start(NOW))
    assert not bench.of(RestoreSession) and machine.phase is Phase.ANSWERING
    bench.feed(machine.frames([status("TASK_STATE_WORKING")], NOW))
    assert bench.mutations(RecordIds) and bench.mutations(AcceptAnswer) and machine.phase is Phase.STREAMING

    sidebands = [dict(PERMISSION, inputId=i, scope="candidate") for i in ("s1", "s2")]
    answers = [
        {"interruptId": i, "status": "resolved", "payload": {"decision": "allow_once"}} for i in ("s1", "s2", "p1")
    ]
    for pipeline_seen in (False, True):
        machine, bench = resumed(*sidebands, PERMISSION, answers=answers)
        for record in (bench.disk, machine.record):
            for i in ("s1", "s2"):
                record.execution.pending[i].sideband = True
        machine.translator.pipeline_seen = pipeline_seen
        bench.replies[SendMessage] = KernelAnswer(200, {"accepted": True})
        bench.replies[FetchPipelineState] = KernelAnswer(200, {"events": []})
        bench.feed(machine.start(NOW))
        assert len(bench.of(SendMessage)) == 2 and machine.phase is Phase.ANSWERING


def pipeline_scenarios() -> None:
    """A pipeline turn fills its gaps before it ends; a pipeline Resume recovers the snapshot first."""
    machine, bench = turn("33-pipeline-run.sse.txt", runMode="pipeline", pipelineName="selling")
    bench.replies[FetchPipelineState] = KernelAnswer(404, {})
    bench.feed(machine.frames(frames("33-pipeline-run.sse.txt"), NOW))
    if not machine.ended:
        bench.feed(machine.stream_ended(NOW))
    assert machine.ended and bench.of(FetchPipelineState)

    answers = [{"interruptId": "q1", "status": "resolved", "payload": {"selectedId": "hz"}}]
    machine, bench = resumed(QUESTION, answers=answers)
    machine.translator.pipeline_seen = True  # an earlier run of the execution saw its pipeline
    bench.replies[FetchPipelineState] = KernelAnswer(200, {"events": []})
    bench.feed(machine.start(NOW))
    assert bench.of(FetchPipelineState) and machine.phase is Phase.ANSWERING


def scenarios() -> list[Any]:
    """This module's scenarios that take no argument, and the parametrized client-gone one."""
    plain = [
        test
        for name, test in sorted(globals().items())
        if name.startswith("test_") and callable(test) and not inspect.signature(test).parameters
    ]
    gone = lambda: test_a_client_gone_cancels_the_task_when_known(3)  # noqa: E731
    return [*plain, gone, adopted_scenarios, resume_scenarios, pipeline_scenarios]


def test_the_scenarios_make_every_move_the_table_lists_and_the_phases_take_exactly_their_inputs(
    monkeypatch: Any,
) -> None:
    recorder = Recorder()
    recorder.install(monkeypatch)
    for scenario in scenarios():
        scenario()
    # Every phase, sampled where a scenario reached it, takes exactly the inputs the table says.
    assert set(recorder.samples) == set(Phase)
    replies = {kind: Failed("swept") for kind in Input}
    for phase, sample in recorder.samples.items():
        for kind in Input:
            machine = copy.deepcopy(sample)
            machine._effects = []
            feed = {
                Input.START: lambda m: m.start(NOW),
                Input.FRAMES: lambda m: m.frames([status("TASK_STATE_WORKING")], NOW),
                Input.STREAM_ENDED: lambda m: m.stream_ended(NOW),
                Input.KERNEL_REJECTED: lambda m: m.kernel_rejected(KernelRejected({"code": -32602}), NOW),
                Input.KERNEL_UNAVAILABLE: lambda m: m.kernel_unavailable("swept", NOW),
                Input.CLIENT_GONE: lambda m: m.client_gone(NOW),
                Input.ABANDONED: lambda m: m.abandoned(NOW),
                Input.SHUTTING_DOWN: lambda m: m.shutting_down(NOW),
                Input.REPLIED: lambda m, k=kind: m.replied(replies[k], NOW),
            }[kind]
            if phase in TAKES[kind]:
                feed(machine)  # taken: whatever it decides, by moves the table lists
            else:
                with pytest.raises(IllegalMove, match=f"phase {phase.value} does not take the input {kind.value}"):
                    feed(machine)
    # Every move the table lists is made by some scenario (or by a phase ending), and no other.
    listed = {(phase, to) for phase, nexts in MOVES.items() for to in nexts}
    assert recorder.moves <= listed
    never = listed - recorder.moves
    assert not never, "; ".join(sorted(f"{a.value} -> {b.value}" for a, b in never))
