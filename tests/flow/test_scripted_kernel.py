"""Tests for the embedded scripted kernel, driven through real sockets.

The scripted kernel stands in for iac-code 0.16.0 in the fast suite and in
benchmarks, so these tests pin the wire dialect the adapter relies on: frame
order, key presence, float numbers, messageId conventions, error shapes and
the interrupt / cancel / subscribe flows. Expected shapes are copied from the
real kernel's captures (the captures themselves are not read at test time).
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.kernel_rpc import (
    SSE,
    a2a_headers,
    frames,
    iac,
    kind,
    message,
    new_ctx,
    rpc,
    rpc_error,
    state,
    text_of,
    update,
)
from tests.support.servers import ROOT

TOKEN = "test-token"
HEADERS = a2a_headers(TOKEN)
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def kernel() -> Iterator[ScriptedKernel]:
    with ScriptedKernel(TOKEN, delay_scale=0.1) as k:
        yield k


def delta_texts(all_frames: list[dict[str, Any]], task_id: str) -> list[str]:
    return [
        text_of(f)
        for f in all_frames
        if kind(f) == "statusUpdate" and update(f)["status"].get("message", {}).get("messageId") == f"{task_id}-message"
    ]


def start_turn(kernel: ScriptedKernel, params: dict[str, Any]) -> tuple[SSE, str]:
    """Start a streaming turn and return the reader positioned after the task frame."""
    reader = SSE(rpc(kernel, "SendStreamingMessage", params, stream=True))
    first = next(reader)
    assert kind(first) == "task"
    return reader, first["result"]["task"]["id"]


# --------------------------------------------------------------------------- normal turn


def test_normal_turn_matches_capture_01(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    params = message("Say hello.", context_id=ctx, cwd=str(tmp_path / "ws1"), preferredLanguage="en")
    response = rpc(kernel, "SendStreamingMessage", params, stream=True)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Accel-Buffering"] == "no"
    assert "Content-Length" not in response.headers
    raw = response.content.decode("utf-8")
    got = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert raw.count("\n\n") == len(got) == 9

    assert all(f["id"] == "req-1" and f["jsonrpc"] == "2.0" for f in got)
    assert [kind(f) for f in got] == ["task"] + ["statusUpdate"] * 8
    task = got[0]["result"]["task"]
    task_id = task["id"]
    assert uuid.UUID(task_id)
    assert task["status"] == {"state": "TASK_STATE_SUBMITTED"}
    assert task["history"] == [
        {
            "messageId": params["message"]["messageId"],
            "contextId": ctx,
            "taskId": task_id,
            "role": "ROLE_USER",
            "parts": [{"text": "Say hello."}],
            "metadata": {"iac_code": {"cwd": str(tmp_path / "ws1"), "preferredLanguage": "en"}},
        }
    ]
    states = [state(f) for f in got[1:]]
    assert states == ["TASK_STATE_SUBMITTED"] + ["TASK_STATE_WORKING"] * 6 + ["TASK_STATE_INPUT_REQUIRED"]
    # Timestamps: on SUBMITTED, WORKING, the final repeat and INPUT_REQUIRED only.
    stamped = ["timestamp" in update(f)["status"] for f in got[1:]]
    assert stamped == [True, True, False, False, False, False, True, True]
    session = iac(got[1])["iacCodeSessionId"]
    assert uuid.UUID(session)
    assert all(iac(f)["iacCodeSessionId"] == session for f in got[1:])
    assert all(update(f)["taskId"] == task_id and update(f)["contextId"] == ctx for f in got[1:])

    assert delta_texts(got, task_id) == ["Hello", " from the", " scripted kernel."]
    delta = update(got[3])["status"]["message"]
    assert delta == {
        "messageId": f"{task_id}-message",
        "contextId": ctx,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": [{"text": "Hello"}],
    }
    assert iac(got[6])["usage"] == {
        "cachedInputTokens": 0.0,
        "provider": "openai",
        "totalTokens": 18.0,
        "inputTokens": 11.0,
        "outputTokens": 7.0,
        "model": "other",
    }
    assert '"inputTokens":11.0' in raw  # floats on the wire, as protobuf Struct writes them
    final = update(got[7])
    assert final["status"]["message"]["messageId"] == f"{task_id}-2"
    assert text_of(got[7]) == "Hello from the scripted kernel."
    assert final["metadata"]["iac_code"]["assistantFinal"] == {"complete": True}
    assert set(iac(got[8])) == {"iacCodeSessionId"}  # end of turn: no iac_code.input

    task_now = rpc(kernel, "GetTask", {"id": task_id}).json()["result"]
    assert task_now["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert [m["messageId"] for m in task_now["history"]] == [f"{task_id}-message"] * 3 + [f"{task_id}-2"]
    assert task_now["metadata"]["iac_code"]["executionControl"]["taskId"] == task_id


def test_followup_reuses_session_and_recall_counts_turns(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    first = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    second = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("[RECALL] again", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    assert first[0]["result"]["task"]["id"] != second[0]["result"]["task"]["id"]
    assert iac(first[1])["iacCodeSessionId"] == iac(second[1])["iacCodeSessionId"]
    assert text_of(second[-2]) == "This context has seen 2 user turns."


def test_missing_context_id_is_generated(kernel: ScriptedKernel) -> None:
    got = frames(rpc(kernel, "SendStreamingMessage", message("hi")))
    ctx = got[0]["result"]["task"]["contextId"]
    assert ctx and all(update(f)["contextId"] == ctx for f in got[1:])
    assert state(got[-1]) == "TASK_STATE_INPUT_REQUIRED"


# --------------------------------------------------------------------------- transport errors


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "health"),
        ("POST", ""),
        ("GET", "_scripted/requests"),
        ("GET", "iac-code/pipeline/state"),
    ],
)
def test_auth_required_on_every_route(kernel: ScriptedKernel, method: str, path: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        response = requests.request(method, kernel.url + path, headers=headers, json={}, timeout=5)
        assert response.status_code == 401
        assert response.json() == {"error": "Unauthorized"}


def test_health(kernel: ScriptedKernel) -> None:
    response = requests.get(kernel.url + "health", headers=HEADERS, timeout=5)
    assert response.json() == {
        "status": "healthy",
        "version": "scripted",
        "mode": "normal",
    }


def test_missing_a2a_version_header(kernel: ScriptedKernel) -> None:
    response = rpc(
        kernel,
        "GetTask",
        {"id": "x"},
        rid="x",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 200
    assert response.json() == {
        "error": {
            "code": -32009,
            "message": "A2A version '0.3' is not supported by this handler. Expected version '1.0'.",
            "data": [
                {
                    "@type": ERROR_INFO,
                    "reason": "VERSION_NOT_SUPPORTED",
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ],
        },
        "id": "x",
        "jsonrpc": "2.0",
    }


def test_unknown_method(kernel: ScriptedKernel) -> None:
    response = rpc(kernel, "message/stream", {}, rid="x")
    assert response.json() == {
        "error": {"code": -32601, "message": "Method not found"},
        "id": "x",
        "jsonrpc": "2.0",
    }


def test_streaming_error_is_plain_json(kernel: ScriptedKernel) -> None:
    params = message("hi")
    params["message"]["role"] = "ROLE_AGENT"
    error = rpc_error(rpc(kernel, "SendStreamingMessage", params, stream=True))
    assert error["code"] == -32602
    assert error["data"][0]["reason"] == "INVALID_PARAMS"


def test_gettask_unknown_and_cancel_not_running(kernel: ScriptedKernel) -> None:
    assert rpc(kernel, "GetTask", {"id": "nope"}, rid="req-16").json() == {
        "error": {
            "code": -32001,
            "message": "Task not found",
            "data": [
                {
                    "@type": ERROR_INFO,
                    "reason": "TASK_NOT_FOUND",
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ],
        },
        "id": "req-16",
        "jsonrpc": "2.0",
    }
    done = frames(rpc(kernel, "SendStreamingMessage", message("hi")))
    task_id = done[0]["result"]["task"]["id"]
    assert rpc(kernel, "CancelTask", {"id": task_id}, rid="req-15").json() == {
        "error": {
            "code": -32002,
            "message": "Task cannot be canceled",
            "data": [
                {
                    "@type": ERROR_INFO,
                    "reason": "TASK_NOT_CANCELABLE",
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ],
        },
        "id": "req-15",
        "jsonrpc": "2.0",
    }


# --------------------------------------------------------------------------- permission flow


def _write_wait(kernel: ScriptedKernel, ctx: str, cwd: Path, **iac_extra: Any) -> tuple[str, dict[str, Any]]:
    got = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("[WRITE] create hello.txt", context_id=ctx, cwd=str(cwd), **iac_extra),
        )
    )
    task_id = got[0]["result"]["task"]["id"]
    tools = [iac(f)["tool"] for f in got if kind(f) == "statusUpdate" and "tool" in iac(f)]
    assert [t["status"] for t in tools] == [
        "started",
        "input_delta",
        "input_delta",
        "input_complete",
    ]
    assert all(isinstance(t["partialJsonLength"], float) for t in tools[1:3])
    assert tools[3]["toolInput"] == {
        "content": "hello from scripted kernel\n",
        "path": "hello.txt",
    }
    assert "usage" in iac(got[-2])
    last = got[-1]
    assert state(last) == "TASK_STATE_INPUT_REQUIRED" and "timestamp" not in update(last)["status"]
    envelope = iac(last)["input"]
    assert iac(last)["permission"] == {
        "pending": True,
        "toolUseId": envelope["toolUseId"],
        "toolName": "write_file",
        "autoApproved": False,
    }
    return task_id, envelope


def _answer(task_id: str, envelope: dict[str, Any], decision: str) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "kind": "permission",
        "requestTaskId": task_id,
        "inputId": envelope["inputId"],
        "toolUseId": envelope["toolUseId"],
        "decision": decision,
    }


def _data_part(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"data": data, "mediaType": "application/json"}]


def test_permission_allow_writes_file_once(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx, cwd = new_ctx(), tmp_path / "ws2"
    task_id, envelope = _write_wait(kernel, ctx, cwd, preferredLanguage="en")
    assert envelope["schemaVersion"] == 1.0 and isinstance(envelope["schemaVersion"], float)
    assert re.fullmatch(r"permission-[0-9a-f]{32}", envelope["inputId"])
    assert {k: envelope[k] for k in ("kind", "required", "language", "requestTaskId", "contextId")} == {
        "kind": "permission",
        "required": True,
        "language": "en",
        "requestTaskId": task_id,
        "contextId": ctx,
    }
    assert envelope["options"] == [
        {"id": "allow_once", "label": "Allow once"},
        {"id": "deny", "label": "Deny"},
    ]
    assert envelope["safeSummary"].startswith('write_file: {"content":{"fingerprint":"sha256:')
    for key in (
        "toolName",
        "title",
        "purpose",
        "effect",
        "target",
        "isReadOnly",
        "prompt",
    ):
        assert key in envelope

    pending = rpc(kernel, "GetTask", {"id": task_id}).json()["result"]
    assert pending["status"] == {"state": "TASK_STATE_INPUT_REQUIRED"}
    assert pending["metadata"]["iac_code"]["input"] == envelope
    assert pending["metadata"]["iac_code"]["permission"]["pending"] is True
    assert not (cwd / "hello.txt").exists()

    params = message(
        context_id=ctx,
        task_id=task_id,
        cwd=str(cwd),
        parts=_data_part(_answer(task_id, envelope, "allow_once")),
    )
    got = frames(rpc(kernel, "SendStreamingMessage", params, rid="req-4"))
    assert kind(got[0]) == "statusUpdate"  # a continuation has no task frame
    assert update(got[0])["metadata"] == {
        "iac_code": {
            "inputReceived": {
                "toolUseId": envelope["toolUseId"],
                "kind": "permission",
                "inputId": envelope["inputId"],
            }
        }
    }
    assert kind(got[1]) == "artifactUpdate"
    artifact_update = got[1]["result"]["artifactUpdate"]
    path = str(cwd / "hello.txt")
    assert artifact_update["lastChunk"] is True
    part = artifact_update["artifact"]["parts"][0]
    assert part["filename"] == "hello.txt" and part["metadata"]["sourcePath"] == path
    assert part["metadata"]["byteSize"] == 27.0
    completed = iac(got[2])["tool"]
    assert completed["status"] == "completed"
    assert completed["result"] == f"Successfully wrote 1 lines to {path}"
    assert completed["artifact"]["artifactId"] == artifact_update["artifact"]["artifactId"]
    assert delta_texts(got, task_id) == [
        "Tool finished. ",
        "Result: ",
        completed["result"],
    ]
    assert text_of(got[-2]) == f"Tool finished. Result: {completed['result']}"
    assert state(got[-1]) == "TASK_STATE_INPUT_REQUIRED" and "input" not in iac(got[-1])
    assert (cwd / "hello.txt").read_text() == "hello from scripted kernel\n"

    after = rpc(kernel, "GetTask", {"id": task_id}).json()["result"]
    assert "input" not in after["metadata"]["iac_code"]
    assert after["artifacts"][0]["artifactId"] == artifact_update["artifact"]["artifactId"]

    # Answering again is rejected: the file is written exactly once.
    (cwd / "hello.txt").write_text("changed")
    error = rpc_error(rpc(kernel, "SendStreamingMessage", params, rid="req-18", stream=True))
    assert error["message"] == "permission_resume_invalid: pending permission is not active."
    assert (cwd / "hello.txt").read_text() == "changed"


def test_permission_deny_via_sendmessage_writes_nothing(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx, cwd = new_ctx(), tmp_path / "ws3"
    result = rpc(kernel, "SendMessage", message("[WRITE] x", context_id=ctx, cwd=str(cwd))).json()["result"]
    task = result["task"]
    assert task["status"] == {"state": "TASK_STATE_INPUT_REQUIRED"}
    assert [m["parts"][0]["text"] for m in task["history"]] == ["I will write the file now."]
    envelope = task["metadata"]["iac_code"]["input"]
    params = message(
        context_id=ctx,
        task_id=task["id"],
        parts=_data_part(_answer(task["id"], envelope, "deny")),
    )
    done = rpc(kernel, "SendMessage", params).json()["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert "input" not in done["metadata"]["iac_code"]
    texts = [m["parts"][0]["text"] for m in done["history"]]
    assert texts[-1] == "Tool finished. Result: The user denied permission to run write_file."
    assert not cwd.exists() or not (cwd / "hello.txt").exists()


def test_permission_answer_errors(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    task_id, envelope = _write_wait(kernel, ctx, tmp_path, preferredLanguage="zh")
    assert envelope["language"] == "zh" and envelope["options"][0]["label"] == "仅允许一次"

    wrong = dict(_answer(task_id, envelope, "allow_once"), inputId="permission-" + "0" * 32)
    response = rpc(
        kernel,
        "SendStreamingMessage",
        message(context_id=ctx, task_id=task_id, parts=_data_part(wrong)),
        rid="req-18",
    )
    assert response.json() == {
        "error": {
            "code": -32602,
            "message": "permission_resume_invalid: pending permission is not active.",
            "data": [
                {
                    "@type": ERROR_INFO,
                    "reason": "INVALID_PARAMS",
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ],
        },
        "id": "req-18",
        "jsonrpc": "2.0",
    }
    extra = dict(_answer(task_id, envelope, "allow_once"), note="x")
    missing = _answer(task_id, envelope, "allow_once")
    del missing["toolUseId"]
    for payload in (extra, missing, dict(_answer(task_id, envelope, "maybe"))):
        error = rpc_error(
            rpc(
                kernel,
                "SendStreamingMessage",
                message(context_id=ctx, task_id=task_id, parts=_data_part(payload)),
            )
        )
        assert error["message"] == "Permission response payload fields do not match schemaVersion 1."
    # The wait is still answerable after rejected attempts.
    still = rpc(kernel, "GetTask", {"id": task_id}).json()["result"]
    assert still["metadata"]["iac_code"]["input"]["inputId"] == envelope["inputId"]


# --------------------------------------------------------------------------- ask flow


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("cn-hangzhou", {"selectedId": "hz", "selectedLabel": "cn-hangzhou"}),
        ("somewhere in Europe", {"freeText": "somewhere in Europe"}),
    ],
)
def test_ask_question_and_answer(kernel: ScriptedKernel, tmp_path: Path, answer: str, expected: dict[str, str]) -> None:
    ctx = new_ctx()
    got = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("[ASK] deploy", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    task_id = got[0]["result"]["task"]["id"]
    tools = [iac(f)["tool"]["status"] for f in got if kind(f) == "statusUpdate" and "tool" in iac(f)]
    assert tools == ["started", "input_complete"]
    envelope = iac(got[-1])["input"]
    tool_use_id = envelope["toolUseId"]
    assert envelope == {
        "schemaVersion": 1.0,
        "kind": "ask_user_question",
        "required": True,
        "requestTaskId": task_id,
        "contextId": ctx,
        "inputId": f"ask-{tool_use_id}",
        "toolUseId": tool_use_id,
        "prompt": "Which region should host the site?",
        "allowFreeText": True,
        "options": [
            {"id": "hz", "label": "cn-hangzhou"},
            {"id": "sh", "label": "cn-shanghai"},
        ],
    }
    assert "permission" not in iac(got[-1])

    reply = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message(answer, context_id=ctx, task_id=task_id),
        )
    )
    assert iac(reply[0])["inputReceived"] == {
        "kind": "ask_user_question",
        "inputId": f"ask-{tool_use_id}",
        "toolUseId": tool_use_id,
        **expected,
    }
    assert iac(reply[1])["tool"] == {
        "toolUseId": tool_use_id,
        "result": f"User answered: {answer}",
        "name": "ask_user_question",
        "status": "completed",
    }
    choice = expected.get("selectedLabel", answer)
    assert text_of(reply[-2]) == f"You chose {choice}."
    assert state(reply[-1]) == "TASK_STATE_INPUT_REQUIRED" and "input" not in iac(reply[-1])


# --------------------------------------------------------------------------- cancel, busy, subscribe


def test_cancel_during_slow_stream(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    reader, task_id = start_turn(kernel, message("[SLOW] tell me slowly", context_id=ctx, cwd=str(tmp_path)))
    seen = []
    for frame in reader:
        seen.append(frame)
        if text_of(frame):
            break
    canceled = rpc(kernel, "CancelTask", {"id": task_id}, rid="req-14").json()["result"]
    assert canceled["id"] == task_id
    cancel_status = canceled["status"]
    assert cancel_status["state"] == "TASK_STATE_CANCELED"
    assert cancel_status["message"]["messageId"] == f"{task_id}-5"
    assert cancel_status["message"]["parts"] == [{"text": "Task canceled."}]
    assert "timestamp" in cancel_status
    assert canceled["history"][0]["messageId"] == f"{task_id}-message"

    rest = list(reader)  # the stream ends right after CANCELED
    assert [state(f) for f in rest][-1] == "TASK_STATE_CANCELED"
    assert update(rest[-1])["status"] == cancel_status
    assert iac(rest[-1]) == {"iacCodeSessionId": iac(seen[0])["iacCodeSessionId"]}
    assert len(delta_texts(seen + rest, task_id)) < 10

    assert rpc(kernel, "GetTask", {"id": task_id}).json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    assert rpc_error(rpc(kernel, "CancelTask", {"id": task_id}))["code"] == -32002
    # The context is free again.
    after = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    assert state(after[-1]) == "TASK_STATE_INPUT_REQUIRED"


def test_concurrent_turn_in_same_context_fails(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    reader, running_id = start_turn(kernel, message("[SLOW] x", context_id=ctx, cwd=str(tmp_path)))
    next(reader)  # SUBMITTED: the run is registered
    got = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("are you there?", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    assert len(got) == 2
    task = got[0]["result"]["task"]
    assert task["metadata"]["iac_code"]["executionControl"]["taskId"] == running_id
    failed = update(got[1])
    assert failed["status"]["state"] == "TASK_STATE_FAILED"
    assert failed["status"]["message"]["messageId"] == f"{task['id']}-4"
    assert text_of(got[1]) == "Task is already working."
    assert "metadata" not in failed
    rpc(kernel, "CancelTask", {"id": running_id})
    assert state(list(reader)[-1]) == "TASK_STATE_CANCELED"


def test_workspace_rules(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=ctx, cwd=str(tmp_path / "a")),
        )
    )
    other = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=ctx, cwd=str(tmp_path / "b")),
        )
    )
    assert [kind(f) for f in other] == ["task", "statusUpdate"]
    assert "metadata" not in other[0]["result"]["task"]
    assert text_of(other[1]) == "ValueError: A2A context belongs to a different workspace"
    assert state(other[1]) == "TASK_STATE_FAILED"

    bad = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=new_ctx(), cwd="relative/dir"),
        )
    )
    assert bad[0]["result"]["task"]["metadata"] == {}
    assert text_of(bad[1]) == "Invalid A2A workspace metadata."
    assert update(bad[1])["status"]["message"]["messageId"].endswith("-4")


def test_subscribe_to_running_task(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    reader, task_id = start_turn(kernel, message("[SLOW] go", context_id=ctx, cwd=str(tmp_path)))
    next(reader)
    sub = SSE(rpc(kernel, "SubscribeToTask", {"id": task_id}, rid="req-48", stream=True))
    first = next(sub)
    assert first["id"] == "req-48"
    snapshot = first["result"]["task"]
    assert snapshot["id"] == task_id and snapshot["status"]["state"] in (
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
    )
    assert snapshot["metadata"]["iac_code"]["executionControl"]["executionStatus"] == "working"
    live = list(sub)
    primary = list(reader)
    assert state(live[-1]) == state(primary[-1]) == "TASK_STATE_INPUT_REQUIRED"
    assert text_of(live[-2]) == text_of(primary[-2])
    error = rpc_error(rpc(kernel, "SubscribeToTask", {"id": task_id}))
    assert error["code"] == -32001 and error["message"] == f"Task {task_id} is not active"


def test_client_disconnect_does_not_stop_the_task(kernel: ScriptedKernel) -> None:
    reader, task_id = start_turn(kernel, message("[SLOW] bye"))
    reader.response.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = rpc(kernel, "GetTask", {"id": task_id}).json()["result"]["status"]["state"]
        if status == "TASK_STATE_INPUT_REQUIRED":
            break
        time.sleep(0.05)
    assert status == "TASK_STATE_INPUT_REQUIRED"


# --------------------------------------------------------------------------- other scripts


def test_fast_streams_n_deltas(kernel: ScriptedKernel) -> None:
    got = frames(rpc(kernel, "SendStreamingMessage", message("[FAST 1000]"), stream=True))
    task_id = got[0]["result"]["task"]["id"]
    assert delta_texts(got, task_id) == ["x"] * 1000
    assert text_of(got[-2]) == "x" * 1000
    assert state(got[-1]) == "TASK_STATE_INPUT_REQUIRED"


def test_think_and_progress_tool_trace(kernel: ScriptedKernel, tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("line one\nline two\n")
    got = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("[THINK][PROGRESS] look", cwd=str(tmp_path)),
        )
    )
    task_id = got[0]["result"]["task"]["id"]

    def label(frame: dict[str, Any]) -> str:
        if kind(frame) != "statusUpdate":
            return kind(frame)
        meta = iac(frame)
        for key in ("thinking", "tool", "usage", "assistantFinal"):
            if key in meta:
                return f"{key}:{meta['tool']['status']}" if key == "tool" else key
        return "text" if text_of(frame) else state(frame)

    assert [label(f) for f in got] == [
        "task",
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "thinking",
        "thinking",
        "text",
        "tool:started",
        "tool:input_delta",
        "tool:input_delta",
        "tool:input_complete",
        "usage",
        "tool:progress",
        "tool:progress",
        "artifactUpdate",
        "tool:completed",
        "text",
        "usage",
        "assistantFinal",
        "TASK_STATE_INPUT_REQUIRED",
    ]
    assert iac(got[3])["thinking"] == {"text": "Let me think", "type": "raw_thinking"}
    progress = iac(got[11])["tool"]
    assert set(progress) == {"status", "toolUseId", "name", "mcp", "mcpProgress"}
    assert set(progress["mcp"]) == {
        "serverName",
        "toolName",
        "progress",
        "total",
        "message",
    }
    completed = iac(got[14])["tool"]
    assert completed["result"] == f"Read 2 lines from {tmp_path / 'notes.md'}"
    assert completed["artifact"]["sourcePath"] == str(tmp_path / "notes.md")
    assert delta_texts(got, task_id) == ["I will read the file.", "Done."]
    assert text_of(got[-2]) == "Done."


def test_fail_script_matches_capture_23(kernel: ScriptedKernel) -> None:
    got = frames(rpc(kernel, "SendStreamingMessage", message("[FAIL] please")))
    task_id = got[0]["result"]["task"]["id"]
    assert [state(f) for f in got[1:]] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_FAILED",
        "TASK_STATE_WORKING",
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
    ]
    failed = update(got[3])
    assert failed["status"]["message"]["messageId"] == f"{task_id}-message"
    assert text_of(got[3]) == "RetryableError: InternalServerError: Error code: 500 - scripted upstream failure"
    assert failed["metadata"]["iac_code"]["error"]["retryable"] is False
    assert iac(got[4])["usage"] == {
        "cachedInputTokens": 0.0,
        "totalTokens": 0.0,
        "inputTokens": 0.0,
        "outputTokens": 0.0,
    }
    assert iac(got[5])["assistantFinal"] == {"complete": True} and "message" not in update(got[5])["status"]


def test_images_echo_and_invalid_image(kernel: ScriptedKernel) -> None:
    png = "iVBORw0KGgo="
    parts = [
        {"text": "[IMAGES] look"},
        {"data": {"filename": "a.png", "bytes": png}, "mediaType": "image/png"},
        {"raw": "/9j/4AAQ", "mediaType": "image/jpeg"},
    ]
    got = frames(rpc(kernel, "SendStreamingMessage", message(parts=parts)))
    assert text_of(got[-2]) == "Received 2 image(s): image/png, image/jpeg"
    assert got[0]["result"]["task"]["history"][0]["parts"][1]["data"] == {
        "filename": "a.png",
        "bytes": png,
    }

    bad = [
        {"text": "[IMAGES]"},
        {
            "data": {"filename": "a.png", "bytes": "not base64!"},
            "mediaType": "image/png",
        },
    ]
    failed = frames(rpc(kernel, "SendStreamingMessage", message(parts=bad)))
    assert state(failed[-1]) == "TASK_STATE_FAILED"

    echo = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message(
                "[ECHO] hello   world",
                cwd="/tmp",
                preferredLanguage="zh",
                iac_code_api_key="sk-secret-value",
                llm_headers={"X-Trace": "t1", "X-Api-Token": "hidden"},
            ),
        )
    )
    lines = text_of(echo[-2]).split("\n")
    assert lines[0] == "hello world"
    assert lines[1] == "iac_code keys: cwd, iac_code_api_key, llm_headers, preferredLanguage"
    values = json.loads(lines[2].removeprefix("iac_code values: "))
    assert values == {
        "cwd": "/tmp",
        "llm_headers": {"X-Trace": "t1"},
        "preferredLanguage": "zh",
    }
    reply_frames = [f for f in echo if kind(f) == "statusUpdate"]
    assert "sk-secret-value" not in json.dumps(reply_frames) and "hidden" not in json.dumps(reply_frames)


def test_keepalive_comments_during_silence() -> None:
    with ScriptedKernel(None, delay_scale=1.0, keepalive_seconds=0.1) as quiet:
        started = time.monotonic()
        reader = SSE(
            rpc(
                quiet,
                "SendStreamingMessage",
                message("[SILENT 0.45] hi"),
                headers={"A2A-Version": "1.0"},
                stream=True,
            )
        )
        got = list(reader)
        assert time.monotonic() - started >= 0.45
    assert len(reader.comments) >= 2
    assert all(re.fullmatch(r": ping - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\+00:00", c) for c in reader.comments)
    assert text_of(got[-2]) == "Hello from the scripted kernel."


# --------------------------------------------------------------------------- side routes


def test_ensure_restored_and_pipeline_state(kernel: ScriptedKernel, tmp_path: Path) -> None:
    ctx = new_ctx()
    got = frames(
        rpc(
            kernel,
            "SendStreamingMessage",
            message("hi", context_id=ctx, cwd=str(tmp_path)),
        )
    )
    session = iac(got[1])["iacCodeSessionId"]
    url = kernel.url + "iac-code/session/ensure-restored"

    def restore(body: Any) -> requests.Response:
        return requests.post(url, data=json.dumps(body), headers=HEADERS, timeout=5)

    ok = restore(
        {
            "cwd": str(tmp_path),
            "sessionId": session,
            "taskId": got[0]["result"]["task"]["id"],
        }
    )
    assert (ok.status_code, ok.json()) == (200, {"status": "current"})
    unknown = restore({"cwd": str(tmp_path), "sessionId": str(uuid.uuid4())})
    assert (unknown.status_code, unknown.json()) == (404, {"status": "not_found"})
    for body in ({"cwd": str(tmp_path)}, [], {"cwd": 3, "sessionId": session}):
        bad = restore(body)
        assert (bad.status_code, bad.json()) == (
            400,
            {"error": "Invalid session restore request."},
        )

    state_url = kernel.url + "iac-code/pipeline/state"
    response = requests.get(
        state_url,
        params={"taskId": got[0]["result"]["task"]["id"]},
        headers=HEADERS,
        timeout=5,
    )
    assert (response.status_code, response.json()) == (
        404,
        {"error": "A2A pipeline state not found"},
    )


def test_request_log_and_reset(kernel: ScriptedKernel) -> None:
    requests.post(kernel.url + "_scripted/reset", headers=HEADERS, timeout=5)
    assert kernel.requests == []
    rpc(kernel, "GetTask", {"id": "nope"})
    rpc(kernel, "GetTask", {"id": "nope"}, headers={"Authorization": f"Bearer {TOKEN}"})
    log = kernel.requests
    assert [(e["method"], e["params"], e["headers"]) for e in log] == [
        ("GetTask", {"id": "nope"}, {"authorization": True, "a2a-version": "1.0"}),
        ("GetTask", {"id": "nope"}, {"authorization": True, "a2a-version": None}),
    ]
    over_http = requests.get(kernel.url + "_scripted/requests", headers=HEADERS, timeout=5).json()
    assert over_http == log
    requests.post(kernel.url + "_scripted/reset", headers=HEADERS, timeout=5)
    assert kernel.requests == []


def test_concurrent_contexts_run_in_parallel(kernel: ScriptedKernel) -> None:
    results: list[str] = []

    def run() -> None:
        got = frames(rpc(kernel, "SendStreamingMessage", message("[SLOW] a")))
        results.append(state(got[-1]))

    started = time.monotonic()
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == ["TASK_STATE_INPUT_REQUIRED"] * 4
    assert time.monotonic() - started < 3  # 4 x 1 s of SLOW, overlapped


# --------------------------------------------------------------------------- process entry point


def test_module_entry_point_ready_health_and_sigterm() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agui_adapter.scripted_kernel",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--token",
            "T",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "no READY line"
        line = proc.stdout.readline()
        match = re.fullmatch(r"READY (http://127\.0\.0\.1:\d+/)\n", line)
        assert match, line
        url = match.group(1)
        assert requests.get(url + "health", timeout=5).status_code == 401
        health = requests.get(url + "health", headers={"Authorization": "Bearer T"}, timeout=5)
        assert health.json() == {
            "status": "healthy",
            "version": "scripted",
            "mode": "normal",
        }
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_burst_of_connections_waits_in_the_queue_not_for_a_retry() -> None:
    """Werkzeug listens with a backlog of 128: the 129th connection attempt of a burst is dropped
    and waits a second for its retry. The kernel's socket queues a burst of 300 while nobody
    accepts (its loop stopped here, the socket kept listening through a second descriptor)."""
    kernel = ScriptedKernel()
    url = kernel.start()
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    server = kernel._server
    assert server is not None
    listening = socket.socket(fileno=os.dup(server.socket.fileno()))
    kernel.stop()  # the loop ends and closes its descriptor; the socket listens on, unaccepted
    attempts = []
    try:
        for _ in range(300):
            sock = socket.socket()
            sock.setblocking(False)
            attempts.append(sock)
            assert sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
        connected: set[socket.socket] = set()
        deadline = time.monotonic() + 0.8  # under the one-second retry of a dropped attempt
        while len(connected) < len(attempts) and time.monotonic() < deadline:
            _, writable, _ = select.select([], [s for s in attempts if s not in connected], [], 0.1)
            for sock in writable:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                connected.add(sock)
        assert len(connected) == 300
    finally:
        for sock in attempts:
            sock.close()
        listening.close()
