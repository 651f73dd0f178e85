"""Pipeline mode end to end against the scripted kernel: steps, candidates, questions,
permissions, resource selection, failure, out-of-order delivery, restart — and no event
lost or duplicated across all the runs of one pipeline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES, is_pending_publication
from tests.support.agui_client import Client, resume, run_body, session_value
from tests.support.flow import kernel_calls
from tests.support.kernel_rpc import journal
from tests.support.pipeline_checks import assert_business_events_once

SSF = "selling_solution_first"


def pipeline_body(text: str, workspace: Path, **kw: Any) -> dict[str, Any]:
    return run_body(text, cwd=str(workspace), runMode="pipeline", pipelineName="selling", **kw)


def customs(results: list[Any]) -> list[dict[str, Any]]:
    return [e["value"] for r in results for e in r.of("CUSTOM") if e["name"] == "iac-code.pipeline.v1"]


def assert_union_equals_journal(results: list[Any], kernel: Any, task_id: str) -> None:
    """Every allowlisted journal event reached the client once; none pending the kernel's backup."""
    delivered = [v["eventId"] for v in customs(results)]
    assert len(delivered) == len(set(delivered)), "an event was delivered twice"
    events = journal(kernel, task_id)
    expected = {e["eventId"] for e in events if e["eventType"] in CUSTOM_EVENT_TYPES and not is_pending_publication(e)}
    assert set(delivered) == expected
    assert_business_events_once(results, events)


def answer(client: Client, body: dict, result: Any, payloads: dict[str, Any] | None = None) -> Any:
    entries = []
    for interrupt in result.terminal["outcome"]["interrupts"]:
        payload = (payloads or {}).get(interrupt["id"])
        if payload is None:
            kind = interrupt["metadata"]["kind"]
            if kind == "permission":
                payload = {"decision": "allow_once"}
            elif kind == "cloud_resource_selection":
                payload = {"value": interrupt["responseSchema"]["properties"]["value"]["enum"][0]}
            else:
                payload = {"selectedId": interrupt["metadata"]["options"][0]["id"]}
        entries.append({"interruptId": interrupt["id"], "status": "resolved", "payload": payload})
    return client.run(resume(body, entries, runMode="pipeline", pipelineName="selling"))


def run_to_the_end(client: Client, body: dict, first: Any, limit: int = 6) -> list[Any]:
    results = [first]
    while results[-1].terminal["type"] == "RUN_FINISHED" and results[-1].terminal["outcome"]["type"] == "interrupt":
        assert len(results) < limit, "too many interrupts"
        results.append(answer(client, body, results[-1]))
    return results


def test_question_then_completion(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body = pipeline_body("[PIPE-ASK] a small website", workspace)
    first = client.run(body)
    assert first.terminal["outcome"]["type"] == "interrupt", first.terminal
    [interrupt] = first.terminal["outcome"]["interrupts"]
    assert interrupt["metadata"]["kind"] == "ask_user_question"
    assert [e["stepName"] for e in first.of("STEP_STARTED")][0] == "intent_parsing"
    assert customs([first])[0]["eventType"] == "pipeline_started"
    second = answer(client, body, first, {interrupt["id"]: {"selectedId": "hz"}})
    types = second.types()
    assert types[:2] == ["RUN_STARTED", "STEP_STARTED"] and second.events[1]["stepName"] == "intent_parsing"
    assert "ACTIVITY_SNAPSHOT" in types
    snapshot = second.of("ACTIVITY_SNAPSHOT")[0]
    assert snapshot["activityType"] == "iac-code.pipeline.v1" and snapshot["content"]["snapshot"]
    assert second.terminal["type"] == "RUN_FINISHED" and second.terminal["outcome"] == {"type": "success"}
    assert "pipeline_completed" in [c["eventType"] for c in customs([second])]
    sent = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(first)["contextId"])[-1]
    assert sent["params"]["message"]["parts"] == [{"text": "cn-hangzhou"}]
    assert_union_equals_journal([first, second], scripted_kernel, session_value(first)["taskId"])
    # after the handoff the thread continues as normal chat
    chat = client.run(run_body("hello again", thread_id=body["threadId"], cwd=str(workspace), ros="chat"))
    assert chat.terminal["type"] == "RUN_FINISHED" and chat.text()


