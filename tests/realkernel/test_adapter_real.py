"""The adapter end to end: ``python run.py`` in front of the real iac-code 0.16.0 kernel.

Every scenario drives the adapter as a separate process (``AdapterProcess`` of
``tests/support/servers.py``) against one real kernel + fake LLM per module (``real_kernel``).
Every AG-UI stream is read through ``Client`` of ``tests/support/agui_client.py`` (or, for
streams cut short on purpose, checked the same way by hand), so it is validated by
``check_stream`` and recorded for the official client when ``AGUI_STREAM_DIR`` is set.
Assertions are on facts: the fake LLM's request log, the files in the workspace, and the
kernel's own ``GetTask``.

Each test uses its own threadId and its own workspace under the kernel's workdir; a
per-test tag in the prompt picks that test's requests out of the shared LLM log.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.protocol.timestamps import parse_rfc3339
from tests.support.agui_client import Client, LiveStream, RunResult, resume, run_body, session_value
from tests.support.fake_llm import WRITE_CONTENT, WRITE_PATH, count_images, message_text
from tests.support.flow import wait_for
from tests.support.images import tiny_png
from tests.support.servers import AdapterProcess

from .harness import Adapters, RealKernel, behaviours, get_task, llm_log, task_state, thread_id, wait_task_state

PERMISSION_SCHEMA = {
    "type": "object",
    "properties": {"decision": {"type": "string", "enum": ["allow_once", "deny"]}},
    "required": ["decision"],
    "additionalProperties": False,
}
# Secrets sent in this module's requests; the last test proves none reached the state dir.
SECRETS: list[str] = []


# ============================================================================ helpers
def secret_props(label: str) -> dict[str, Any]:
    """forwardedProps secrets, unique per call, remembered for the state-dir check."""
    suffix = uuid.uuid4().hex[:10]
    api_key, secret, token = f"sk-LLM-{label}-{suffix}", f"AKSECRET-{label}-{suffix}", f"STS-{label}-{suffix}"
    SECRETS.extend([api_key, secret, token])
    return {
        "llmApiKey": api_key,
        "alibabaCloud": {
            "accessKeyId": f"AKID-{suffix}",
            "accessKeySecret": secret,
            "securityToken": token,
            "regionId": "cn-hangzhou",
        },
    }


def interrupted(
    client: Client, cwd: Path, tag: str, *, thread: str | None = None, **props: Any
) -> tuple[dict, RunResult]:
    body = run_body(f"[WRITE] please write the file {tag}", thread_id=thread or thread_id("w"), cwd=str(cwd), **props)
    result = client.run(body)
    assert result.status == 200, result.error
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.terminal["outcome"]["type"] == "interrupt", result.terminal
    return body, result


def allow(interrupt: dict, decision: str = "allow_once") -> list[dict]:
    return [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": decision}}]


# ============================================================================ 1-2: turns
def test_text_turn(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body = run_body(f"Say hello {tag}", thread_id=thread_id("text"), cwd=str(ws), **secret_props("text"))
    result = client.run(body)
    assert result.status == 200, result.error
    assert result.events[0]["type"] == "RUN_STARTED"
    assert result.events[0]["threadId"] == body["threadId"] and result.events[0]["runId"] == body["runId"]
    session = session_value(result)
    assert session["threadId"] == body["threadId"] and session["aguiRunId"] == body["runId"]
    assert session["taskId"] and session["sessionId"] and session["contextId"].startswith("agui-")
    # the kernel repeats the whole answer at the end: shown once
    assert result.text() == "Hello from the fake LLM."
    assert len(result.of("TEXT_MESSAGE_START")) == 1
    finished = result.terminal
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"] == {"type": "success"}
    [usage] = finished["usage"]
    assert usage["provider"] == "openai"
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (11, 7, 18)
    assert behaviours(real_kernel, tag) == ["default"]
    task = get_task(real_kernel, session["taskId"])
    assert task["contextId"] == session["contextId"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # a normal turn's end state


def test_raw_reasoning(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    result = client.run(run_body(f"[THINK] consider it {tag}", thread_id=thread_id("think"), cwd=str(ws)))
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    types = result.types()
    for kind in (
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
    ):
        assert kind in types, (kind, types)
    assert types.index("REASONING_START") < types.index("REASONING_MESSAGE_CONTENT") < types.index("REASONING_END")
    assert types.index("REASONING_END") < types.index("TEXT_MESSAGE_START")
    reasoning = "".join(e["delta"] for e in result.of("REASONING_MESSAGE_CONTENT"))
    assert reasoning == "Let me think about this."
    assert result.text() == "Hello from the fake LLM."
    assert behaviours(real_kernel, tag) == ["think"]


# ============================================================================ 3-6: permission
def test_permission_interrupt_then_allow(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body, result = interrupted(client, ws, tag, **secret_props("allow"))
    [interrupt] = result.terminal["outcome"]["interrupts"]
    [start] = result.of("TOOL_CALL_START")
    assert start["toolCallName"] == "write_file"
    assert interrupt["reason"] == "tool_call"
    assert interrupt["toolCallId"] == start["toolCallId"]
    assert interrupt["responseSchema"] == PERMISSION_SCHEMA
    assert interrupt["expiresAt"].endswith("Z")
    expires = time.mktime(time.strptime(interrupt["expiresAt"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert 86000 < expires - time.time() < 86500
    meta = interrupt["metadata"]
    assert meta["kind"] == "permission" and meta["toolName"] == "write_file"
    assert [o["id"] for o in meta["options"]] == ["allow_once", "deny"]
    assert "I will write the file now." in result.text()
    session = session_value(result)
    assert task_state(real_kernel, session["taskId"]) == "TASK_STATE_INPUT_REQUIRED"
    assert not (ws / WRITE_PATH).exists()
    assert behaviours(real_kernel, tag) == ["write"]

    resumed = client.run(resume(body, allow(interrupt), **secret_props("allow-resume")))
    assert resumed.terminal["type"] == "RUN_FINISHED", resumed.terminal
    assert resumed.terminal["outcome"] == {"type": "success"}
    assert resumed.events[0]["runId"] != body["runId"]
    [tool_result] = resumed.of("TOOL_CALL_RESULT")
    assert tool_result["toolCallId"] == interrupt["toolCallId"]
    assert "Successfully wrote" in tool_result["content"]
    artifacts = [e["value"] for e in resumed.of("CUSTOM") if e["name"] == "iac-code.artifact.v1"]
    assert len(artifacts) == 1 and artifacts[0]["schemaVersion"] == 1
    assert "hello.txt" in json.dumps(artifacts[0])
    assert resumed.text().startswith("Tool finished. Result: Successfully wrote")
    assert "I will write the file now." not in resumed.text()
    assert session_value(resumed)["taskId"] == session["taskId"]
    # the tool ran exactly once: one file with the content once, two LLM calls in all
    assert [p.name for p in ws.iterdir()] == [WRITE_PATH]
    assert (ws / WRITE_PATH).read_text() == WRITE_CONTENT
    assert behaviours(real_kernel, tag) == ["write", "tool-result"]
    assert task_state(real_kernel, session["taskId"]) == "TASK_STATE_INPUT_REQUIRED"


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param({"status": "resolved", "payload": {"decision": "deny"}}, id="deny"),
        pytest.param({"status": "cancelled"}, id="cancelled"),
    ],
)
def test_deny_and_cancelled_write_nothing(
    client: Client, real_kernel: RealKernel, ws: Path, tag: str, answer: dict
) -> None:
    body, result = interrupted(client, ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    resumed = client.run(resume(body, [{"interruptId": interrupt["id"], **answer}]))
    assert resumed.terminal["type"] == "RUN_FINISHED", resumed.terminal
    assert resumed.terminal["outcome"] == {"type": "success"}
    [tool_result] = resumed.of("TOOL_CALL_RESULT")
    assert tool_result["toolCallId"] == interrupt["toolCallId"]
    assert "Successfully wrote" not in tool_result["content"]
    assert "denied" in tool_result["content"], tool_result
    assert not (ws / WRITE_PATH).exists()
    log = llm_log(real_kernel, tag)
    assert [r["behaviour"] for r in log] == ["write", "tool-result"]
    assert "Successfully wrote" not in message_text(log[-1]["messages"][-1])


def test_bad_answers_then_a_good_retry(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body, result = interrupted(client, ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    iid = interrupt["id"]
    deny = {"interruptId": iid, "status": "resolved", "payload": {"decision": "deny"}}
    cases = [
        ([], "INCOMPLETE_RESUME"),  # missing
        (
            [{"interruptId": "permission-nope", "status": "resolved", "payload": {"decision": "deny"}}, deny],
            "UNKNOWN_INTERRUPT",
        ),
        ([deny, deny], "INCOMPLETE_RESUME"),  # duplicate
        ([{"interruptId": iid, "status": "resolved"}], "RESUME_PAYLOAD_INVALID"),
        ([{"interruptId": iid, "status": "resolved", "payload": {"decision": "maybe"}}], "RESUME_PAYLOAD_INVALID"),
        (
            [{"interruptId": iid, "status": "resolved", "payload": {"decision": "deny", "x": 1}}],
            "RESUME_PAYLOAD_INVALID",
        ),
    ]
    for answers, code in cases:
        failed = client.run(resume(body, answers))
        assert failed.status == 200, failed.error
        assert failed.types() == ["RUN_STARTED", "RUN_ERROR"], (answers, failed.types())
        assert failed.terminal["code"] == code, (answers, failed.terminal)
    # nothing reached the kernel: the task still waits, the LLM was not called again
    task_id = session_value(result)["taskId"]
    assert task_state(real_kernel, task_id) == "TASK_STATE_INPUT_REQUIRED"
    assert behaviours(real_kernel, tag) == ["write"]
    ok = client.run(resume(body, allow(interrupt)))
    assert ok.terminal["type"] == "RUN_FINISHED", ok.terminal
    assert ok.terminal["outcome"] == {"type": "success"}
    assert (ws / WRITE_PATH).read_text() == WRITE_CONTENT
    assert behaviours(real_kernel, tag) == ["write", "tool-result"]


def test_duplicate_accepted_resume_is_refused(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body, result = interrupted(client, ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    first = client.run(resume(body, allow(interrupt)))
    assert first.terminal["type"] == "RUN_FINISHED", first.terminal
    assert (ws / WRITE_PATH).read_text() == WRITE_CONTENT
    (ws / WRITE_PATH).unlink()
    again = client.run(resume(body, allow(interrupt)))  # same answers, new runId
    assert again.events[0]["runId"] != first.events[0]["runId"]
    assert again.types() == ["RUN_STARTED", "RUN_ERROR"], again.types()
    assert again.terminal["code"] == "RESUME_ALREADY_APPLIED"
    assert not (ws / WRITE_PATH).exists()  # the tool did not run again
    assert behaviours(real_kernel, tag) == ["write", "tool-result"]


# ============================================================================ 7-8: continuity
def test_follow_up_turn_and_turn_after_restart(adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    thread = thread_id("recall")
    first_proc = adapters.start()
    c1 = Client(first_proc.url)
    one = c1.run(run_body(f"Say hello {tag}", thread_id=thread, cwd=str(ws), ros="inv-a", **secret_props("r1")))
    two = c1.run(run_body(f"[RECALL] {tag}", thread_id=thread, cwd=str(ws), ros="inv-b"))
    assert one.terminal["type"] == "RUN_FINISHED" and two.terminal["type"] == "RUN_FINISHED", two.terminal
    assert two.text() == "I have seen 2 user messages."
    a, b = session_value(one), session_value(two)
    assert a["contextId"] == b["contextId"] and a["sessionId"] == b["sessionId"]
    assert a["taskId"] != b["taskId"] and a["executionId"] != b["executionId"]
    assert first_proc.stop() == 0

    second_proc = adapters.start()
    three = Client(second_proc.url).run(
        run_body(f"[RECALL] again {tag}", thread_id=thread, cwd=str(ws), ros="inv-c", **secret_props("r3"))
    )
    assert three.terminal["type"] == "RUN_FINISHED", three.terminal
    assert three.text() == "I have seen 3 user messages."
    c = session_value(three)
    assert c["contextId"] == a["contextId"] and c["sessionId"] == a["sessionId"]
    assert behaviours(real_kernel, tag) == ["default", "recall", "recall"]
    second_proc.stop()


def test_resume_after_adapter_kill(adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    first_proc = adapters.start()
    body, result = interrupted(Client(first_proc.url), ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    first_proc.kill()  # SIGKILL
    assert first_proc.proc is not None and first_proc.proc.returncode == -9
    second_proc = adapters.start()
    ok = Client(second_proc.url).run(resume(body, allow(interrupt)))
    assert ok.terminal["type"] == "RUN_FINISHED", ok.terminal
    assert ok.terminal["outcome"] == {"type": "success"}
    [tool_result] = ok.of("TOOL_CALL_RESULT")
    assert tool_result["toolCallId"] == interrupt["toolCallId"]
    assert (ws / WRITE_PATH).read_text() == WRITE_CONTENT
    assert behaviours(real_kernel, tag) == ["write", "tool-result"]
    second_proc.stop()


# ============================================================================ 9: expiry
def test_expired_interrupt(adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    proc = adapters.start("--interrupt-ttl-seconds", "1")
    client = Client(proc.url)
    body, result = interrupted(client, ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    task_id = session_value(result)["taskId"]
    expires = parse_rfc3339(interrupt["expiresAt"])
    wait_for(lambda: time.time() > expires, 30)  # the interrupt's own deadline, on the wall clock
    late = client.run(resume(body, allow(interrupt)))
    assert late.types() == ["RUN_STARTED", "RUN_ERROR"], late.types()
    assert late.terminal["code"] == "EXECUTION_EXPIRED"
    assert interrupt["expiresAt"] in late.terminal["message"]
    # the adapter cancelled the kernel task (CancelTask on an INPUT_REQUIRED permission wait
    # works on 0.16.0) before answering: the permission can no longer be answered
    assert task_state(real_kernel, task_id) == "TASK_STATE_CANCELED"
    assert not (ws / WRITE_PATH).exists()
    assert behaviours(real_kernel, tag) == ["write"]
    again = client.run(resume(body, allow(interrupt)))
    assert again.terminal["code"] == "EXECUTION_LOST"
    fresh = client.run(run_body(f"Say hello {tag}", thread_id=body["threadId"], cwd=str(ws), ros="inv-new"))
    assert fresh.terminal["type"] == "RUN_FINISHED", fresh.terminal
    proc.stop()


# ============================================================================ 10-11: cancel
def test_cancel_endpoint_during_a_slow_turn(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body = run_body(f"[SLOW] {tag}", thread_id=thread_id("cancel"), cwd=str(ws), ros="inv-c")
    live = LiveStream(client, body)
    assert live.status == 200
    session = live.session()
    live.read_until(b"Chunk 1.")
    started = time.monotonic()
    answer = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": "inv-c"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"executionId": session["executionId"], "status": "cancelled"}
    events = live.finish()
    assert time.monotonic() - started < 8, "the stream did not end soon after the cancel"
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED", events[-1]
    assert "Chunk 10." not in "".join(e.get("delta", "") for e in events)
    assert wait_task_state(real_kernel, session["taskId"], "TASK_STATE_CANCELED") == "TASK_STATE_CANCELED"
    again = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": "inv-c"})
    assert again.json()["status"] == "already_terminal"
    nxt = client.run(run_body(f"Say hello {tag}", thread_id=body["threadId"], cwd=str(ws), ros="inv-d"))
    assert nxt.terminal["type"] == "RUN_FINISHED", nxt.terminal


def test_cancel_endpoint_during_a_pending_interrupt(
    client: Client, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    body, result = interrupted(client, ws, tag)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    session = session_value(result)
    ros = body["forwardedProps"]["iacCode"]["rosInvocationId"]
    answer = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": ros})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"executionId": session["executionId"], "status": "cancelled"}
    assert task_state(real_kernel, session["taskId"]) == "TASK_STATE_CANCELED"
    late = client.run(resume(body, allow(interrupt)))
    assert late.types() == ["RUN_STARTED", "RUN_ERROR"], late.types()
    assert late.terminal["code"] == "EXECUTION_LOST"
    assert not (ws / WRITE_PATH).exists()
    nxt = client.run(run_body(f"[RECALL] {tag}", thread_id=body["threadId"], cwd=str(ws), ros="inv-next"))
    assert nxt.terminal["type"] == "RUN_FINISHED", nxt.terminal
    assert nxt.text().startswith("I have seen ")
    assert behaviours(real_kernel, tag)[0] == "write" and "tool-result" not in behaviours(real_kernel, tag)


def test_client_disconnect_cancels_the_kernel_task(
    adapter: AdapterProcess, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    body = run_body(f"[SLOW] {tag}", thread_id=thread_id("gone"), cwd=str(ws))
    host, port = adapter.url.split("//")[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    data = b""
    while b"iac-code.session.v1" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    task_id = data.split(b'"taskId":"')[1].split(b'"')[0].decode()
    sock.close()
    assert wait_task_state(real_kernel, task_id, "TASK_STATE_CANCELED") == "TASK_STATE_CANCELED"
    # the thread is free again
    nxt = Client(adapter.url).run(run_body(f"Say hello {tag}", thread_id=body["threadId"], cwd=str(ws)))
    assert nxt.terminal["type"] == "RUN_FINISHED", nxt.terminal


# ============================================================================ 12-14: failures, images
def test_llm_failure(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    started = time.monotonic()
    result = client.run(run_body(f"[FAIL] break {tag}", thread_id=thread_id("fail"), cwd=str(ws)))
    assert time.monotonic() - started < 15
    assert result.terminal["type"] == "RUN_ERROR", result.terminal
    assert result.terminal["code"] == "A2A_EXECUTION_FAILED"
    message = result.terminal["message"]
    assert "400" in message and "scripted non-retryable failure from the fake LLM" in message, message
    assert not result.of("TEXT_MESSAGE_CONTENT")  # the error report is not an answer
    assert behaviours(real_kernel, tag) == ["fail", "fail"]


def test_cwd_outside_the_kernel_roots(client: Client, adapters: Adapters, real_kernel: RealKernel, tag: str) -> None:
    cwd = adapters.outside / f"ws-{uuid.uuid4().hex[:6]}"
    result = client.run(run_body(f"Say hello {tag}", thread_id=thread_id("outside"), cwd=str(cwd)))
    assert result.status == 200, result.error  # the adapter's own roots allow it
    assert result.terminal["type"] == "RUN_ERROR", result.terminal
    assert result.terminal["code"] == "A2A_EXECUTION_FAILED"
    assert "Invalid A2A workspace metadata." in result.terminal["message"], result.terminal["message"]
    assert behaviours(real_kernel, tag) == []


def test_inline_png_reaches_the_llm(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    body = run_body(None, thread_id=thread_id("image"), cwd=str(ws))
    body["messages"] = [
        {
            "id": "m-image",
            "role": "user",
            "content": [
                {"type": "text", "text": f"[IMAGE] what is this? {tag}"},
                {
                    "type": "image",
                    "source": {"type": "data", "value": base64.b64encode(tiny_png()).decode(), "mimeType": "image/png"},
                },
            ],
        }
    ]
    result = client.run(body)
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.text() == "I see 1 image(s)."
    [request] = llm_log(real_kernel, tag)
    assert count_images(request["messages"]) == 1


# ============================================================================ 15: admission
def test_new_turn_while_interrupt_pending(client: Client, ws: Path, tag: str) -> None:
    body, result = interrupted(client, ws, tag)
    refused = client.run(run_body(f"Say hello {tag}", thread_id=body["threadId"], cwd=str(ws), ros="inv-other"))
    assert refused.status == 409 and refused.error is not None
    assert refused.error["code"] == "RESUME_REQUIRED"
    [interrupt] = result.terminal["outcome"]["interrupts"]
    ok = client.run(resume(body, allow(interrupt, "deny")))
    assert ok.terminal["type"] == "RUN_FINISHED", ok.terminal


def test_two_concurrent_turns_on_one_thread(client: Client, real_kernel: RealKernel, ws: Path, tag: str) -> None:
    thread = thread_id("race")
    barrier = threading.Barrier(2)
    outcomes: list[Any] = [None, None]

    def go(i: int) -> None:
        body = run_body(f"[SLOW] {i} {tag}", thread_id=thread, cwd=str(ws), ros="inv-race")
        own = Client(client.url)
        barrier.wait()
        live = LiveStream(own, body)
        if live.status != 200:
            outcomes[i] = (live.status, live.response.json(), None)
            live.response.close()
            return
        session = live.session()
        outcomes[i] = (200, None, live, session)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(outcomes), outcomes
    statuses = sorted(o[0] for o in outcomes)
    assert statuses == [200, 409], statuses
    refused = next(o for o in outcomes if o[0] == 409)
    assert refused[1]["error"]["code"] == "THREAD_BUSY"
    admitted = next(o for o in outcomes if o[0] == 200)
    live, session = admitted[2], admitted[3]
    stop = client.cancel(session["executionId"], {"threadId": thread, "rosInvocationId": "inv-race"})
    assert stop.json()["status"] == "cancelled"
    events = live.finish()
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    assert len(llm_log(real_kernel, tag)) == 1  # only one turn reached the kernel


# ============================================================================ 16: secrets
def test_state_files_hold_no_secrets(adapters: Adapters, client: Client, ws: Path, tag: str) -> None:
    # one more interrupted + resumed run with secrets, so the pending state is covered too
    body, result = interrupted(client, ws, tag, **secret_props("last"))
    [interrupt] = result.terminal["outcome"]["interrupts"]
    assert_no_secrets(adapters.state_dir)  # while the interrupt is pending
    ok = client.run(resume(body, allow(interrupt), **secret_props("last-resume")))
    assert ok.terminal["type"] == "RUN_FINISHED", ok.terminal
    assert len(SECRETS) >= 18  # several requests of this module sent secrets
    assert_no_secrets(adapters.state_dir)


def assert_no_secrets(state_dir: Path) -> None:
    files = [p for p in state_dir.rglob("*") if p.is_file()]
    assert sum(p.suffix == ".json" for p in files) >= 10, files  # the threads of this module
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path, secret)


# ============================================================================ pipelines
def test_pipeline_question_answered_by_option_runs_to_its_end(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    from tests.support.agui_check.official import check_streams, require_official_client

    body = run_body(
        f"[PIPE-ASK] I want a small website on Alibaba Cloud. {tag}",
        thread_id=thread_id("pipe"),
        cwd=str(ws),
        runMode="pipeline",
        pipelineName="selling",
    )
    first = client.run(body)
    assert first.terminal["type"] == "RUN_FINISHED", first.terminal
    assert first.terminal["outcome"]["type"] == "interrupt"
    [question] = first.terminal["outcome"]["interrupts"]
    assert question["metadata"]["kind"] == "ask_user_question" and question["reason"] == "input_required"
    assert {o["label"] for o in question["metadata"]["options"]} >= {"cn-hangzhou", "cn-shanghai"}
    assert [e["stepName"] for e in first.of("STEP_STARTED")] == ["intent_parsing"]
    assert [c["value"]["eventType"] for c in first.of("CUSTOM") if c["name"] == "iac-code.pipeline.v1"][0] == (
        "pipeline_started"
    )
    option = next(o for o in question["metadata"]["options"] if o["label"] == "cn-hangzhou")
    props = body["forwardedProps"]["iacCode"]
    second = client.run(
        run_body(
            None,
            thread_id=body["threadId"],
            cwd=props["cwd"],
            ros=props["rosInvocationId"],
            runMode="pipeline",
            pipelineName="selling",
            resume=[{"interruptId": question["id"], "status": "resolved", "payload": {"selectedId": option["id"]}}],
        )
    )
    assert second.terminal["type"] == "RUN_FINISHED", second.terminal
    assert second.terminal["outcome"] == {"type": "success"}
    types = second.types()
    assert types[:2] == ["RUN_STARTED", "STEP_STARTED"] and "ACTIVITY_SNAPSHOT" in types
    assert "intent_parsing" in [e["stepName"] for e in second.of("STEP_FINISHED")]
    pipeline_events = [
        c["value"] for r in (first, second) for c in r.of("CUSTOM") if c["name"] == "iac-code.pipeline.v1"
    ]
    ids = [e["eventId"] for e in pipeline_events]
    assert len(ids) == len(set(ids))
    assert "pipeline_completed" in [e["eventType"] for e in pipeline_events]
    # every allowlisted event of the kernel's journal reached the client exactly once, but those
    # pending the kernel's backup (their committed twins did); each business event once
    import requests

    from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES, is_pending_publication
    from tests.support.pipeline_checks import assert_business_events_once

    state = requests.get(
        real_kernel.url + "/iac-code/pipeline/state",
        params={"taskId": session_value(first)["taskId"], "afterSequence": 0, "includeSnapshot": "false"},
        headers=real_kernel.headers(),
        timeout=10,
    ).json()
    wanted = {
        e["eventId"] for e in state["events"] if e["eventType"] in CUSTOM_EVENT_TYPES and not is_pending_publication(e)
    }
    assert set(ids) == wanted
    assert_business_events_once([first, second], state["events"])
    require_official_client()
    verdict = check_streams([first.raw, second.raw], resume_payload={"selectedId": option["id"]})
    assert verdict.ok, verdict.output


def test_two_adapter_processes_race_for_one_thread(
    adapters: Adapters, adapter: AdapterProcess, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    other = adapters.start()  # a second process on the same state directory
    thread = thread_id("two-procs")
    barrier = threading.Barrier(4)
    outcomes: list[Any] = []
    lock = threading.Lock()

    def go(url: str, i: int) -> None:
        body = run_body(f"[SLOW] {i} {tag}", thread_id=thread, cwd=str(ws), ros="inv-procs")
        barrier.wait()
        live = LiveStream(Client(url), body)
        with lock:
            outcomes.append((live.status, live))

    threads = [threading.Thread(target=go, args=(u, i)) for i, u in enumerate([adapter.url, other.url] * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(status for status, _ in outcomes) == [200, 409, 409, 409]
    for status, live in outcomes:
        if status == 409:
            assert live.response.json()["error"]["code"] == "THREAD_BUSY"
            live.response.close()
    [winner] = [live for status, live in outcomes if status == 200]
    session = winner.session()
    stop = Client(adapter.url).cancel(session["executionId"], {"threadId": thread, "rosInvocationId": "inv-procs"})
    assert stop.json()["status"] == "cancelled"  # either process can cancel it: the state is shared
    assert winner.finish()[-1]["code"] == "CANCELLED"


def test_read_only_state_dir_fails_closed(
    adapters: Adapters, client: Client, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    import subprocess

    threads_dir = adapters.state_dir / "threads"
    live = LiveStream(client, run_body(f"[WRITE] [SLOW] {tag}", thread_id=thread_id("ro"), cwd=str(ws)))
    session = live.session()  # task and session ids are on disk; the permission wait is seconds away
    if subprocess.run(["chattr", "+i", str(threads_dir)], capture_output=True).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("chattr +i is needed for this test")
        pytest.skip("chattr +i is not available here")
    try:
        events = live.finish()
    finally:
        subprocess.run(["chattr", "-i", str(threads_dir)], check=True)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "STATE_PERSISTENCE_FAILED"
    assert not [e for e in events if e["type"] == "RUN_FINISHED"]
    deadline = time.monotonic() + 15
    while get_task(real_kernel, session["taskId"])["status"]["state"] != "TASK_STATE_CANCELED":
        assert time.monotonic() < deadline, "the kernel task was not cancelled"
        time.sleep(0.2)
    assert not (ws / "hello.txt").exists()
