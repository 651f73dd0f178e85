"""The sans-I/O core fed with recorded frames of the real iac-code 0.16.0 kernel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.kernel_client.sse import SSEDecoder
from agui_adapter.run import interrupts as intr
from agui_adapter.run.translation import RunTranslator, inspect_frame, normalize_numbers, normalize_state
from tests.support.agui_stream import check_stream

DATA = Path(__file__).parents[1] / "data" / "a2a"


def frames(name: str) -> list[Any]:
    decoder = SSEDecoder()
    payloads = decoder.feed((DATA / name).read_bytes()) + decoder.close()
    return [json.loads(p) for p in payloads]


def translate(name: str, *, run_id: str = "run-1") -> tuple[list[dict], RunTranslator, list[Any]]:
    translator = RunTranslator("thread-1", run_id)
    events: list[dict] = [{"type": "RUN_STARTED", "timestamp": 1, "threadId": "thread-1", "runId": run_id}]
    infos = []
    for frame in frames(name):
        info = inspect_frame(frame)
        infos.append(info)
        events.extend(translator.map(info, 2))
    return events, translator, infos


def test_sse_decoder_splits_anywhere() -> None:
    raw = (DATA / "01-normal-text.sse.txt").read_bytes()
    whole = SSEDecoder().feed(raw)
    decoder = SSEDecoder()
    pieces: list[bytes] = []
    for i in range(0, len(raw), 7):
        pieces += decoder.feed(raw[i : i + 7])
    assert pieces == whole and len(whole) == 9


def test_sse_decoder_crlf_comments_and_multiline() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": ping - now\r\n\r\ndata: a\r\ndata: b\r") == []
    assert decoder.feed(b"\n\r\nid: 3\nevent: x\ndata:c\n\n") == [b"a\nb", b"c"]
    assert decoder.feed(b"data: tail") == [] and decoder.close() == [b"tail"]


def test_normal_turn_text_usage_and_final_repeat() -> None:
    events, translator, infos = translate("01-normal-text.sse.txt")
    texts = [e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(e["delta"] for e in texts) == "Hello from the fake LLM."
    assert len(texts) == 3  # the trailing full repeat is dropped
    assert infos[-1].state == "input-required" and not infos[-1].inputs
    assert infos[0].kind == "task" and infos[0].task_id == infos[1].task_id
    assert infos[1].session_id == "dd97ed64-5e3b-4779-b029-b396c8605df6"
    events += translator.finish(3, {"type": "success"})
    check_stream(events)
    usage = events[-1]["usage"]
    assert usage == [
        {
            "provider": "openai",
            "model": "other",
            "inputTokens": 11,
            "outputTokens": 7,
            "totalTokens": 18,
            "cachedInputTokens": 0,
        }
    ]


def test_final_repeat_is_used_when_no_delta_was_shown() -> None:
    translator = RunTranslator("t", "r")
    final = [f for f in frames("01-normal-text.sse.txt") if "assistantFinal" in json.dumps(f)]
    events = translator.map(inspect_frame(final[0]), 1)
    assert [e["type"] for e in events] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    assert events[1]["delta"] == "Hello from the fake LLM."


def test_raw_thinking_becomes_reasoning_closed_by_text() -> None:
    events, translator, _ = translate("32-thinking-raw.sse.txt")
    events += translator.finish(3, {"type": "success"})
    check_stream(events)
    types = [e["type"] for e in events]
    assert types[1:5] == [
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
    ]
    assert types.index("REASONING_END") < types.index("TEXT_MESSAGE_START")


def test_permission_wait_tool_trace_and_input() -> None:
    events, translator, infos = translate("02-permission.sse.txt")
    last = infos[-1]
    assert last.state == "input-required"
    [kernel_input] = last.inputs
    assert kernel_input["schemaVersion"] == 1 and isinstance(kernel_input["schemaVersion"], int)
    [start] = [e for e in events if e["type"] == "TOOL_CALL_START"]
    [args] = [e for e in events if e["type"] == "TOOL_CALL_ARGS"]
    assert start["toolCallName"] == "write_file" and start["parentMessageId"].endswith("-message")
    assert json.loads(args["delta"]) == {"content": "hello from fake llm\n", "path": "hello.txt"}
    interrupt = intr.build_interrupt(kernel_input, expires_at="2030-01-01T00:00:00Z", language="en")
    assert interrupt["id"] == kernel_input["inputId"] and interrupt["toolCallId"] == "call_fake_write_1"
    assert interrupt["reason"] == "tool_call" and interrupt["message"] == "Change a workspace file Allow once?"
    assert interrupt["metadata"]["title"] == "Change a workspace file"
    events += translator.finish(3, {"type": "interrupt", "interrupts": [interrupt]})
    check_stream(events)


def test_resumed_stream_reports_the_tool_result_and_artifact() -> None:
    events, translator, infos = translate("04-permission-allow.sse.txt", run_id="run-2")
    events += translator.finish(3, {"type": "success"})
    check_stream(events)
    [result] = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == "call_fake_write_1" and result["content"].startswith("Successfully wrote")
    [artifact] = [e for e in events if e["type"] == "CUSTOM"]
    assert artifact["name"] == "iac-code.artifact.v1" and artifact["value"]["artifactId"]
    assert artifact["value"]["metadata"]["byteSize"] == 20


def test_cancel_and_failure_texts_are_not_answers() -> None:
    events, translator, infos = translate("12-cancel-during-stream.sse.txt")
    assert infos[-1].state == "canceled"
    assert "Task canceled." not in json.dumps(events)
    events, translator, infos = translate("23-llm-http500.sse.txt")
    assert "failed" in [i.state for i in infos]
    assert translator.failure_detail and "500" in translator.failure_detail
    assert not [e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    events += translator.fail(3, "A2A_EXECUTION_FAILED", "failed")
    check_stream(events)


def test_error_frames_are_not_identities() -> None:
    raw = json.loads((DATA / "18-permission-wrong-inputid.response.txt").read_text())
    info = inspect_frame(raw)
    assert info.kind == "error" and info.task_id is None and info.error["code"] == -32602


def test_get_task_snapshot_is_a_task() -> None:
    info = inspect_frame(json.loads((DATA / "03-gettask-while-permission-pending.json").read_text()))
    assert info.kind == "task" and info.state == "input-required" and info.inputs


def test_ids_are_never_reused_within_a_run() -> None:
    translator = RunTranslator("t", "r")
    out: list[dict] = []
    translator.emit_text("m1", "a", 1, out)
    translator.emit_text("m2", "b", 1, out)  # closes m1 (non-parallel)
    translator.emit_text("m1", "c", 1, out)  # m1 again: a fresh id
    starts = [e["messageId"] for e in out if e["type"] == "TEXT_MESSAGE_START"]
    assert len(starts) == len(set(starts)) == 3


def test_shown_prefix_is_not_repeated_after_an_interrupt() -> None:
    first = RunTranslator("t", "r1")
    first.emit_text("m", "Deploying", 1, [])
    second = RunTranslator("t", "r2", id_namespace="x", prior_text_digests=first.text_digests())
    out: list[dict] = []
    second.emit_text("m", "Deploying... done", 1, out)
    assert [e["delta"] for e in out if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["... done"]
    assert out[0]["messageId"] == "m@x"


@pytest.mark.parametrize(
    "raw,expected", [("TASK_STATE_INPUT_REQUIRED", "input-required"), ("TASK_STATE_CANCELED", "canceled"), (None, None)]
)
def test_state_normalisation(raw: Any, expected: Any) -> None:
    assert normalize_state(raw) == expected


def test_numbers_are_normalised() -> None:
    assert normalize_numbers({"a": [1.0, 2.5, {"b": 3.0}], "c": True}) == {"a": [1, 2.5, {"b": 3}], "c": True}


def test_question_schema_accepts_options_or_free_text() -> None:
    import jsonschema

    kernel_input = {
        "kind": "ask_user_question",
        "inputId": "ask-1",
        "prompt": "Which?",
        "allowFreeText": True,
        "options": [{"id": "a", "label": "A"}, {"id": "a", "label": "A again"}, {"label": "no id"}],
    }
    interrupt = intr.build_interrupt(kernel_input, expires_at="2030-01-01T00:00:00Z", language="en")
    schema = interrupt["responseSchema"]
    ids = [o["id"] for o in interrupt["metadata"]["options"]]
    assert ids == ["a", "a-2", "2"]
    for ok in ({"selectedId": "a-2"}, {"freeText": "x"}):
        jsonschema.validate(ok, schema)
    for bad in ({}, {"selectedId": "zzz"}, {"freeText": ""}, {"selectedId": "a", "freeText": "x"}, {"other": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert intr.answer_text(kernel_input, {"selectedId": "a-2"}) == "A again"
    assert intr.answer_text(kernel_input, {"freeText": "hi"}) == "hi"


def test_pipeline_capture_maps_steps_text_tools_and_customs() -> None:
    from agui_adapter.run.pipeline_progress import PipelineProgress

    progress = PipelineProgress()
    first = RunTranslator("thread-p", "run-1", pipeline=progress)
    events: list[dict] = [{"type": "RUN_STARTED", "timestamp": 1, "threadId": "thread-p", "runId": "run-1"}]
    infos = []
    for frame in frames("34-pipeline-ask.sse.txt"):
        info = inspect_frame(frame)
        infos.append(info)
        events += first.map(info, 2)
    assert infos[-1].inputs and infos[-1].inputs[0]["kind"] == "ask_user_question"
    events += first.finish(
        3,
        {
            "type": "interrupt",
            "interrupts": [intr.build_interrupt(infos[-1].inputs[0], expires_at="2030-01-01T00:00:00Z", language="en")],
        },
    )
    check_stream(events)
    types = [e["type"] for e in events]
    assert "STEP_STARTED" in types and types.count("STEP_FINISHED") == 1  # closed for the interrupt only
    assert progress.open_steps == {"step:intent_parsing"} and progress.high_water == 9
    customs = [e["value"]["eventType"] for e in events if e["type"] == "CUSTOM"]
    assert customs == ["pipeline_started"]
    # the Resume run: the step is reopened, the answer stream continues it
    second = RunTranslator("thread-p", "run-2", id_namespace="r2", pipeline=progress)
    events = [{"type": "RUN_STARTED", "timestamp": 1, "threadId": "thread-p", "runId": "run-2"}]
    events += second.reopen_steps(2)
    for frame in frames("38-pipeline-answer.sse.txt"):
        events += second.map(inspect_frame(frame), 2)
    events += second.finish(3, {"type": "success"})
    check_stream(events)
    assert [e["stepName"] for e in events if e["type"] == "STEP_FINISHED"] == ["intent_parsing"]
    assert progress.open_steps == set()
    live = {e["value"]["sequence"] for e in events if e["type"] == "CUSTOM"}
    assert live == {21}  # 19 and 20 exist only in the journal; 22 is not a CUSTOM type
    journal = json.loads((DATA / "39-pipeline-state-all-events-after-completion.json").read_text())["events"]
    assert not progress.seen(19) and progress.seen(22) and progress.seen(18)
    recovered: list[dict] = []
    for envelope in journal:
        second.map_envelope(envelope, 4, recovered)
    # 19 is pipeline_completed pending the kernel's backup, the twin of 21 (delivered live):
    # handled, never sent; nothing delivered twice, nothing lost
    assert [e for e in recovered if e["type"] == "CUSTOM"] == []
    assert progress.high_water == 24


def envelope(sequence: int, kind: str, event_id: str, **extra: Any) -> dict[str, Any]:
    return {"eventType": kind, "sequence": sequence, "eventId": event_id, "pipelineRunId": "pr-1", **extra}


@pytest.mark.parametrize(
    "pending",
    [
        {"visibility": "pending_backup"},
        {"data": {"visibility": "pending_backup"}},
        {"data": {"backupPending": True}},
    ],
    ids=["visibility", "data-visibility", "backup-pending"],
)
def test_a_publication_pending_backup_is_never_sent(pending: dict[str, Any]) -> None:
    from agui_adapter.run.pipeline_progress import PipelineProgress, is_pending_publication

    progress = PipelineProgress(high_water=18)
    translator = RunTranslator("thread-p", "run-1", pipeline=progress)
    out: list[dict] = []
    twin = envelope(19, "pipeline_completed", "evt-pending", status="completed", **pending)
    assert is_pending_publication(twin)
    translator.map_envelope(twin, 2, out)
    assert out == [] and progress.seen(19)  # handled: the gap fill does not ask for it again
    translator.map_envelope(envelope(21, "pipeline_completed", "evt-committed", visibility="committed"), 2, out)
    translator.map_envelope(twin, 2, out)  # the journal again, after the committed one went live
    assert [(e["name"], e["value"]["eventId"]) for e in out] == [("iac-code.pipeline.v1", "evt-committed")]


def test_the_committed_twin_is_sent_once_live_then_gap_fill_in_any_order() -> None:
    from agui_adapter.run.pipeline_progress import PipelineProgress

    journal = [
        envelope(19, "pipeline_completed", "e19", visibility="pending_backup", data={"totalSteps": 5}),
        envelope(20, "pipeline_handoff_ready", "e20", visibility="pending_backup"),
        envelope(21, "pipeline_completed", "e21", visibility="committed", data={"totalSteps": 5}),
        envelope(22, "pipeline_handoff_ready", "e22", visibility="committed"),
        envelope(23, "backup_committed", "e23", data={"committedEventId": "e21"}),
        envelope(24, "backup_committed", "e24", data={"committedEventId": "e22"}),
    ]
    for live in ([journal[2]], [journal[3], journal[2]], []):
        progress = PipelineProgress(high_water=18)
        translator = RunTranslator("thread-p", "run-1", pipeline=progress)
        out: list[dict] = []
        for item in live:
            translator.map_envelope(item, 2, out)
        for item in journal:  # the gap fill: everything after the high water
            translator.map_envelope(item, 3, out)
        kinds = [(e["value"]["eventType"], e["value"]["sequence"]) for e in out if e["type"] == "CUSTOM"]
        assert kinds == [("pipeline_completed", 21)]
        assert progress.high_water == 24


def test_a_pending_publication_never_committed_leaves_only_backup_blocked() -> None:
    # the kernel's backup failed: no committed twin, a backup_blocked event instead; the kernel's
    # snapshot drops the pending terminal and waits for input, and so does the client's view
    from agui_adapter.run.pipeline_progress import PipelineProgress

    progress = PipelineProgress(high_water=18)
    translator = RunTranslator("thread-p", "run-1", pipeline=progress)
    out: list[dict] = []
    for item in (
        envelope(19, "pipeline_completed", "e19", visibility="pending_backup"),
        envelope(20, "pipeline_handoff_ready", "e20", visibility="pending_backup"),
        envelope(21, "backup_blocked", "e21", status="waiting_input", data={"reason": "terminal"}),
    ):
        translator.map_envelope(item, 2, out)
    assert [e["value"]["eventType"] for e in out if e["type"] == "CUSTOM"] == ["backup_blocked"]
    assert progress.high_water == 21


@pytest.mark.parametrize("fast", [True, False])
def test_frame_reader_with_and_without_the_speedups(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from agui_adapter.kernel_client import a2a

    if not fast:
        monkeypatch.setattr(a2a, "_decode_batch", json.loads)
    raw = (DATA / "02-permission.sse.txt").read_bytes()
    reader = a2a.FrameReader()
    frames = reader.feed(raw[:1000]) + reader.feed(raw[1000:]) + reader.close()
    assert frames == frames_from_stdlib(raw)
    # a malformed frame is reported as an error frame; its neighbours survive
    broken = b'data: {"result":{}}\n\ndata: {oops\n\ndata: {"result":{"x":1}}\n\n'
    assert a2a.FrameReader().feed(broken) == [
        {"result": {}},
        {"error": {"code": -32700, "message": "Malformed frame from the kernel."}},
        {"result": {"x": 1}},
    ]
    # so is one that is not UTF-8
    assert a2a.FrameReader().feed(b'data: {"a":"\xff"}\r\n\r\ndata: {"b":1}\r\n\r\n') == [
        {"error": {"code": -32700, "message": "Malformed frame from the kernel."}},
        {"b": 1},
    ]


def frames_from_stdlib(raw: bytes) -> list[Any]:
    decoder = SSEDecoder()
    return [json.loads(p) for p in decoder.feed(raw) + decoder.close()]


def test_deployment_confirmation_wait_without_an_input_becomes_an_interrupt() -> None:
    """The real kernel sends selling_solution_first's deployment_confirmation wait with only its
    pipeline envelope (tests/data/a2a-selling/15): the adapter builds the input from it, and the
    answer is the structured ``{"action": ...}`` the kernel resolves without its LLM."""
    import jsonschema

    capture = DATA.parent / "a2a-selling" / "15-ssf-write-allowed-to-deployment-confirmation.jsonl"
    infos = [inspect_frame(json.loads(line)) for line in capture.read_text(encoding="utf-8").splitlines()]
    waiting = [info for info in infos if info.inputs]
    assert [info.state for info in waiting] == ["input-required"]  # only the last frame, none while WORKING
    [kernel_input] = waiting[0].inputs
    envelope = waiting[0].iac["pipeline"]
    assert kernel_input["inputId"] == f"input-{envelope['eventId']}"
    assert (kernel_input["requestTaskId"], kernel_input["contextId"]) == (envelope["taskId"], envelope["contextId"])
    assert kernel_input["deploymentSummary"]["template"] == "templates/1-oss-static-site.yml"
    assert kernel_input["deploymentSummary"]["resources"][0]["name"] == "VPC"
    interrupt = intr.build_interrupt(kernel_input, expires_at="2030-01-01T00:00:00Z", language="en")
    assert (interrupt["reason"], interrupt["metadata"]["kind"]) == ("confirmation", "deployment_confirmation")
    assert [o["id"] for o in interrupt["metadata"]["options"]] == ["confirm", "reselect", "cancel"]
    assert interrupt["message"].startswith("Choose the next action\n- confirm: Confirm deployment")
    jsonschema.validate({"selectedId": "confirm"}, interrupt["responseSchema"])
    jsonschema.validate({"freeText": "deploy it"}, interrupt["responseSchema"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"selectedId": "adjust"}, interrupt["responseSchema"])
    assert intr.answer_text(kernel_input, {"selectedId": "confirm"}) == '{"action": "confirm"}'
    assert intr.answer_text(kernel_input, {"selectedId": "adjust"}) is None
    assert intr.answer_text(kernel_input, {"freeText": "deploy it"}) == "deploy it"
    # a frame without the wait (a WORKING frame of the same envelope kind) has no input
    assert intr.confirmation_input({"pipeline": dict(envelope, eventType="step_completed")}) is None
