"""Normal turns end to end, over real sockets, against the scripted kernel."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import requests

from tests.support.agui_client import Client, run_body, session_value
from tests.support.agui_stream import check_stream, parse_sse
from tests.support.flow import kernel_calls


def test_text_turn(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    result = client.run(body)
    assert result.status == 200
    assert result.headers["Content-Type"].startswith("text/event-stream")
    assert result.headers["Cache-Control"] == "no-cache"
    assert result.headers["X-Accel-Buffering"] == "no"
    assert "Content-Length" not in result.headers
    assert result.types() == [
        "RUN_STARTED",
        "CUSTOM",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert result.events[0]["protocolVersion"] == "1.0"
    assert result.text() == "Hello from the scripted kernel."  # the final repeat is dropped
    finished = result.terminal
    assert finished["outcome"] == {"type": "success"}
    assert finished["threadId"] == body["threadId"] and finished["runId"] == body["runId"]
    [usage] = finished["usage"]
    assert usage["provider"] == "openai" and isinstance(usage["inputTokens"], int)
    session = session_value(result)
    assert session["threadId"] == body["threadId"] and session["aguiRunId"] == body["runId"]
    assert session["contextId"].startswith("agui-") and session["taskId"] and session["sessionId"]
    assert session["rosInvocationId"] == "inv-1" and session["executionId"]


def test_reasoning_tool_artifact_and_progress(client: Client, workspace: Path) -> None:
    result = client.run(run_body("[THINK] [PROGRESS] go", cwd=str(workspace)))
    types = result.types()
    assert types.index("REASONING_START") < types.index("REASONING_MESSAGE_CONTENT") < types.index("REASONING_END")
    assert "".join(e["delta"] for e in result.of("REASONING_MESSAGE_CONTENT"))
    [start] = result.of("TOOL_CALL_START")
    [args] = result.of("TOOL_CALL_ARGS")
    json.loads(args["delta"])
    [tool_result] = result.of("TOOL_CALL_RESULT")
    assert tool_result["toolCallId"] == start["toolCallId"] and tool_result["role"] == "tool"
    assert start.get("parentMessageId") in [e["messageId"] for e in result.of("TEXT_MESSAGE_START")]
    names = [e["name"] for e in result.of("CUSTOM")]
    assert "iac-code.artifact.v1" in names and names.count("iac-code.tool-progress.v1") == 2
    artifact = next(e for e in result.of("CUSTOM") if e["name"] == "iac-code.artifact.v1")["value"]
    assert artifact["schemaVersion"] == 1 and artifact["artifactId"]
    assert isinstance(artifact["parts"][0]["metadata"]["byteSize"], int)  # floats normalised


def test_kernel_failure_is_run_error_with_closed_spans(client: Client, workspace: Path) -> None:
    result = client.run(run_body("[FAIL]", cwd=str(workspace)))
    assert result.terminal["type"] == "RUN_ERROR"
    assert result.terminal["code"] == "A2A_EXECUTION_FAILED"
    assert "scripted upstream failure" in result.terminal["message"]
    assert result.terminal["usage"]
    assert not result.of("TEXT_MESSAGE_CONTENT")  # the error report is not an answer


def test_follow_up_turn_continues_the_conversation(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    thread = "thread-follow-up"
    first = client.run(run_body("[RECALL]", thread_id=thread, cwd=str(workspace), ros="inv-a"))
    second = client.run(run_body("[RECALL]", thread_id=thread, cwd=str(workspace), ros="inv-b"))
    assert "1 user turns" in first.text() and "2 user turns" in second.text()
    a, b = session_value(first), session_value(second)
    assert a["contextId"] == b["contextId"] and a["sessionId"] == b["sessionId"]
    assert a["executionId"] != b["executionId"] and a["taskId"] != b["taskId"]
    assert b["rosInvocationId"] == "inv-b"


def test_forwarded_metadata(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body = run_body(
        "[ECHO] hi",
        cwd=str(workspace),
        userId="u-1",
        channel="web",
        model="m-1",
        llmApiKey="sk-secret-1",
        thinking={"enabled": True, "budget": 100},
        runMode="normal",
        candidatePresentation="rich",
        llmHeaders={"X-Trace": "t"},
        alibabaCloud={
            "accessKeyId": "AK",
            "accessKeySecret": "SK-secret",
            "securityToken": "STS-secret",
            "regionId": "cn-hangzhou",
        },
        preferredLanguage="zh-CN",
    )
    result = client.run(body)
    assert result.terminal["type"] == "RUN_FINISHED"
    context_id = session_value(result)["contextId"]
    [call] = kernel_calls(scripted_kernel, "SendStreamingMessage", context_id)
    message = call["params"]["message"]
    meta = message["metadata"]["iac_code"]
    assert message["role"] == "ROLE_USER" and message["parts"] == [{"text": "[ECHO] hi"}]
    assert meta["cwd"] == str(workspace.resolve()) and meta["preferredLanguage"] == "zh"
    assert meta["user_id"] == "u-1" and meta["channel"] == "web" and meta["iac_code_model"] == "m-1"
    assert meta["iac_code_api_key"] == "sk-secret-1"
    assert meta["thinking"] == {"enabled": True, "budget": 100}
    assert meta["run_mode"] == "normal" and meta["candidatePresentation"] == "rich-v1"
    assert meta["llm_headers"] == {"X-Trace": "t"} and meta["cleanupOnly"] is False
    assert meta["alibaba_cloud_access_key_secret"] == "SK-secret"
    assert meta["alibaba_cloud_security_token"] == "STS-secret"
    assert call["headers"]["a2a-version"] == "1.0"


def test_binding_conflicts(client: Client, tmp_path: Path, workspace: Path) -> None:
    thread = "thread-binding"
    assert client.run(run_body(thread_id=thread, cwd=str(workspace), userId="alice")).status == 200
    other = tmp_path / "other"
    other.mkdir()
    result = client.run(run_body(thread_id=thread, cwd=str(other), userId="alice"))
    assert result.status == 409 and result.error["code"] == "THREAD_BINDING_CONFLICT"
    result = client.run(run_body(thread_id=thread, cwd=str(workspace), userId="bob"))
    assert result.status == 409 and result.error["code"] == "THREAD_BINDING_CONFLICT"
    # another spelling of the same directory is the same workspace
    same = str(workspace) + "/./"
    assert client.run(run_body(thread_id=thread, cwd=same, userId="alice")).status == 200


def test_duplicate_and_conflicting_run_ids(client: Client, workspace: Path) -> None:
    body = run_body(
        thread_id="thread-dup",
        cwd=str(workspace),
        llmApiKey="key-1",
        alibabaCloud={"accessKeyId": "AK", "securityToken": "sts-1"},
    )
    assert client.run(body).status == 200
    again = client.run(body)
    assert again.status == 409 and again.error["code"] == "DUPLICATE_RUN_ID"
    refreshed = json.loads(json.dumps(body))
    refreshed["forwardedProps"]["iacCode"]["alibabaCloud"]["securityToken"] = "sts-2"
    refreshed["forwardedProps"]["iacCode"]["llmApiKey"] = "key-2"
    again = client.run(refreshed)
    assert again.status == 409 and again.error["code"] == "DUPLICATE_RUN_ID"
    changed = json.loads(json.dumps(body))
    changed["messages"][0]["content"] = "something else"
    again = client.run(changed)
    assert again.status == 409 and again.error["code"] == "RUN_ID_CONFLICT"


def test_busy_thread_and_release_before_the_final_event(client: Client, workspace: Path) -> None:
    thread = "thread-busy"
    slow = run_body("[SLOW]", thread_id=thread, cwd=str(workspace))
    response = requests.post(client.url, data=json.dumps(slow), headers=client.headers(), stream=True, timeout=30)
    chunks = response.iter_content(None)
    first = next(chunks)
    assert b"RUN_STARTED" in first
    busy = client.run(run_body(thread_id=thread, cwd=str(workspace)))
    assert busy.status == 409 and busy.error["code"] == "THREAD_BUSY"
    # send the next turn the moment RUN_FINISHED is read, before the stream has closed
    raw = first
    for chunk in chunks:
        raw += chunk
        if b'"RUN_FINISHED"' in raw:
            nxt = client.run(run_body(thread_id=thread, cwd=str(workspace)))
            assert nxt.status == 200, nxt.error
            break
    for chunk in chunks:
        raw += chunk
    response.close()
    check_stream(parse_sse(raw))


def test_concurrent_requests_on_one_thread_admit_exactly_one(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    thread = "thread-race"
    statuses: list[int] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        body = run_body("[SLOW]", thread_id=thread, cwd=str(workspace), run_id=f"r{i}")
        with requests.post(
            adapter.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30
        ) as r:
            with lock:
                statuses.append(r.status_code)
            if r.status_code == 200:
                for _ in r.iter_content(None):
                    pass

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 409, 409, 409, 409, 409]


def test_heartbeat_while_the_kernel_is_silent(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)
    body = run_body("[SILENT 40]", cwd=str(workspace))  # 40 s x delay_scale 0.05 = 2 s of silence
    started = time.monotonic()
    stamps: list[float] = []
    raw = b""
    with requests.post(adapter.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
        for chunk in r.iter_content(None):
            raw += chunk
            if b": heartbeat" in chunk:
                stamps.append(time.monotonic() - started)
    assert len(stamps) >= 4, stamps
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(0.15 < g < 1.2 for g in gaps), gaps  # every ~0.3 s, with room for a loaded CI machine
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_FINISHED"


def test_disconnect_cancels_the_kernel_task(make_adapter: Any, workspace: Path, scripted_kernel: Any) -> None:
    adapter = make_adapter(heartbeat_seconds=0.2)
    body = run_body("[SILENT 600] [SLOW]", cwd=str(workspace))  # 30 s of kernel silence
    host, port = adapter.url.split("//")[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    data = b""
    while b"iac-code.session.v1" not in data:
        data += sock.recv(65536)
    task_id = data.split(b'"taskId":"')[1].split(b'"')[0].decode()
    sock.close()
    deadline = time.monotonic() + 20  # noticed by a heartbeat write, long before the kernel speaks
    while time.monotonic() < deadline:
        if any(c["params"].get("id") == task_id for c in kernel_calls(scripted_kernel, "CancelTask")):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the adapter never sent CancelTask")
    task = requests.post(
        scripted_kernel.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}},
        headers={"A2A-Version": "1.0", "Authorization": "Bearer scripted-kernel-token"},
        timeout=5,
    ).json()
    assert task["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    # the thread is free again once the adapter has finished cleaning up
    deadline = time.monotonic() + 30
    while True:
        nxt = adapter.client().run(run_body(thread_id=body["threadId"], cwd=str(workspace)))
        if nxt.status != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert nxt.status == 200, nxt.error


def test_kernel_unavailable_mid_admission(make_adapter: Any, workspace: Path) -> None:
    from agui_adapter.kernel_client.launch import KernelProcess, free_port
    from tests.support.servers import InProcessAdapter

    base = make_adapter()
    dead = InProcessAdapter(base.settings, KernelProcess(f"http://127.0.0.1:{free_port()}/", "x", "dead"))
    try:
        result = dead.client().run(run_body(cwd=str(workspace)))
        assert result.status == 200
        assert result.types() == ["RUN_STARTED", "RUN_ERROR"]
        assert result.terminal["code"] == "A2A_UNAVAILABLE"
    finally:
        dead.stop()


def test_inline_images_reach_the_kernel(client: Client, workspace: Path) -> None:
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    body = run_body(cwd=str(workspace))
    body["messages"] = [
        {
            "id": "m1",
            "role": "user",
            "content": [
                {"type": "text", "text": "[IMAGES] look"},
                {
                    "type": "image",
                    "source": {"type": "data", "value": base64.b64encode(png).decode(), "mimeType": "image/png"},
                },
            ],
        }
    ]
    result = client.run(body)
    assert "Received 1 image(s): image/png" in result.text()


def test_turn_after_adapter_restart(adapter_process: Any, workspace: Path) -> None:
    thread = "thread-restart"
    first_proc = adapter_process()
    first = Client(first_proc.url).run(run_body("[RECALL]", thread_id=thread, cwd=str(workspace), ros="a"))
    first_proc.stop()
    second_proc = adapter_process()
    second = Client(second_proc.url).run(run_body("[RECALL]", thread_id=thread, cwd=str(workspace), ros="b"))
    assert "2 user turns" in second.text()
    assert session_value(first)["contextId"] == session_value(second)["contextId"]
    assert session_value(first)["sessionId"] == session_value(second)["sessionId"]
    again = Client(second_proc.url).run(run_body(thread_id=thread, cwd=str(workspace), run_id=first.events[0]["runId"]))
    assert again.status == 409 and again.error["code"] in ("DUPLICATE_RUN_ID", "RUN_ID_CONFLICT")


def test_a_body_closed_before_its_first_write_frees_the_thread(adapter: Any, workspace: Path) -> None:
    from agui_adapter.protocol.validation import validate_run_input

    engine = adapter.app.engine
    body = run_body(thread_id="thread-never-iterated", cwd=str(workspace))
    admission = engine.admit(validate_run_input(body), "en")
    engine.stream(admission).close()  # what a WSGI server does when the client is already gone
    again = adapter.client().run(run_body(thread_id="thread-never-iterated", cwd=str(workspace)))
    assert again.status == 200, again.error


def test_kernel_dies_mid_stream(tmp_path: Path, workspace: Path) -> None:
    from agui_adapter.config import Settings
    from agui_adapter.kernel_client.launch import KernelProcess
    from agui_adapter.scripted_kernel import ScriptedKernel
    from tests.support.servers import InProcessAdapter

    kernel = ScriptedKernel("t", delay_scale=0.05)
    kernel.start()
    adapter = InProcessAdapter(
        Settings(state_dir=str(tmp_path / "s"), allowed_cwds=str(tmp_path), heartbeat_seconds=0.2),
        KernelProcess(kernel.url, "t", "scripted"),
    )
    try:
        body = run_body("[SLOW]", cwd=str(workspace))
        with requests.post(
            adapter.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30
        ) as r:
            raw = b""
            chunks = r.iter_content(None)
            for chunk in chunks:
                raw += chunk
                if b"TEXT_MESSAGE_CONTENT" in raw:
                    break
            kernel.stop()
            for chunk in chunks:
                raw += chunk
        events = parse_sse(raw)
        check_stream(events)  # every span closed, one terminal event
        assert events[-1]["type"] == "RUN_ERROR"
        assert events[-1]["code"] in ("A2A_UNAVAILABLE", "A2A_EXECUTION_FAILED")
        # and the thread is not left busy
        again = adapter.client().run(run_body(thread_id=body["threadId"], cwd=str(workspace)))
        assert again.status == 200 and again.terminal["type"] == "RUN_ERROR"  # the kernel is gone
        assert again.terminal["code"] == "A2A_UNAVAILABLE"
    finally:
        adapter.stop()
        kernel.stop()