def test_candidates_selection_and_the_deploy_permission(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body = pipeline_body("[PIPE-CANDIDATES] compare", workspace, candidatePresentation="rich")
    first = client.run(body)
    steps = [e["stepName"] for e in first.of("STEP_STARTED")]
    assert any(s.startswith("candidate:") for s in steps), steps
    [selection] = first.terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection" and selection["reason"] == "confirmation"
    option = selection["metadata"]["options"][0]
    for key in ("summary", "architectureDiagram", "totalMonthlyCost", "costItems"):
        assert key in option, key
    # the candidates' templates, published by the kernel as artifacts, reach the client
    artifacts = [e["value"] for e in first.of("CUSTOM") if e["name"] == "iac-code.artifact.v1"]
    assert sorted(a["name"] for a in artifacts) == ["1-plan-a.yml", "2-plan-b.yml"]
    results = run_to_the_end(client, body, first)
    kinds = [i["metadata"]["kind"] for r in results[:-1] for i in r.terminal["outcome"]["interrupts"]]
    # selling's deploying asks for ros_deploy's permission (tests/data/a2a-selling/10)
    assert kinds == ["candidate_selection", "permission"]
    [deploy] = results[1].terminal["outcome"]["interrupts"]
    assert deploy["metadata"]["toolName"] == "ros_deploy" and deploy["reason"] == "tool_call"
    assert results[-1].terminal["outcome"] == {"type": "success"}
    meta = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(first)["contextId"])[0]
    assert meta["params"]["message"]["metadata"]["iac_code"]["candidatePresentation"] == "rich-v1"
    assert_union_equals_journal(results, scripted_kernel, session_value(first)["taskId"])


def test_each_business_event_reaches_the_client_once(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    # the kernel journals its terminal, handoff and permission publications twice (pending_backup,
    # then committed); its live stream carries the committed ones; the gap fill at the end of each
    # run reads the journal: the client still gets one pipeline_completed, the committed one
    body = pipeline_body("[PIPE-CANDIDATES] compare", workspace)
    results = run_to_the_end(client, body, client.run(body))
    assert results[-1].terminal["outcome"] == {"type": "success"}
    events = journal(scripted_kernel, session_value(results[0])["taskId"])
    twins = [e["eventType"] for e in events if e.get("visibility") == "pending_backup"]
    assert {"pipeline_completed", "pipeline_handoff_ready", "permission_requested"} <= set(twins)
    ends = [c for c in customs(results) if c["eventType"] == "pipeline_completed"]
    assert [c["visibility"] for c in ends] == ["committed"]
    assert_business_events_once(results, events)


def test_solution_first_deployment_confirmation_is_an_interrupt_answered_by_resume(
    client: Client, workspace: Path, scripted_kernel: Any
) -> None:
    # selling_solution_first's confirmation comes without an iac_code.input, only as the pipeline's
    # input_required envelope (tests/data/a2a-selling/15): the adapter makes the interrupt from it
    # and answers the structured {"action": ...} the kernel resolves itself
    body = run_body("[PIPE-CANDIDATES] compare", cwd=str(workspace), runMode="pipeline", pipelineName=SSF)
    first = client.run(body)
    [selection] = first.terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection"
    picked = {"interruptId": selection["id"], "status": "resolved", "payload": {"selectedId": "1"}}
    second = client.run(resume(body, [picked], runMode="pipeline", pipelineName=SSF))
    [confirmation] = second.terminal["outcome"]["interrupts"]
    assert (confirmation["reason"], confirmation["metadata"]["kind"]) == ("confirmation", "deployment_confirmation")
    assert [o["id"] for o in confirmation["metadata"]["options"]] == ["confirm", "reselect", "cancel"]
    task_id = session_value(first)["taskId"]
    [wait] = [e for e in journal(scripted_kernel, task_id) if e["eventType"] == "input_required"][-1:]
    assert confirmation["id"] == f"input-{wait['eventId']}"
    confirm = {"interruptId": confirmation["id"], "status": "resolved", "payload": {"selectedId": "confirm"}}
    third = client.run(resume(body, [confirm], runMode="pipeline", pipelineName=SSF))
    sent = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(first)["contextId"])[-1]
    assert sent["params"]["message"]["parts"] == [{"text": '{"action": "confirm"}'}]
    [deploy] = third.terminal["outcome"]["interrupts"]
    assert deploy["metadata"]["toolName"] == "ros_deploy"
    allow = {"interruptId": deploy["id"], "status": "resolved", "payload": {"decision": "allow_once"}}
    last = client.run(resume(body, [allow], runMode="pipeline", pipelineName=SSF))
    assert last.terminal["outcome"] == {"type": "success"}
    assert "pipeline_completed" in [c["eventType"] for c in customs([last])]
    assert_union_equals_journal([first, second, third, last], scripted_kernel, task_id)


