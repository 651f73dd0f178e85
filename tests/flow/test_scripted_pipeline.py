"""Pipeline mode of the scripted kernel, driven through real sockets.

The shapes pinned here are the ones of the real kernel's pipeline captures
(pipeline run that fails, ask interrupt, state full/delta/lean, answer ->
completed + handoff, journal after completion); the captures themselves are
not read at test time.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.kernel_rpc import (
    a2a_headers,
    frames,
    iac,
    journal,
    kind,
    message,
    new_ctx,
    open_stream,
    pipeline_state,
    rpc,
    rpc_error,
    state,
    update,
)

TOKEN = "pipe-token"
HEADERS = a2a_headers(TOKEN)
URI = "urn:iac-code:a2a:pipeline-events:v1"
STEPS = ["intent_parsing", "architecture_planning", "evaluate_candidates", "confirm_and_select", "deploying"]
STEP_EVENTS = [
    "step_started",
    "context_usage",
    "message_started",
    "text_delta",
    "tool_started",
    "usage",
    "context_usage",
    "tool_result",
    "step_completed",
]
ENVELOPE_KEYS = {
    "schemaVersion",
    "extensionUri",
    "eventId",
    "sequence",
    "createdAt",
    "eventType",
    "scope",
    "status",
    "pipelineRunId",
    "pipelineName",
    "taskId",
    "contextId",
    "iacCodeSessionId",
    "data",
}
PERMISSION_NOT_ACTIVE = "permission_resume_invalid: pending permission is not active."
STATES = {
    "working": "TASK_STATE_WORKING",
    "input_required": "TASK_STATE_INPUT_REQUIRED",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
}


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def kernel() -> Iterator[ScriptedKernel]:
    with ScriptedKernel(TOKEN, delay_scale=0.02) as k:
        yield k


def envelopes(frame: dict[str, Any]) -> list[dict[str, Any]]:
    if kind(frame) != "statusUpdate":
        return []
    meta = iac(frame)
    out = list(meta.get("pipelineBatch", {}).get("events", []))
    if "pipeline" in meta:
        out.append(meta["pipeline"])
    return out


def live(all_frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for f in all_frames for e in envelopes(f)]


def types(envs: list[dict[str, Any]]) -> list[str]:
    return [e["eventType"] for e in envs]


def of_type(envs: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    return [e for e in envs if e["eventType"] == event_type]


def candidate_ids(got: list[dict[str, Any]]) -> list[str]:
    """The ids of the candidates a stream started (``evaluate_candidate_<hex8>``)."""
    return [e["candidate"]["id"] for e in of_type(live(got), "candidate_started")]


def start(kernel: ScriptedKernel, text: str, ctx: str | None = None, **iac_meta: Any) -> tuple[list[dict], str, str]:
    ctx = ctx or new_ctx("ctx-pipe-")
    iac_meta.setdefault("run_mode", "pipeline")
    got = frames(rpc(kernel, "SendStreamingMessage", message(text, context_id=ctx, **iac_meta), stream=True))
    assert kind(got[0]) == "task"
    return got, got[0]["result"]["task"]["id"], ctx


def answer(kernel: ScriptedKernel, ctx: str, task_id: str, text: str) -> list[dict[str, Any]]:
    params = message(text, context_id=ctx, task_id=task_id, run_mode="pipeline", pipeline_name="selling")
    return frames(rpc(kernel, "SendStreamingMessage", params, stream=True))


def get_task(kernel: ScriptedKernel, task_id: str) -> dict[str, Any]:
    return rpc(kernel, "GetTask", {"id": task_id}).json()["result"]


def permission_part(task_id: str, envelope: dict[str, Any], decision: str) -> list[dict[str, Any]]:
    data = {
        "schemaVersion": 1,
        "kind": "permission",
        "requestTaskId": task_id,
        "inputId": envelope["inputId"],
        "toolUseId": envelope["toolUseId"],
        "decision": decision,
    }
    return [{"data": data, "mediaType": "application/json"}]


# --------------------------------------------------------------------------- default pipeline


def test_default_pipeline_event_order_and_envelopes(kernel: ScriptedKernel) -> None:
    text = "I want a small website on Alibaba Cloud."
    got, task_id, ctx = start(kernel, text, cwd="/srv/workspaces/pipe", pipeline_name="selling")
    task = got[0]["result"]["task"]
    assert task["status"] == {"state": "TASK_STATE_SUBMITTED"}
    assert task["history"][0]["parts"] == [{"text": text}]
    # Every later frame is a statusUpdate carrying pipeline envelopes (no plain SUBMITTED/WORKING).
    session = None
    for frame in got[1:]:
        assert kind(frame) == "statusUpdate"
        envs = envelopes(frame)
        assert envs, frame
        assert "message" not in update(frame)["status"]
        assert state(frame) == STATES[envs[-1]["status"]]
        assert "iacCodeSessionId" not in iac(frame)  # only inside the envelope, as captured
        for env in envs:
            assert ENVELOPE_KEYS <= set(env), env
            assert env["schemaVersion"] == "1.0" and env["extensionUri"] == URI
            assert re.fullmatch(r"evt-[0-9a-f]{32}", env["eventId"])
            assert isinstance(env["sequence"], float)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", env["createdAt"])
            assert (env["pipelineRunId"], env["contextId"], env["taskId"]) == (ctx, ctx, task_id)
            assert env["pipelineName"] == "selling"
            session = session or env["iacCodeSessionId"]
            assert env["iacCodeSessionId"] == session
            if "step" in env:
                assert env["scope"] == "step"
                step = env["step"]
                assert step["runId"] == f"step-{step['id']}-1"
                assert isinstance(step["index"], float) and step["total"] == 5.0 and step["attempt"] == 1.0
    envs = live(got)
    assert len({e["eventId"] for e in envs}) == len(envs)
    first = envs[0]
    assert first["eventType"] == "pipeline_started" and first["scope"] == "pipeline" and first["sequence"] == 1.0
    assert first["data"] == {
        "totalSteps": 5.0,
        "stepNames": STEPS,
        "userRequest": text,
        "pipelineType": "selling",
    }
    for index, name in enumerate(STEPS, 1):
        step_envs = [e for e in envs if e.get("step", {}).get("id") == name]
        assert types(step_envs) == STEP_EVENTS, name
        assert step_envs[0]["step"]["index"] == float(index)
        assert step_envs[0]["step"]["type"] == "normal" and step_envs[0]["data"]["name"] == name
        assert step_envs[3]["data"] == {"text": f"Working on {name}."}
        assert step_envs[4]["data"]["toolName"] == "complete_step"
        assert step_envs[7]["data"]["isError"] is False
        assert step_envs[-1]["data"]["conclusionField"]
    # Bursts come as pipelineBatch.
    batches = [iac(f)["pipelineBatch"] for f in got[1:] if "pipelineBatch" in iac(f)]
    assert len(batches) == 5
    for batch in batches:
        assert batch["schemaVersion"] == "1.0" and batch["extensionUri"] == URI
        assert types(batch["events"]) == ["usage", "context_usage"]
    # The end: 19/20 only in the journal; live 21, 23, 22, 24 (capture 38's pattern).
    tail = [envelopes(f)[0] for f in got[-4:]]
    assert types(tail) == ["pipeline_completed", "backup_committed", "pipeline_handoff_ready", "backup_committed"]
    base = tail[0]["sequence"]
    assert [e["sequence"] for e in tail] == [base, base + 2, base + 1, base + 3]
    assert [state(f) for f in got[-4:]] == ["TASK_STATE_COMPLETED"] * 4
    # no earlyExit in a completed pipeline's data (tests/data/a2a-selling/02, 11)
    assert tail[0]["data"] == {"totalSteps": 5.0} and tail[0]["visibility"] == "committed"
    assert tail[1]["data"] == {
        "committedEventId": tail[0]["eventId"],
        "committedEventType": "pipeline_completed",
        "committedSequence": base,
    }
    handoff = tail[2]["data"]
    assert (handoff["action"], handoff["targetMode"], handoff["outcome"]) == ("switch_to_normal", "normal", "completed")
    assert handoff["summary"].startswith("[Pipeline Handoff Context]")
    assert tail[3]["data"]["committedEventId"] == tail[2]["eventId"]
    sequences = {e["sequence"] for e in envs}
    assert base - 1 not in sequences and base - 2 not in sequences
    assert get_task(kernel, task_id)["status"]["state"] == "TASK_STATE_COMPLETED"


def test_journal_is_live_plus_journal_only_and_after_sequence_filters(kernel: ScriptedKernel) -> None:
    got, task_id, ctx = start(kernel, "journal please")
    envs = live(got)
    full = pipeline_state(kernel, taskId=task_id, afterSequence=0, includeSnapshot="false").json()
    assert set(full) == {"fromSequence", "lastSequence", "events"}
    events = full["events"]
    sequences = [e["sequence"] for e in events]
    assert all(isinstance(s, int) for s in sequences)
    assert sequences == list(range(1, len(events) + 1))
    assert full["fromSequence"] == 0 and full["lastSequence"] == sequences[-1]
    by_id = {e["eventId"]: e for e in events}
    live_ids = {e["eventId"] for e in envs}
    journal_only = [e for e in events if e["eventId"] not in live_ids]
    assert live_ids <= set(by_id)
    assert [(e["eventType"], e["visibility"]) for e in journal_only] == [
        ("pipeline_completed", "pending_backup"),
        ("pipeline_handoff_ready", "pending_backup"),
    ]
    for env in envs:  # the same envelope, numbers aside (floats live, integers in the journal)
        assert by_id[env["eventId"]] == env
    # afterSequence filters; alone it also returns the snapshot.
    middle = sequences[len(sequences) // 2]
    delta = pipeline_state(kernel, taskId=task_id, afterSequence=middle, includeSnapshot="false").json()
    assert delta["fromSequence"] == middle and delta["lastSequence"] == sequences[-1]
    assert [e["sequence"] for e in delta["events"]] == [s for s in sequences if s > middle]
    both = pipeline_state(kernel, taskId=task_id, afterSequence=middle).json()
    assert both["snapshot"]["taskId"] == task_id
    assert [e["sequence"] for e in both["events"]] == [s for s in sequences if s > middle]
    plain = pipeline_state(kernel, contextId=ctx).json()
    assert plain["events"] == [] and plain["snapshot"]["taskId"] == task_id
    assert "toolResults" in plain["snapshot"]["display"]
    lean = pipeline_state(kernel, taskId=task_id, lean=1).json()
    assert "toolResults" not in lean["snapshot"]["display"]
    assert lean["snapshot"]["steps"] == plain["snapshot"]["steps"]
    # Errors.
    missing = pipeline_state(kernel)
    assert missing.status_code == 400
    for bad_after in ("x", "-1", "2.5", "nan"):
        bad = pipeline_state(kernel, taskId=task_id, afterSequence=bad_after)
        assert bad.status_code == 400, bad_after
        assert bad.json() == {"error": "afterSequence must be a non-negative integer."}
    unknown = pipeline_state(kernel, taskId=str(uuid.uuid4()))
    assert (unknown.status_code, unknown.json()) == (404, {"error": "A2A pipeline state not found"})
    mismatch = pipeline_state(kernel, taskId=task_id, contextId=new_ctx("ctx-pipe-"))
    assert mismatch.status_code == 404


def test_snapshot_shape_after_completion(kernel: ScriptedKernel) -> None:
    got, task_id, ctx = start(kernel, "snapshot please")
    body = pipeline_state(kernel, taskId=task_id).json()
    assert body["events"] == []
    snap = body["snapshot"]
    assert {
        "schemaVersion",
        "snapshotVersion",
        "pipelineRunId",
        "pipelineName",
        "taskId",
        "contextId",
        "status",
        "lastSequence",
        "steps",
        "pendingInput",
        "stacks",
        "display",
        "control",
        "cleanup",
        "normalHandoff",
        "pendingNormalHandoff",
        "pendingTerminal",
        "generatedAt",
    } <= set(snap)
    assert (snap["pipelineRunId"], snap["contextId"], snap["taskId"]) == (ctx, ctx, task_id)
    assert snap["status"] == "completed" and snap["pendingInput"] is None
    assert snap["lastSequence"] == journal(kernel, task_id)[-1]["sequence"]
    assert [s["id"] for s in snap["steps"]] == STEPS
    for step in snap["steps"]:
        assert step["status"] == "completed" and step["conclusionField"] and step["completedAt"]
    assert [m["text"] for m in snap["display"]["messages"]] == [f"Working on {name}." for name in STEPS]
    assert len(snap["display"]["toolResults"]) == 5
    assert snap["control"]["stepNames"] == STEPS and snap["control"]["userRequest"] == "snapshot please"
    assert snap["normalHandoff"]["outcome"] == "completed"
    assert snap["normalHandoff"]["visibility"] == "committed"
    assert snap["pendingNormalHandoff"] is None


def test_handoff_then_normal_turn_in_same_context(kernel: ScriptedKernel) -> None:
    got, task_id, ctx = start(kernel, "hand me off")
    session = live(got)[0]["iacCodeSessionId"]
    normal = frames(rpc(kernel, "SendStreamingMessage", message("[RECALL] hello again", context_id=ctx), stream=True))
    assert kind(normal[0]) == "task" and normal[0]["result"]["task"]["id"] != task_id
    assert [state(f) for f in normal[1:3]] == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"]
    assert all("pipeline" not in iac(f) and "pipelineBatch" not in iac(f) for f in normal[1:])
    assert state(normal[-1]) == "TASK_STATE_INPUT_REQUIRED" and "input" not in iac(normal[-1])
    assert iac(normal[-1])["iacCodeSessionId"] == session
    final = "".join(p["text"] for p in update(normal[-2])["status"]["message"]["parts"])
    assert final == "This context has seen 2 user turns."
    # The finished pipeline task is terminal.
    error = rpc_error(rpc(kernel, "SendStreamingMessage", message("more", context_id=ctx, task_id=task_id)))
    assert error["code"] == -32602 and "terminal state" in error["message"]
    # A second pipeline in the same context (same pipelineRunId) continues the sequence.
    last = journal(kernel, task_id)[-1]["sequence"]
    again, second_id, _ = start(kernel, "once more", ctx=ctx)
    first = live(again)[0]
    assert first["eventType"] == "pipeline_started" and first["sequence"] == float(last + 1)
    assert first["pipelineRunId"] == ctx and first["iacCodeSessionId"] == session
    assert pipeline_state(kernel, contextId=ctx).json()["snapshot"]["taskId"] == second_id
    assert journal(kernel, second_id)[0]["sequence"] == last + 1


def test_pipeline_names(kernel: ScriptedKernel) -> None:
    error = rpc_error(rpc(kernel, "SendStreamingMessage", message("x", run_mode="pipeline", pipeline_name="nope")))
    assert error["code"] == -32602
    got, _, _ = start(kernel, "solution first", pipeline_name="selling_solution_first")
    first = live(got)[0]
    assert first["pipelineName"] == "selling_solution_first"
    assert first["data"]["pipelineType"] == "selling_solution_first"
    got, _, _ = start(kernel, "default", pipeline_name="")
    assert live(got)[0]["pipelineName"] == "selling"


# --------------------------------------------------------------------------- [PIPE-ASK]


@pytest.mark.parametrize(
    ("reply", "selected_id", "selected_label", "free_text"),
    [
        ("cn-hangzhou", "hz", "cn-hangzhou", ""),
        ("sh", "sh", "cn-shanghai", ""),
        ("somewhere in Europe", None, None, "somewhere in Europe"),
    ],
)
def test_pipe_ask_wait_and_answer(
    kernel: ScriptedKernel, reply: str, selected_id: str | None, selected_label: str | None, free_text: str
) -> None:
    text = "[PIPE-ASK] I want a small website on Alibaba Cloud."
    got, task_id, ctx = start(kernel, text)
    envs = live(got)
    assert types(envs) == [
        "pipeline_started",
        "step_started",
        "context_usage",
        "message_started",
        "text_delta",
        "tool_started",
        "usage",
        "context_usage",
        "input_required",
    ]
    tool = envs[5]["data"]
    assert tool["toolName"] == "ask_user_question"
    last = got[-1]
    assert state(last) == "TASK_STATE_INPUT_REQUIRED"
    wait = iac(last)["pipeline"]
    assert (wait["eventType"], wait["status"], wait["scope"]) == ("input_required", "input_required", "step")
    options = [{"id": "hz", "label": "cn-hangzhou"}, {"id": "sh", "label": "cn-shanghai"}]
    tool_use_id = tool["toolUseId"]
    expected = {
        "schemaVersion": 1.0,
        "kind": "ask_user_question",
        "required": True,
        "requestTaskId": task_id,
        "contextId": ctx,
        "inputId": f"ask-{tool_use_id}",
        "toolUseId": tool_use_id,
        "prompt": "Which region should host the site?",
        "allowFreeText": True,
        "options": options,
    }
    assert iac(last)["input"] == expected
    assert wait["data"]["inputId"] == expected["inputId"] and wait["data"]["options"] == options
    assert wait["input"]["required"] is True
    # The wait is visible to GetTask and to the state endpoint.
    task = get_task(kernel, task_id)
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert task["metadata"]["iac_code"]["input"] == expected
    snap = pipeline_state(kernel, taskId=task_id).json()["snapshot"]
    assert snap["status"] == "waiting_input" and snap["pendingInput"]["inputId"] == expected["inputId"]
    assert snap["steps"][0]["status"] == "waiting_input"
    # A permission answer to a question is rejected like capture 18.
    wrong = permission_part(task_id, {"inputId": "permission-" + "0" * 32, "toolUseId": tool_use_id}, "allow_once")
    error = rpc_error(rpc(kernel, "SendStreamingMessage", message(context_id=ctx, task_id=task_id, parts=wrong)))
    assert (error["code"], error["message"]) == (-32602, PERMISSION_NOT_ACTIVE)
    # The answer: no task frame, input_received first, then the pipeline runs to its end.
    after = answer(kernel, ctx, task_id, reply)
    assert kind(after[0]) == "statusUpdate"
    received = envelopes(after[0])[0]
    assert received["eventType"] == "input_received" and state(after[0]) == "TASK_STATE_WORKING"
    data = received["data"]
    assert (data["kind"], data["inputId"], data["toolUseId"]) == ("ask_user_question", expected["inputId"], tool_use_id)
    assert (data["selectedId"], data["selectedLabel"], data["freeText"]) == (selected_id, selected_label, free_text)
    assert data["answerTextLength"] == float(len(reply))
    rest = live(after)
    intent = [e for e in rest if e.get("step", {}).get("id") == "intent_parsing"]
    assert types(intent)[-1] == "step_completed"
    assert intent[-1]["data"]["conclusion"]["clarification_choice"] == (selected_id or reply)
    assert state(after[-1]) == "TASK_STATE_COMPLETED"
    assert rest[0]["sequence"] == wait["sequence"] + 1


# --------------------------------------------------------------------------- [PIPE-CANDIDATES]


@pytest.mark.parametrize(("rich", "decision"), [(True, "allow_once"), (False, "deny")])
def test_pipe_candidates_selection_and_deployment(kernel: ScriptedKernel, rich: bool, decision: str) -> None:
    extra = {"candidatePresentation": "rich-v1"} if rich else {}
    got, task_id, ctx = start(kernel, "[PIPE-CANDIDATES] compare plans", **extra)
    envs = live(got)
    started = of_type(envs, "candidate_started")
    # as the real kernel (tests/data/a2a-selling/01): sub-pipeline ids, 0-based indexes, the
    # candidate's steps listed in candidate_started, template_generating then cost_estimating
    ids = [e["candidate"]["id"] for e in started]
    assert len(ids) == 2 and all(re.fullmatch(r"evaluate_candidate_[0-9a-f]{8}", cid) for cid in ids)
    for index, env in enumerate(started):
        assert env["scope"] == "candidate" and env["step"]["id"] == "evaluate_candidates"
        cid = env["candidate"]["id"]
        assert env["data"] == {
            "candidateName": ["Plan A", "Plan B"][index],
            "subPipelineId": cid,
            "totalSteps": 2,
            "candidateIndex": index,
            "subPipelineName": "evaluate_candidate",
        }
        run_id = f"candidate-{cid}-{index}-1"
        assert {k: v for k, v in env["candidate"].items() if k != "steps"} == {
            "name": ["Plan A", "Plan B"][index],
            "id": cid,
            "runId": run_id,
            "totalSteps": 2,
            "pipelineName": "evaluate_candidate",
            "index": index,
            "attempt": 1,
        }
        assert [(s["id"], s["runId"], s["status"]) for s in env["candidate"]["steps"]] == [
            (name, f"{run_id}-{name}-1", "pending") for name in ("template_generating", "cost_estimating")
        ]
    # inside a candidate's step the real kernel's scope is "candidate_step" (tests/data/a2a-selling/01)
    deltas = [e for e in of_type(envs, "text_delta") if e["scope"] == "candidate_step"]
    assert [e["candidate"]["id"] for e in deltas] == ids + ids
    assert [e["candidateStep"]["id"] for e in deltas] == ["template_generating"] * 2 + ["cost_estimating"] * 2
    for env in deltas:
        assert env["candidateStep"]["runId"] == f"{env['candidate']['runId']}-{env['candidateStep']['id']}-1"
        assert "steps" not in env["candidate"]
    for event_type in ("candidate_step_started", "candidate_step_completed"):
        assert [e["candidate"]["id"] for e in of_type(envs, event_type)] == ids + ids
    assert [e["candidate"]["id"] for e in of_type(envs, "candidate_completed")] == ids
    # each template step's conclusion is published as an artifact: the artifactUpdate frame, then
    # artifact_created (tests/data/a2a-selling/01)
    artifacts = [f["result"]["artifactUpdate"]["artifact"] for f in got if kind(f) == "artifactUpdate"]
    assert [a["name"] for a in artifacts] == ["1-plan-a.yml", "2-plan-b.yml"]
    created = of_type(envs, "artifact_created")
    assert [e["data"]["artifactId"] for e in created] == [a["artifactId"] for a in artifacts]
    assert all(e["scope"] == "candidate_step" and e["candidateStep"]["id"] == "template_generating" for e in created)
    for frame_index, frame in enumerate(got):
        if kind(frame) == "artifactUpdate":
            assert envelopes(got[frame_index + 1])[0]["eventType"] == "artifact_created"
    completed = of_type(envs, "candidate_completed")[1]["data"]
    assert set(completed["conclusions"]) == {"template", "cost"}
    assert set(completed["step_conclusions"]) == {"template_generating", "cost_estimating"}
    evaluated = [e for e in of_type(envs, "step_completed") if e["step"]["id"] == "evaluate_candidates"]
    assert evaluated[0]["data"]["candidatesCount"] == 2 and len(evaluated[0]["data"]["conclusion"]) == 2
    # the parallel step has no LLM turn of its own (no complete_step outside the candidates)
    own = [e for e in of_type(envs, "tool_started") if e["scope"] == "step"]
    assert "evaluate_candidates" not in [e["step"]["id"] for e in own]
    assert any(
        "pipelineBatch" in iac(f) and {e["scope"] for e in iac(f)["pipelineBatch"]["events"]} == {"candidate_step"}
        for f in got[1:]
    )
    # confirm_and_select waits for a candidate_selection.
    wait = iac(got[-1])["input"]
    assert state(got[-1]) == "TASK_STATE_INPUT_REQUIRED"
    # as the real kernel (tests/data/a2a-selling/01): no tool call, no free-text flag, index ids
    assert wait["kind"] == "candidate_selection" and "allowFreeText" not in wait and "toolUseId" not in wait
    assert re.fullmatch(r"input-evt-[0-9a-f]{32}", wait["inputId"])
    assert [o["id"] for o in wait["options"]] == ["0", "1"]
    assert [o["label"] for o in wait["options"]] == ["Plan A", "Plan B"]
    if rich:
        for option in wait["options"]:
            assert {"summary", "architectureDiagram", "totalMonthlyCost", "costItems"} <= set(option)
            assert all(set(item) == {"name", "monthlyCost"} for item in option["costItems"])
    else:
        assert all(set(option) == {"id", "label"} for option in wait["options"])
    error = rpc_error(rpc(kernel, "SendStreamingMessage", message("Plan Z", context_id=ctx, task_id=task_id)))
    assert error["code"] == -32602
    # the wait comes after confirm_and_select completed with the LLM's options (tests/data/a2a-selling/01)
    selecting = [e for e in envs if e.get("step", {}).get("id") == "confirm_and_select"]
    assert types(selecting)[0] == "step_started" and selecting[0]["step"]["uiMode"] == "candidate_selection"
    assert types(selecting)[-2:] == ["step_completed", "input_required"]
    offered = selecting[-2]["data"]["conclusion"]["options"]
    assert [o["candidate_index"] for o in offered] == [0, 1] and selecting[-1]["data"]["options"] == offered
    assert "input" not in selecting[-1] and wait["inputId"] == "input-" + selecting[-1]["eventId"]
    picked = answer(kernel, ctx, task_id, "Plan B")
    picked_envs = live(picked)
    assert picked_envs[0]["eventType"] == "input_received"
    received = picked_envs[0]["data"]
    assert received["kind"] == "candidate_selection"
    assert (received["selectedIndex"], received["selectedValue"]) == (1, "Plan B")
    assert received["selectedOption"] == offered[1]
    # no candidate_selected (the real kernel has none): the step's LLM turn concludes the choice
    assert "candidate_selected" not in types(picked_envs)
    again = [e for e in picked_envs if e.get("step", {}).get("id") == "confirm_and_select"]
    assert types(again)[-1] == "step_completed" and "step_started" not in types(again)
    assert again[-1]["data"]["conclusion"]["selected_candidate_index"] == 1
    # deploying asks for ros_deploy's permission, as the real kernel (tests/data/a2a-selling/10, 11):
    # INPUT_REQUIRED with permission_requested and the input, then backup_committed without it
    assert [state(f) for f in picked[-2:]] == ["TASK_STATE_INPUT_REQUIRED"] * 2
    wait = iac(picked[-2])["input"]
    requested, backup = iac(picked[-2])["pipeline"], iac(picked[-1])["pipeline"]
    assert "input" not in iac(picked[-1]) and "permission" not in iac(picked[-2])
    assert (requested["eventType"], requested["status"], requested["visibility"]) == (
        "permission_requested",
        "input_required",
        "committed",
    )
    assert requested["data"] == {"toolName": "ros_deploy", "toolUseId": wait["toolUseId"]}
    assert requested["permission"]["permissionId"] == "perm-" + wait["toolUseId"]
    assert backup["eventType"] == "backup_committed" and backup["data"]["committedEventId"] == requested["eventId"]
    assert backup["sequence"] == requested["sequence"] + 1
    hidden = [e for e in journal(kernel, task_id) if e["sequence"] == requested["sequence"] - 1]
    assert [(e["eventType"], e["visibility"]) for e in hidden] == [("permission_requested", "pending_backup")]
    assert (wait["kind"], wait["toolName"], wait["effect"], wait["scope"]) == (
        "permission",
        "ros_deploy",
        "cloud_change",
        "step",
    )
    assert wait["deploymentSummary"]["candidateName"] == "Plan B"
    assert wait["operation"]["apiCalls"] == [{"effect": "change", "product": "ROS", "action": "CreateStack"}]
    assert get_task(kernel, task_id)["metadata"]["iac_code"]["input"] == wait
    done = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, wait, decision)),
            stream=True,
        )
    )
    assert "pipeline" not in iac(done[0])
    assert iac(done[0])["inputReceived"] == {
        "toolUseId": wait["toolUseId"],
        "kind": "permission",
        "inputId": wait["inputId"],
    }
    done_envs = live(done)
    assert done_envs[0]["eventType"] == "permission_resolved" and done_envs[0]["data"]["decision"] == decision
    [result] = [e for e in of_type(done_envs, "tool_result") if e["data"]["toolName"] == "ros_deploy"]
    assert result["data"]["isError"] is (decision == "deny")
    deployed = [e for e in of_type(done_envs, "step_completed") if e["step"]["id"] == "deploying"]
    assert deployed[0]["data"]["conclusion"]["status"] == ("success" if decision == "allow_once" else "failed")
    assert state(done[-1]) == "TASK_STATE_COMPLETED"
    assert of_type(done_envs, "pipeline_completed")[0]["data"] == {"totalSteps": 5.0}
    assert "permission" not in done_envs[0]  # a step's permission_resolved has no permission object
    snap = pipeline_state(kernel, taskId=task_id).json()["snapshot"]
    step = next(s for s in snap["steps"] if s["id"] == "evaluate_candidates")
    assert [(c["id"], c["name"], c["status"]) for c in step["candidates"]] == [
        (ids[0], "Plan A", "completed"),
        (ids[1], "Plan B", "completed"),
    ]
    assert next(s for s in snap["steps"] if s["id"] == "confirm_and_select")["inputReceived"]["selectedIndex"] == 1


def _solution_first_to_confirmation(kernel: ScriptedKernel) -> tuple[str, str, list[dict[str, Any]]]:
    """A selling_solution_first pipeline up to its deployment confirmation: (task id, context, frames)."""
    got, task_id, ctx = start(kernel, "[PIPE-CANDIDATES] compare plans", pipeline_name="selling_solution_first")
    first = live(got)
    steps = ["solution_planning_and_selection", "materialize_selected_candidate", "deploying"]
    assert first[0]["data"]["stepNames"] == steps and first[0]["data"]["totalSteps"] == 3
    started = of_type(first, "step_started")
    assert [(e["step"]["id"], e["step"]["total"], e["data"]["uiMode"]) for e in started] == [
        (steps[0], 3, "candidate_selection")
    ]
    selection = iac(got[-1])["input"]
    assert selection["kind"] == "candidate_selection"
    assert selection["prompt"] == "Choose the solution to implement and deploy"
    assert [(o["id"], o["label"]) for o in selection["options"]] == [("0", "Plan A"), ("1", "Plan B")]
    assert of_type(first, "step_completed")[0]["data"]["conclusion"]["status"] == "awaiting_selection"
    picked = answer(kernel, ctx, task_id, "Plan B")
    picked_envs = live(picked)
    assert types(picked_envs)[:3] == ["input_received", "step_completed", "step_started"]
    assert picked_envs[1]["data"]["conclusion"]["selected_candidate_index"] == 1
    assert picked_envs[2]["step"]["id"] == steps[1] and picked_envs[2]["data"]["uiMode"] == "deployment_confirmation"
    return task_id, ctx, picked


def test_pipe_candidates_solution_first_confirmation_wire(kernel: ScriptedKernel) -> None:
    # as the real kernel (tests/data/a2a-selling/15, 21): step 2 completes awaiting_confirmation, then
    # an INPUT_REQUIRED frame with only the input_required envelope: no tool call, no iac_code.input,
    # and the stored task does not list the wait either
    task_id, ctx, picked = _solution_first_to_confirmation(kernel)
    envs = live(picked)
    assert "tool_started" not in [e["eventType"] for e in envs if e["data"].get("toolName") != "complete_step"]
    assert of_type(envs, "step_completed")[-1]["data"]["conclusion"]["status"] == "awaiting_confirmation"
    assert state(picked[-1]) == "TASK_STATE_INPUT_REQUIRED" and set(iac(picked[-1])) == {"pipeline"}
    wait = iac(picked[-1])["pipeline"]
    assert (wait["eventType"], wait["status"], wait["step"]["id"]) == (
        "input_required",
        "input_required",
        "materialize_selected_candidate",
    )
    assert wait["data"]["kind"] == "deployment_confirmation" and wait["data"]["prompt"] == "Choose the next action"
    assert [o["action"] for o in wait["data"]["options"]] == ["confirm", "reselect", "cancel"]
    assert "input" not in get_task(kernel, task_id)["metadata"]["iac_code"]
    # the option's label is natural language, which the real kernel hands to its LLM: not scripted
    error = rpc_error(
        rpc(kernel, "SendStreamingMessage", message("Confirm deployment", context_id=ctx, task_id=task_id))
    )
    assert error["code"] == -32602


@pytest.mark.parametrize("decision", ['{"action": "confirm"}', "3"])
def test_pipe_candidates_solution_first_confirms_the_deployment(kernel: ScriptedKernel, decision: str) -> None:
    task_id, ctx, _ = _solution_first_to_confirmation(kernel)
    done = answer(kernel, ctx, task_id, decision)
    done_envs = live(done)
    action = "confirm" if decision.startswith("{") else "cancel"  # "3": the third option, as 1-based number
    assert done_envs[0]["eventType"] == "input_received"
    assert done_envs[0]["data"] == {
        "userInputLength": float(len(json.dumps({"action": action}))),
        "kind": "deployment_confirmation",
        "selectedValue": json.dumps({"action": action}),
        "action": action,
        "parameter_overrides": {},
        "structured": True,
    }
    # the kernel resolves the structured answer itself: the step completes at once, no LLM turn
    resolved = done_envs[1]
    assert resolved["eventType"] == "step_completed" and resolved["step"]["id"] == "materialize_selected_candidate"
    if action == "cancel":
        assert resolved["data"]["conclusion"]["status"] == "cancelled"
        assert state(done[-1]) == "TASK_STATE_COMPLETED"
        assert "deploying" not in [e["step"]["id"] for e in of_type(done_envs, "step_started")]
        completed = of_type(done_envs, "pipeline_completed")[0]["data"]
        handoff = of_type(done_envs, "pipeline_handoff_ready")[0]["data"]
        assert completed == {"totalSteps": 3.0, "earlyExit": True} and handoff["outcome"] == "early_exit"
        return
    assert resolved["data"]["conclusion"]["status"] == "confirmed"
    # confirmed: deploying asks for ros_deploy's permission, as the real one does (capture 16)
    assert state(done[-1]) == "TASK_STATE_INPUT_REQUIRED"
    assert [e["step"]["id"] for e in of_type(done_envs, "step_started")] == ["deploying"]
    wait = iac(done[-2])["input"]
    assert (wait["kind"], wait["toolName"]) == ("permission", "ros_deploy")
    last = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, wait, "allow_once")),
            stream=True,
        )
    )
    assert state(last[-1]) == "TASK_STATE_COMPLETED"
    assert of_type(live(last), "pipeline_completed")[0]["data"] == {"totalSteps": 3.0}


def test_pipe_candidates_solution_first_reselect_rolls_back(kernel: ScriptedKernel) -> None:
    # as the real kernel (tests/data/a2a-selling/20): reselect_requested, a pipeline-scoped
    # rollback_completed naming step 1's next attempt, and step 1 again up to a new selection
    task_id, ctx, _ = _solution_first_to_confirmation(kernel)
    again = answer(kernel, ctx, task_id, '{"action": "reselect"}')
    envs = live(again)
    assert types(envs)[:4] == ["input_received", "step_completed", "rollback_completed", "step_started"]
    assert envs[1]["data"]["conclusion"]["status"] == "reselect_requested"
    rollback = envs[2]
    assert rollback["scope"] == "pipeline" and rollback["step"]["runId"] == "step-solution_planning_and_selection-2"
    assert rollback["data"] == {
        "fromStep": "materialize_selected_candidate",
        "reason": '{"action": "reselect"}',
        "toStep": "solution_planning_and_selection",
        "staleFields": ["selected_plan"],
    }
    assert (envs[3]["step"]["id"], envs[3]["step"]["attempt"]) == ("solution_planning_and_selection", 2.0)
    assert iac(again[-1])["input"]["kind"] == "candidate_selection"
    picked = answer(kernel, ctx, task_id, "Plan A")
    assert [(e["step"]["id"], e["step"]["attempt"]) for e in of_type(live(picked), "step_started")] == [
        ("materialize_selected_candidate", 2.0)
    ]


# --------------------------------------------------------------------------- [PIPE-PERMS]


def _perm_wait(kernel: ScriptedKernel, workspace: str) -> tuple[Any, list[dict[str, Any]], str, str, list[dict]]:
    """A [PIPE-PERMS] pipeline read until both candidates wait for their write_file permission.

    As the real kernel (tests/data/a2a-selling/05, 08): each ``permission_requested`` comes in a
    WORKING frame of its own with ``iac_code.input``, and the stream stays open.
    """
    ctx = new_ctx("ctx-pipe-")
    params = message("[PIPE-PERMS] price the plans", context_id=ctx, cwd=workspace, run_mode="pipeline")
    stream = open_stream(rpc(kernel, "SendStreamingMessage", params, stream=True))
    got: list[dict[str, Any]] = [next(stream)]
    task_id = got[0]["result"]["task"]["id"]
    asked: list[dict[str, Any]] = []
    while len(asked) < 2:
        frame = next(stream)
        got.append(frame)
        if "permission_requested" in types(envelopes(frame)):
            asked.append(frame)
    assert all(state(f) == "TASK_STATE_WORKING" for f in got[1:])
    pending = [iac(f)["input"] for f in asked]
    for frame, wait, cid in zip(asked, pending, candidate_ids(got), strict=True):
        assert set(iac(frame)) == {"pipeline", "input"}  # no permission, no pendingPermissions
        requested = iac(frame)["pipeline"]
        assert requested["status"] == "working" and requested["scope"] == "candidate_step"
        assert requested["candidate"]["id"] == cid and requested["candidateStep"]["id"] == "template_generating"
        assert requested["data"] == {"toolName": "write_file", "toolUseId": wait["toolUseId"]}
        assert requested["permission"]["inputId"] == requested["permission"]["permissionId"] == wait["inputId"]
        assert requested["permission"]["pending"] is True
        assert (wait["kind"], wait["scope"], wait["subPipelineId"]) == ("permission", "candidate_step", cid)
    return stream, got, task_id, ctx, pending


def test_pipe_perms_wait_in_working_and_take_unary_answers(kernel: ScriptedKernel, tmp_path: Any) -> None:
    stream, got, task_id, ctx, pending = _perm_wait(kernel, str(tmp_path))
    c1, c2 = candidate_ids(got)
    for env in pending:
        assert {
            "schemaVersion",
            "kind",
            "required",
            "language",
            "requestTaskId",
            "contextId",
            "inputId",
            "toolUseId",
            "toolName",
            "title",
            "purpose",
            "effect",
            "target",
            "isReadOnly",
            "prompt",
            "safeSummary",
            "options",
            "scope",
            "subPipelineId",
        } == set(env)
        assert (env["requestTaskId"], env["contextId"], env["schemaVersion"]) == (task_id, ctx, 1.0)
        assert (env["toolName"], env["effect"]) == ("write_file", "file_change")
        assert re.fullmatch(r"permission-[0-9a-f]{32}", env["inputId"])
        assert [o["id"] for o in env["options"]] == ["allow_once", "deny"]
    # the stored task stays WORKING and lists the waits (the real task store's pendingPermissions)
    task = get_task(kernel, task_id)
    assert task["status"]["state"] == "TASK_STATE_WORKING"
    assert task["metadata"]["iac_code"]["pendingPermissions"] == pending
    assert "input" not in task["metadata"]["iac_code"]
    # Unknown inputId: capture 18.
    bogus = dict(pending[0], inputId="permission-" + "0" * 32)
    error = rpc_error(
        rpc(
            kernel,
            "SendMessage",
            message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, bogus, "deny")),
        )
    )
    assert (error["code"], error["message"]) == (-32602, PERMISSION_NOT_ACTIVE)
    # First answer (the second wait): the unary call returns a permission_ack agent Message
    # (tests/data/a2a-selling/08), the other wait remains.
    ack = rpc(
        kernel,
        "SendMessage",
        message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, pending[1], "allow_once")),
    ).json()["result"]["message"]
    assert (ack["role"], ack["taskId"], ack["contextId"]) == ("ROLE_AGENT", task_id, ctx)
    assert re.fullmatch(r"permission-ack-[0-9a-f]{32}", ack["messageId"])
    assert ack["parts"] == [
        {
            "data": {
                "kind": "permission_ack",
                "decision": "allow_once",
                "schemaVersion": 1.0,
                "inputId": pending[1]["inputId"],
                "accepted": True,
                "toolUseId": pending[1]["toolUseId"],
            },
            "mediaType": "application/json",
        }
    ]
    first = get_task(kernel, task_id)
    assert first["status"]["state"] == "TASK_STATE_WORKING"
    assert first["metadata"]["iac_code"]["pendingPermissions"] == [pending[0]]
    second_ack = rpc(
        kernel,
        "SendMessage",
        message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, pending[0], "deny")),
    ).json()["result"]["message"]
    assert second_ack["parts"][0]["data"]["decision"] == "deny"
    # the pipeline's own stream goes on: permission_resolved for each answer, the writes, the end
    rest = list(stream)
    assert rest and all(kind(f) in ("statusUpdate", "artifactUpdate") for f in rest)
    assert state(rest[-1]) == "TASK_STATE_COMPLETED"
    envs = live(rest)
    resolved = of_type(envs, "permission_resolved")
    assert [(e["candidate"]["id"], e["data"]["decision"]) for e in resolved] == [(c2, "allow_once"), (c1, "deny")]
    assert resolved[0]["data"] == {
        "kind": "permission",
        "decision": "allow_once",
        "pending": False,
        "toolName": "write_file",
        "inputId": pending[1]["inputId"],
        "permissionId": pending[1]["inputId"],
        "toolUseId": pending[1]["toolUseId"],
    }
    writes = {
        e["candidate"]["id"]: e["data"] for e in of_type(envs, "tool_result") if e["data"]["toolName"] == "write_file"
    }
    assert (writes[c1]["isError"], writes[c2]["isError"]) == (True, False)
    written = tmp_path / pending[1]["target"]
    assert writes[c2]["result"].endswith(str(written)) and written.read_text().startswith("ROSTemplateFormatVersion")
    assert not (tmp_path / pending[0]["target"]).exists()
    events = journal(kernel, task_id)
    live_only = {e["eventId"] for e in events if e.get("visibility") != "pending_backup"}
    assert {e["eventId"] for e in live(got + rest)} == live_only
    snap = pipeline_state(kernel, taskId=task_id).json()["snapshot"]
    assert [(p["inputId"], p["status"], p["decision"]) for p in snap["display"]["permissions"]] == [
        (pending[0]["inputId"], "resolved", "deny"),
        (pending[1]["inputId"], "resolved", "allow_once"),
    ]
    assert "pendingPermissions" not in get_task(kernel, task_id)["metadata"]["iac_code"]
    # Answering again is an error.
    again = rpc(
        kernel,
        "SendMessage",
        message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, pending[1], "deny")),
    )
    assert rpc_error(again)["code"] == -32602


def test_pipe_perms_streaming_answers(kernel: ScriptedKernel, tmp_path: Any) -> None:
    stream, got, task_id, ctx, pending = _perm_wait(kernel, str(tmp_path))
    for wait in pending:
        one = frames(
            rpc(
                kernel,
                "SendStreamingMessage",
                message(context_id=ctx, task_id=task_id, parts=permission_part(task_id, wait, "allow_once")),
                stream=True,
            )
        )
        # a scripted choice (not observed): the answer's own stream only acknowledges it
        assert [state(f) for f in one] == ["TASK_STATE_WORKING"]
        assert iac(one[0])["inputReceived"] == {
            "toolUseId": wait["toolUseId"],
            "kind": "permission",
            "inputId": wait["inputId"],
            "decision": "allow_once",
        }
    rest = list(stream)
    envs = live(rest)
    assert [e["data"]["inputId"] for e in of_type(envs, "permission_resolved")] == [w["inputId"] for w in pending]
    candidate_results = [e for e in of_type(envs, "tool_result") if e["data"]["toolName"] == "write_file"]
    assert [e["candidate"]["id"] for e in candidate_results] == candidate_ids(got)
    assert not any(e["data"]["isError"] for e in candidate_results)
    assert state(rest[-1]) == "TASK_STATE_COMPLETED"


def test_pipe_perms_cancel_while_waiting(kernel: ScriptedKernel, tmp_path: Any) -> None:
    stream, _, task_id, _, _ = _perm_wait(kernel, str(tmp_path))
    canceled = rpc(kernel, "CancelTask", {"id": task_id}).json()["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert state(list(stream)[-1]) == "TASK_STATE_CANCELED"
    assert "pendingPermissions" not in get_task(kernel, task_id)["metadata"]["iac_code"]


# --------------------------------------------------------------------------- [PIPE-RESOURCE]


def _input_response(task_id: str, ctx: str, wait: dict[str, Any], **changes: Any) -> dict[str, Any]:
    response = {
        "schemaVersion": 1,
        "kind": "cloud_resource_selection",
        "status": "selected",
        "requestTaskId": task_id,
        "contextId": ctx,
        "inputId": wait["inputId"],
        "toolUseId": wait["toolUseId"],
        "selectorId": "vpc",
        "value": "vpc-1",
        "label": "default VPC",
    }
    response.update(changes)
    return {k: v for k, v in response.items() if v is not None}


@pytest.mark.parametrize("status", ["selected", "canceled"])
def test_pipe_resource_selection(kernel: ScriptedKernel, status: str) -> None:
    got, task_id, ctx = start(kernel, "[PIPE-RESOURCE] pick a network")
    last = got[-1]
    assert state(last) == "TASK_STATE_INPUT_REQUIRED"
    wait = iac(last)["input"]
    assert wait["kind"] == "cloud_resource_selection" and wait["required"] is True
    assert wait["selector"] == {"selectorId": "vpc", "options": [{"value": "vpc-1", "label": "default VPC"}]}
    assert iac(last)["inputRequired"] == wait
    assert iac(last)["pipeline"]["step"]["id"] == "architecture_planning"
    assert get_task(kernel, task_id)["metadata"]["iac_code"]["inputRequired"] == wait

    def send(response: Any, text: str = "vpc") -> requests.Response:
        return rpc(
            kernel,
            "SendStreamingMessage",
            message(text, context_id=ctx, task_id=task_id, inputResponse=response),
            stream=True,
        )

    assert (
        rpc_error(rpc(kernel, "SendStreamingMessage", message("vpc-1", context_id=ctx, task_id=task_id)))["code"]
        == -32602
    )
    for bad in (
        _input_response(task_id, ctx, wait, inputId="resource-nope"),
        _input_response(task_id, ctx, wait, extra=True),
        _input_response(task_id, ctx, wait, value="vpc-9"),
        _input_response(task_id, ctx, wait, status="maybe"),
        _input_response(task_id, ctx, wait, selectorId="vswitch"),
        "not an object",
    ):
        assert rpc_error(send(bad))["code"] == -32602, bad
    if status == "selected":
        good = _input_response(task_id, ctx, wait, label=None)
    else:
        good = _input_response(task_id, ctx, wait, status="canceled", value="", label=None)
    # requestTaskId alone addresses the task (no message.taskId).
    params = message("ok", context_id=ctx, inputResponse=good)
    after = frames(rpc(kernel, "SendStreamingMessage", params, stream=True))
    received = envelopes(after[0])[0]
    assert received["eventType"] == "input_received"
    expected_label = "default VPC" if status == "selected" else None
    assert received["data"] == {
        "kind": "cloud_resource_selection",
        "inputId": wait["inputId"],
        "toolUseId": wait["toolUseId"],
        "selectorId": "vpc",
        "status": status,
        "value": good["value"],
        "label": expected_label,
    }
    assert state(after[-1]) == "TASK_STATE_COMPLETED"
    planning = [e for e in live(after) if e.get("step", {}).get("id") == "architecture_planning"]
    expected_vpc = "vpc-1" if status == "selected" else None
    assert planning[-1]["data"]["conclusion"]["vpcId"] == expected_vpc


# --------------------------------------------------------------------------- [PIPE-FAIL], [PIPE-OOO], [PIPE-SLOW]


def test_pipe_fail_has_frames_after_the_first_failed(kernel: ScriptedKernel) -> None:
    got, task_id, ctx = start(kernel, "[PIPE-FAIL] this will break")
    states = [state(f) for f in got[1:]]
    first_failed = states.index("TASK_STATE_FAILED")
    tail = got[1 + first_failed :]
    assert len(tail) >= 4 and all(state(f) == "TASK_STATE_FAILED" for f in tail)
    assert types([envelopes(f)[0] for f in tail]) == [
        "step_failed",
        "pipeline_error",
        "pipeline_failed",
        "backup_committed",
        "pipeline_handoff_ready",
        "backup_committed",
    ]
    failed = envelopes(tail[0])[0]
    assert failed["step"]["id"] == "architecture_planning" and failed["status"] == "failed"
    assert failed["data"]["error"] == "No conclusion extracted"
    assert failed["data"]["errorDetails"]["type"] == "StepFailed"
    assert envelopes(tail[2])[0]["data"] == {"totalSteps": 5.0, "failed": True}
    assert envelopes(tail[4])[0]["data"]["outcome"] == "failed"
    assert get_task(kernel, task_id)["status"]["state"] == "TASK_STATE_FAILED"
    events = journal(kernel, task_id)
    assert len(events) == len(live(got)) + 2
    snap = pipeline_state(kernel, contextId=ctx).json()["snapshot"]
    assert snap["status"] == "failed"
    assert [s["status"] for s in snap["steps"]] == ["completed", "failed"]
    # Handoff to normal chat after a failure too.
    normal = frames(rpc(kernel, "SendStreamingMessage", message("still there?", context_id=ctx), stream=True))
    assert state(normal[-1]) == "TASK_STATE_INPUT_REQUIRED"


def test_pipe_ooo_gaps_are_filled_from_the_journal(kernel: ScriptedKernel) -> None:
    got, task_id, _ = start(kernel, "[PIPE-OOO] shuffle")
    envs = live(got)
    sequences = [e["sequence"] for e in envs]
    planning = [e for e in envs if e.get("step", {}).get("id") == "architecture_planning"]
    assert types(planning) == [
        "step_started",
        "context_usage",
        "message_started",
        "text_delta",
        "tool_started",
        "context_usage",
        "usage",
        "step_completed",
    ]
    swapped = planning[5]["sequence"]
    assert planning[6]["sequence"] == swapped - 1  # delivered after a higher sequence
    assert planning[7]["sequence"] == swapped + 2  # the tool_result in between never went out live
    assert sequences != sorted(sequences)
    events = journal(kernel, task_id)
    missing = [e for e in events if e["sequence"] not in set(sequences)]
    assert [(e["sequence"], e["eventType"]) for e in missing][0] == (swapped + 1, "tool_result")
    assert sorted(sequences + [e["sequence"] for e in missing]) == list(range(1, len(events) + 1))
    gap = pipeline_state(kernel, taskId=task_id, afterSequence=swapped, includeSnapshot="false").json()
    assert gap["events"][0]["eventType"] == "tool_result"


def test_pipe_slow_survives_disconnect_and_subscribe_continues() -> None:
    with ScriptedKernel(TOKEN, delay_scale=0.2) as slow:
        ctx = new_ctx("ctx-pipe-")
        params = message("[PIPE-SLOW] take your time", context_id=ctx, run_mode="pipeline")
        reader = open_stream(rpc(slow, "SendStreamingMessage", params, stream=True))
        task_id = next(reader)["result"]["task"]["id"]
        seen: list[dict[str, Any]] = []
        for frame in reader:
            seen.extend(envelopes(frame))
            if seen[-1]["eventType"] == "step_completed":
                break
        reader.response.close()
        sub = open_stream(rpc(slow, "SubscribeToTask", {"id": task_id}, stream=True))
        head = next(sub)
        assert head["result"]["task"]["id"] == task_id
        assert head["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
        rest = list(sub)
        assert state(rest[-1]) == "TASK_STATE_COMPLETED"
        events = journal(slow, task_id)
        delivered = {e["eventId"] for e in seen + live(rest)}
        assert delivered <= {e["eventId"] for e in events}
        started = [e["createdAt"] for e in events if e["eventType"] == "step_started"]
        assert len(started) == 5


def test_answer_after_fresh_connection_restart_realism(kernel: ScriptedKernel) -> None:
    """All pipeline state lives in the kernel: a new client (e.g. a restarted adapter) can answer."""
    got, task_id, ctx = start(kernel, "[PIPE-ASK] restart me")
    session = requests.Session()
    body = {"jsonrpc": "2.0", "id": "r", "method": "GetTask", "params": {"id": task_id}}
    task = session.post(kernel.url, json=body, headers=HEADERS, timeout=5).json()["result"]
    wait = task["metadata"]["iac_code"]["input"]
    assert wait["kind"] == "ask_user_question"
    snapshot = session.get(
        kernel.url + "iac-code/pipeline/state", params={"contextId": ctx}, headers=HEADERS, timeout=5
    ).json()["snapshot"]
    assert snapshot["pendingInput"]["inputId"] == wait["inputId"]
    deadline = time.monotonic() + 30
    after = answer(kernel, ctx, task_id, "cn-shanghai")
    assert time.monotonic() < deadline
    assert state(after[-1]) == "TASK_STATE_COMPLETED"


def test_cancel_running_pipeline() -> None:
    with ScriptedKernel(TOKEN, delay_scale=0.2) as slow:
        params = message("[PIPE-SLOW] cancel me", context_id=new_ctx("ctx-pipe-"), run_mode="pipeline")
        reader = open_stream(rpc(slow, "SendStreamingMessage", params, stream=True))
        task_id = next(reader)["result"]["task"]["id"]
        assert envelopes(next(reader))[0]["eventType"] == "pipeline_started"
        canceled = rpc(slow, "CancelTask", {"id": task_id}).json()["result"]
        assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
        rest = list(reader)
        assert state(rest[-1]) == "TASK_STATE_CANCELED"
        assert iac(rest[-1])["pipeline"]["eventType"] == "pipeline_canceled"
        assert iac(rest[-1])["pipeline"]["status"] == "canceled"
        snap = pipeline_state(slow, taskId=task_id).json()["snapshot"]
        assert snap["status"] == "canceled"
        assert journal(slow, task_id)[-1]["eventType"] == "pipeline_canceled"
