"""Interrupts, Resume and cancel against the scripted kernel, over real sockets."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.agui_client import Client, resume, run_body, session_value
from tests.support.flow import FakeClock, interrupted, kernel_calls

PERMISSION_SCHEMA = {
    "type": "object",
    "properties": {"decision": {"type": "string", "enum": ["allow_once", "deny"]}},
    "required": ["decision"],
    "additionalProperties": False,
}


def test_permission_interrupt_shape(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    [tool] = result.of("TOOL_CALL_START")
    assert interrupt["reason"] == "tool_call"
    assert interrupt["id"].startswith("permission-")
    assert interrupt["toolCallId"] == tool["toolCallId"]
    assert interrupt["responseSchema"] == PERMISSION_SCHEMA
    assert interrupt["message"] and interrupt["expiresAt"].endswith("Z")
    meta = interrupt["metadata"]
    assert meta["schemaVersion"] == 1 and meta["kind"] == "permission"
    for key in ("toolName", "title", "purpose", "safeSummary", "options", "effect", "target", "isReadOnly"):
        assert key in meta, key
    expires = time.mktime(time.strptime(interrupt["expiresAt"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert 86000 < expires - time.time() < 86500
    assert session_value(result)["taskId"]


def test_allow_writes_once_and_continues(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    resumed = client.run(resume(body, answer))
    assert resumed.terminal["type"] == "RUN_FINISHED" and resumed.terminal["outcome"] == {"type": "success"}
    assert (workspace / "hello.txt").exists()
    [tool_result] = resumed.of("TOOL_CALL_RESULT")
    assert tool_result["toolCallId"] == interrupt["toolCallId"]
    assert "Tool finished" in resumed.text() and "I will write" not in resumed.text()
    first_ids = {e["messageId"] for e in result.of("TEXT_MESSAGE_START")}
    assert not first_ids & {e["messageId"] for e in resumed.of("TEXT_MESSAGE_START")}
    # the same answer again: already applied, the tool does not run again
    (workspace / "hello.txt").unlink()
    again = client.run(resume(body, answer))
    assert again.terminal["type"] == "RUN_ERROR" and again.terminal["code"] == "RESUME_ALREADY_APPLIED"
    assert not (workspace / "hello.txt").exists()


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "resolved", "payload": {"decision": "deny"}},
        {"status": "cancelled"},
    ],
)
def test_deny_and_cancelled_write_nothing(client: Client, workspace: Path, answer: dict) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    resumed = client.run(resume(body, [{"interruptId": interrupt["id"], **answer}]))
    assert resumed.terminal["type"] == "RUN_FINISHED"
    assert not (workspace / "hello.txt").exists()
    assert "denied" in resumed.of("TOOL_CALL_RESULT")[0]["content"]


def test_bad_answers_then_a_good_retry(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    iid = interrupt["id"]
    cases = [
        ([], "INCOMPLETE_RESUME"),
        (
            [
                {"interruptId": "nope", "status": "resolved", "payload": {"decision": "deny"}},
                {"interruptId": iid, "status": "resolved", "payload": {"decision": "deny"}},
            ],
            "UNKNOWN_INTERRUPT",
        ),
        ([{"interruptId": iid, "status": "resolved", "payload": {"decision": "deny"}}] * 2, "INCOMPLETE_RESUME"),
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
        assert failed.types() == ["RUN_STARTED", "RUN_ERROR"], failed.types()
        assert failed.terminal["code"] == code, (answers, failed.terminal)
    new_turn = client.run(run_body("hi", thread_id=body["threadId"], cwd=str(workspace), ros="other"))
    assert new_turn.status == 409 and new_turn.error["code"] == "RESUME_REQUIRED"
    wrong_ros = client.run(
        resume(body, [{"interruptId": iid, "status": "resolved", "payload": {"decision": "allow_once"}}])
        | {"forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "other", "cwd": str(workspace)}}}
    )
    assert wrong_ros.status == 409 and wrong_ros.error["code"] == "EXECUTION_LOST"
    ok = client.run(resume(body, [{"interruptId": iid, "status": "resolved", "payload": {"decision": "allow_once"}}]))
    assert ok.terminal["type"] == "RUN_FINISHED"
    assert (workspace / "hello.txt").read_text() == "hello from scripted kernel\n"


def test_question_interrupt_and_answer_by_option(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body, result = interrupted(client, workspace, "[ASK] where?")
    [interrupt] = result.terminal["outcome"]["interrupts"]
    assert interrupt["reason"] == "input_required"
    assert "cn-hangzhou" in interrupt["message"]
    assert [o["id"] for o in interrupt["metadata"]["options"]] == ["hz", "sh"]
    schema = interrupt["responseSchema"]
    assert schema["properties"]["selectedId"]["enum"] == ["hz", "sh"]
    bad = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"selectedId": "nope"}}])
    )
    assert bad.terminal["code"] == "RESUME_PAYLOAD_INVALID"
    ok = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"selectedId": "sh"}}])
    )
    assert ok.terminal["type"] == "RUN_FINISHED"
    assert "cn-shanghai" in ok.text()
    sent = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(result)["contextId"])[-1]
    assert sent["params"]["message"]["parts"] == [{"text": "cn-shanghai"}]
    assert sent["params"]["message"]["taskId"] == session_value(result)["taskId"]


def test_question_free_text(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace, "[ASK] where?")
    [interrupt] = result.terminal["outcome"]["interrupts"]
    ok = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"freeText": "eu-west"}}])
    )
    assert ok.terminal["type"] == "RUN_FINISHED" and "eu-west" in ok.text()


def test_cancelled_question_cancels_the_execution(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace, "[ASK] where?")
    [interrupt] = result.terminal["outcome"]["interrupts"]
    done = client.run(resume(body, [{"interruptId": interrupt["id"], "status": "cancelled"}]))
    assert done.terminal["code"] == "CANCELLED"
    # the thread is free for a new turn
    assert client.run(run_body(thread_id=body["threadId"], cwd=str(workspace), ros="n2")).status == 200


def test_expired_interrupt(make_adapter: Any, workspace: Path, scripted_kernel: Any) -> None:
    clock = FakeClock()
    adapter = make_adapter(interrupt_ttl_seconds=60, clock=clock)
    client = adapter.client()
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    clock.advance(61)
    late = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}])
    )
    assert late.terminal["code"] == "EXECUTION_EXPIRED"
    assert not (workspace / "hello.txt").exists()
    task_id = session_value(result)["taskId"]
    assert any(c["params"].get("id") == task_id for c in kernel_calls(scripted_kernel, "CancelTask"))
    again = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}])
    )
    assert again.terminal["code"] == "EXECUTION_LOST"


def test_new_turn_after_expiry_is_allowed(make_adapter: Any, workspace: Path) -> None:
    clock = FakeClock()
    client = make_adapter(interrupt_ttl_seconds=60, clock=clock).client()
    body, _ = interrupted(client, workspace)
    clock.advance(61)
    assert client.run(run_body(thread_id=body["threadId"], cwd=str(workspace), ros="n")).status == 200


def test_interrupt_survives_adapter_kill(adapter_process: Any, workspace: Path) -> None:
    first = adapter_process()
    body, result = interrupted(Client(first.url), workspace)
    first.kill()
    second = adapter_process()
    [interrupt] = result.terminal["outcome"]["interrupts"]
    ok = Client(second.url).run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}])
    )
    assert ok.terminal["type"] == "RUN_FINISHED"
    assert (workspace / "hello.txt").exists()


def test_persistence_failure_fails_closed(
    adapter: Any, workspace: Path, scripted_kernel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agui_adapter.state.store import StoreError, ThreadStore

    real_save = ThreadStore.save

    def failing_save(self: ThreadStore, record: Any, **kw: Any) -> None:
        if record.execution.pending:
            raise StoreError("disk full (simulated)")
        real_save(self, record, **kw)

    monkeypatch.setattr(ThreadStore, "save", failing_save)
    result = adapter.client().run(run_body("[WRITE] x", cwd=str(workspace)))
    assert result.terminal["type"] == "RUN_ERROR"
    assert result.terminal["code"] == "STATE_PERSISTENCE_FAILED"
    task_id = session_value(result)["taskId"] if result.of("CUSTOM") else None
    cancels = kernel_calls(scripted_kernel, "CancelTask")
    assert task_id is None or any(c["params"].get("id") == task_id for c in cancels)
    assert cancels


def test_state_files_hold_no_secrets(client: Client, workspace: Path, tmp_path: Path) -> None:
    secrets = ["sk-LLM-SECRET-123", "AK-SECRET-456", "STS-TOKEN-789"]
    body, result = interrupted(
        client,
        workspace,
        llmApiKey=secrets[0],
        alibabaCloud={"accessKeyId": "id", "accessKeySecret": secrets[1], "securityToken": secrets[2]},
    )
    [interrupt] = result.terminal["outcome"]["interrupts"]
    client.run(
        resume(
            body,
            [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}],
            llmApiKey=secrets[0],
        )
    )
    files = list((tmp_path / "state").rglob("*"))
    assert any(f.suffix == ".json" for f in files)
    for path in files:
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, path
            if path.suffix == ".json":
                assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "state" / "threads").stat().st_mode & 0o777) == "0o700"


def test_cancel_endpoint(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body = run_body("[SLOW]", cwd=str(workspace))
    with requests.post(client.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
        raw = b""
        chunks = r.iter_content(None)
        for chunk in chunks:
            raw += chunk
            if b"iac-code.session.v1" in raw:
                break
        session = json.loads(raw.split(b"data: ")[2].split(b"\n\n")[0])["value"]
        url_id = session["executionId"]
        wrong = client.cancel(url_id, {"threadId": body["threadId"], "rosInvocationId": "wrong"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "EXECUTION_NOT_FOUND"
        assert client.cancel("nope", {"threadId": body["threadId"], "rosInvocationId": "inv-1"}).status_code == 404
        assert client.cancel(url_id, {"threadId": body["threadId"]}).status_code == 400
        ok = client.cancel(url_id, {"threadId": body["threadId"], "rosInvocationId": "inv-1"})
        assert ok.status_code == 200 and ok.json() == {"executionId": url_id, "status": "cancelled"}
        for chunk in chunks:
            raw += chunk
    from tests.support.agui_stream import check_stream, parse_sse

    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    again = client.cancel(url_id, {"threadId": body["threadId"], "rosInvocationId": "inv-1"})
    assert again.json()["status"] == "already_terminal"
    wrong = client.cancel(url_id, {"threadId": body["threadId"], "rosInvocationId": "wrong"})
    assert wrong.status_code == 404


def test_cancel_pending_interrupt(client: Client, workspace: Path) -> None:
    body, result = interrupted(client, workspace)
    session = session_value(result)
    ok = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": "inv-1"})
    assert ok.json()["status"] == "cancelled"
    [interrupt] = result.terminal["outcome"]["interrupts"]
    late = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}])
    )
    assert late.terminal["code"] == "EXECUTION_LOST"
    assert client.run(run_body(thread_id=body["threadId"], cwd=str(workspace), ros="x")).status == 200


def test_read_only_state_dir_fails_closed(adapter: Any, workspace: Path, tmp_path: Path, scripted_kernel: Any) -> None:
    """A real write failure (an immutable directory), not a simulated one."""
    import os
    import subprocess

    threads = tmp_path / "state" / "threads"
    body = run_body("[SILENT 20] [WRITE] x", cwd=str(workspace))  # 1 s of kernel silence first
    with requests.post(adapter.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
        chunks = r.iter_content(None)
        raw = b""
        for chunk in chunks:
            raw += chunk
            if b"iac-code.session.v1" in raw:
                break
        if subprocess.run(["chattr", "+i", str(threads)], capture_output=True).returncode != 0:
            if os.environ.get("CI") == "true":
                pytest.fail("chattr +i is needed for this test")
            pytest.skip("chattr +i is not available here")
        try:
            for chunk in chunks:
                raw += chunk
        finally:
            subprocess.run(["chattr", "-i", str(threads)], check=True)
    from tests.support.agui_stream import check_stream, parse_sse

    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "STATE_PERSISTENCE_FAILED"
    task_id = raw.split(b'"taskId":"')[1].split(b'"')[0].decode()
    assert any(c["params"].get("id") == task_id for c in kernel_calls(scripted_kernel, "CancelTask"))
    # nothing was announced that could not be resumed
    assert b'"interrupt"' not in raw


def test_session_backup_not_ready_is_retryable(client: Client, workspace: Path, scripted_kernel: Any) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    session_id = session_value(result)["sessionId"]
    scripted_kernel.state.backup_not_ready.add(session_id)
    try:
        early = client.run(resume(body, answer))
    finally:
        scripted_kernel.state.backup_not_ready.discard(session_id)
    assert early.terminal["type"] == "RUN_ERROR" and early.terminal["code"] == "SESSION_BACKUP_NOT_READY"
    assert not (workspace / "hello.txt").exists()
    retry = client.run(resume(body, answer))  # the interrupt stayed pending
    assert retry.terminal["type"] == "RUN_FINISHED" and (workspace / "hello.txt").exists()


def test_cancel_before_the_kernel_named_its_task(adapter: Any, workspace: Path, scripted_kernel: Any) -> None:
    """Cancelled between admission and the kernel's first frame: the work still stops."""
    from agui_adapter.protocol.validation import validate_run_input
    from tests.support.agui_stream import check_stream, parse_sse

    engine = adapter.app.engine
    body = run_body("[SLOW]", cwd=str(workspace))
    admission = engine.admit(validate_run_input(body), "en")
    execution_id = admission.record.execution.execution_id
    assert engine.cancel_execution(body["threadId"], "inv-1", execution_id) == "cancelled"
    raw = b"".join(engine.stream(admission))
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    task_id = raw.split(b'"taskId":"')[1].split(b'"')[0].decode()
    assert any(c["params"].get("id") == task_id for c in kernel_calls(scripted_kernel, "CancelTask"))