def test_candidate_permissions_are_interrupts_answered_by_resume(
    client: Client, workspace: Path, scripted_kernel: Any
) -> None:
    # as the real kernel (tests/data/a2a-selling/05, 08), each candidate's permission arrives while
    # the task stays WORKING: the adapter ends the run at the first one it sees, answers it with a
    # unary SendMessage on Resume and follows the task, so the two may take one run each
    body = pipeline_body("[PIPE-PERMS] evaluate", workspace)
    results = [client.run(body)]
    permissions: list[dict[str, Any]] = []
    while results[-1].terminal["type"] == "RUN_FINISHED" and results[-1].terminal["outcome"]["type"] == "interrupt":
        interrupts = results[-1].terminal["outcome"]["interrupts"]
        assert {i["metadata"]["kind"] for i in interrupts} == {"permission"}
        permissions += interrupts
        assert len(results) < 4, "too many interrupts"
        results.append(answer(client, body, results[-1]))
    assert results[-1].terminal["outcome"] == {"type": "success"}, results[-1].terminal
    assert len({i["id"] for i in permissions}) == 2
    context_id = session_value(results[0])["contextId"]
    sent = [
        c
        for c in list(scripted_kernel.requests)
        if c["method"] in ("SendMessage", "SendStreamingMessage")
        and c["params"]["message"].get("contextId") == context_id
        and "data" in c["params"]["message"]["parts"][0]
    ]
    assert {c["method"] for c in sent} == {"SendMessage"}
    assert {c["params"]["message"]["parts"][0]["data"]["inputId"] for c in sent} == {i["id"] for i in permissions}
    assert_union_equals_journal(results, scripted_kernel, session_value(results[0])["taskId"])


def test_resource_selection_answer_goes_as_input_response(
    client: Client, workspace: Path, scripted_kernel: Any
) -> None:
    body = pipeline_body("[PIPE-RESOURCE] pick a vpc", workspace)
    first = client.run(body)
    [interrupt] = first.terminal["outcome"]["interrupts"]
    assert interrupt["metadata"]["kind"] == "cloud_resource_selection"
    values = interrupt["responseSchema"]["properties"]["value"]["enum"]
    bad = client.run(
        resume(
            body,
            [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"value": "nope"}}],
            runMode="pipeline",
        )
    )
    assert bad.terminal["code"] == "RESUME_PAYLOAD_INVALID"
    second = answer(client, body, first, {interrupt["id"]: {"value": values[0]}})
    call = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(first)["contextId"])[-1]
    response = call["params"]["message"]["metadata"]["iac_code"]["inputResponse"]
    assert (
        response["status"] == "selected" and response["value"] == values[0] and response["inputId"] == interrupt["id"]
    )
    assert run_to_the_end(client, body, second)[-1].terminal["type"] == "RUN_FINISHED"


def test_failed_pipeline_ends_with_its_events_then_run_error(client: Client, workspace: Path) -> None:
    result = client.run(pipeline_body("[PIPE-FAIL] go", workspace))
    assert result.terminal["type"] == "RUN_ERROR" and result.terminal["code"] == "A2A_EXECUTION_FAILED"
    kinds = [c["eventType"] for c in customs([result])]
    assert "step_failed" in kinds
    assert not result.of("STEP_STARTED") or len(result.of("STEP_STARTED")) == len(result.of("STEP_FINISHED"))


def test_out_of_order_and_journal_only_events_are_all_delivered_once(
    client: Client, workspace: Path, scripted_kernel: Any
) -> None:
    body = pipeline_body("[PIPE-OOO] [PIPE-ASK] go", workspace)
    results = run_to_the_end(client, body, client.run(body))
    assert results[-1].terminal["type"] == "RUN_FINISHED"
    assert_union_equals_journal(results, scripted_kernel, session_value(results[0])["taskId"])
    text = "".join(r.text() for r in results)
    expected = "".join(
        e["data"]["text"]
        for e in journal(scripted_kernel, session_value(results[0])["taskId"])
        if e["eventType"] == "text_delta"
    )
    assert sorted(text) == sorted(expected)  # every delta, none twice (order may differ)


def test_restart_mid_pipeline(adapter_process: Any, workspace: Path, scripted_kernel: Any) -> None:
    first_proc = adapter_process()
    body = pipeline_body("[PIPE-ASK] go", workspace)
    first = Client(first_proc.url).run(body)
    assert first.terminal["outcome"]["type"] == "interrupt"
    first_proc.kill()
    second_proc = adapter_process()
    results = run_to_the_end(Client(second_proc.url), body, first)
    assert results[1].types()[:2] == ["RUN_STARTED", "STEP_STARTED"]
    assert results[-1].terminal["outcome"] == {"type": "success"}
    assert_union_equals_journal(results, scripted_kernel, session_value(first)["taskId"])


def test_disconnect_mid_pipeline_cancels_the_task(make_adapter: Any, workspace: Path, scripted_kernel: Any) -> None:
    import socket

    adapter = make_adapter(heartbeat_seconds=0.2)
    payload = json.dumps(pipeline_body("[PIPE-SLOW] go", workspace)).encode()
    host, port = adapter.url.split("//")[1].rstrip("/").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(payload), payload)
    )
    data = b""
    while b"iac-code.session.v1" not in data:
        data += sock.recv(65536)
    task_id = data.split(b'"taskId":"')[1].split(b'"')[0].decode()
    sock.close()
    deadline = time.monotonic() + 30
    while not any(c["params"].get("id") == task_id for c in kernel_calls(scripted_kernel, "CancelTask")):
        assert time.monotonic() < deadline, "no CancelTask"
        time.sleep(0.05)


def test_guidance_reaches_the_running_pipeline(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body = pipeline_body("[PIPE-SLOW] go", workspace)
    with requests.post(client.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=60) as r:
        chunks = r.iter_content(None)
        raw = b""
        for chunk in chunks:
            raw += chunk
            if b"iac-code.session.v1" in raw:
                break
        guidance = pipeline_body("please prefer cn-shanghai", workspace, activeGuidance=True)
        guidance["threadId"] = body["threadId"]
        result = client.run(guidance)
        assert result.status == 200, result.error
        assert result.types() == ["RUN_STARTED", "RUN_FINISHED"]
        assert result.terminal["outcome"] == {"type": "success"}
        for chunk in chunks:
            raw += chunk
    # the pipeline's own run was not disturbed, and the kernel got the guidance on its task
    assert b'"RUN_FINISHED"' in raw and b'"outcome":{"type":"success"}' in raw
    task_id = raw.split(b'"taskId":"')[1].split(b'"')[0].decode()
    sent = [
        c
        for c in kernel_calls(scripted_kernel, "SendStreamingMessage")
        if c["params"]["message"].get("taskId") == task_id
    ]
    assert [c["params"]["message"]["parts"] for c in sent] == [[{"text": "please prefer cn-shanghai"}]]
    # guidance needs a running pipeline
    late = pipeline_body("too late", workspace, activeGuidance=True)
    late["threadId"] = body["threadId"]
    refused = client.run(late)
    assert refused.status == 409 and refused.error["code"] == "EXECUTION_LOST"
