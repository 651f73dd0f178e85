"""Direct JSON-RPC tests against the real iac-code 0.16.0 kernel with the fake LLM.

They prove the harness works and pin the parts of the A2A dialect the adapter relies on:
the end state of a normal turn, the final text repeat, raw thinking frames, the permission
envelope and its answer, a non-retried LLM failure, conversation continuity per contextId,
image parts, the pipeline question interrupt and persistence across a kernel restart.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from tests.support.images import tiny_png

from .harness import (
    RealKernel,
    iac_meta,
    message_texts,
    results,
    states,
    status_updates,
)


def _ctx(name: str) -> str:
    return f"ctx-{name}-{uuid.uuid4().hex[:8]}"


def _final_texts(updates: list[dict[str, Any]]) -> list[str]:
    return [message_texts(u) for u in updates if (iac_meta(u).get("assistantFinal") or {}).get("complete")]


def _delta_text(updates: list[dict[str, Any]], task_id: str) -> str:
    delta_id = f"{task_id}-message"
    return "".join(
        message_texts(u) for u in updates if ((u["status"].get("message") or {}).get("messageId")) == delta_id
    )


def test_text_turn_ends_input_required_with_final_repeat(
    real_kernel: RealKernel,
) -> None:
    before = len(real_kernel.llm_requests())
    responses = real_kernel.send(real_kernel.message("Say hello.", _ctx("text")))
    first = results(responses)[0]
    assert "task" in first and first["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    task_id = first["task"]["id"]
    updates = status_updates(responses)
    assert states(responses)[-1] == "TASK_STATE_INPUT_REQUIRED"
    assert "input" not in iac_meta(updates[-1])
    assert _delta_text(updates, task_id) == "Hello from the fake LLM."
    assert _final_texts(updates) == ["Hello from the fake LLM."]
    final = next(u for u in updates if iac_meta(u).get("assistantFinal"))
    assert final["status"]["message"]["messageId"] != f"{task_id}-message"
    assert any("usage" in iac_meta(u) for u in updates)
    assert all(iac_meta(u).get("iacCodeSessionId") for u in updates)
    assert len(real_kernel.llm_requests()) == before + 1


def test_think_yields_raw_thinking_frames(real_kernel: RealKernel) -> None:
    updates = status_updates(real_kernel.send(real_kernel.message("[THINK] consider it", _ctx("think"))))
    thinking = [iac_meta(u)["thinking"] for u in updates if "thinking" in iac_meta(u)]
    assert [t["type"] for t in thinking] == ["raw_thinking", "raw_thinking"]
    assert "".join(t["text"] for t in thinking) == "Let me think about this."
    assert _final_texts(updates) == ["Hello from the fake LLM."]


def test_write_asks_permission_and_allow_writes_once(real_kernel: RealKernel) -> None:
    context_id = _ctx("write")
    target = real_kernel.workdir / "hello.txt"
    target.unlink(missing_ok=True)
    before = len(real_kernel.llm_requests())

    first = real_kernel.send(real_kernel.message("[WRITE] please write the file", context_id))
    updates = status_updates(first)
    assert states(first)[-1] == "TASK_STATE_INPUT_REQUIRED"
    envelope = iac_meta(updates[-1])["input"]
    assert envelope["kind"] == "permission" and envelope["required"] is True
    assert envelope["toolName"] == "write_file" and envelope["target"] == "hello.txt"
    assert envelope["schemaVersion"] == 1.0  # a float: protobuf Struct
    assert [o["id"] for o in envelope["options"]] == ["allow_once", "deny"]
    assert iac_meta(updates[-1])["permission"]["pending"] is True
    assert not target.exists()
    assert len(real_kernel.llm_requests()) == before + 1

    answer = {
        "schemaVersion": 1,
        "kind": "permission",
        "requestTaskId": envelope["requestTaskId"],
        "inputId": envelope["inputId"],
        "toolUseId": envelope["toolUseId"],
        "decision": "allow_once",
    }
    message = real_kernel.message(
        None,
        context_id,
        task_id=envelope["requestTaskId"],
        parts=[{"data": answer, "mediaType": "application/json"}],
    )
    second = real_kernel.send(message)
    updates = status_updates(second)
    received = iac_meta(updates[0]).get("inputReceived")
    assert received == {
        "kind": "permission",
        "inputId": envelope["inputId"],
        "toolUseId": envelope["toolUseId"],
    }
    assert any("artifactUpdate" in r for r in results(second))
    tools = [iac_meta(u)["tool"] for u in updates if "tool" in iac_meta(u)]
    assert [t["status"] for t in tools] == ["completed"]
    assert states(second)[-1] == "TASK_STATE_INPUT_REQUIRED"
    assert "input" not in iac_meta(updates[-1])
    assert _final_texts(updates)[0].startswith("Tool finished. Result: Successfully wrote")
    assert target.read_text() == "hello from the fake llm\n"
    requests = real_kernel.llm_requests()[before:]
    assert [r["behaviour"] for r in requests] == ["write", "tool-result"]


def test_fail_ends_failed_quickly_without_retry(real_kernel: RealKernel) -> None:
    before = len(real_kernel.llm_requests())
    started = time.monotonic()
    responses = real_kernel.send(real_kernel.message("[FAIL] break", _ctx("fail")))
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"LLM failure took {elapsed:.1f}s: retried?"
    seen = states(responses)
    assert "TASK_STATE_FAILED" in seen
    failed = next(u for u in status_updates(responses) if u["status"]["state"] == "TASK_STATE_FAILED")
    assert "400" in message_texts(failed)
    assert iac_meta(failed)["error"]["retryable"] is False
    # FAILED is not the last state: usage + empty final + INPUT_REQUIRED follow.
    assert seen[-1] == "TASK_STATE_INPUT_REQUIRED"
    # One streaming attempt plus the kernel's one non-streaming fallback, no backoff retries.
    requests = real_kernel.llm_requests()[before:]
    assert [r["behaviour"] for r in requests] == ["fail", "fail"]
    assert [r["stream"] for r in requests] == [True, False]


def test_recall_sees_previous_turn_on_same_context(real_kernel: RealKernel) -> None:
    context_id = _ctx("recall")
    first = results(real_kernel.send(real_kernel.message("Say hello.", context_id)))
    second_responses = real_kernel.send(real_kernel.message("[RECALL] how many?", context_id))
    second = results(second_responses)
    assert first[0]["task"]["id"] != second[0]["task"]["id"]
    assert _final_texts(status_updates(second_responses)) == ["I have seen 2 user messages."]


def test_image_part_reaches_the_llm(real_kernel: RealKernel) -> None:
    parts = [
        {"text": "[IMAGE] what is this?"},
        {
            "raw": base64.b64encode(tiny_png()).decode(),
            "mediaType": "image/png",
            "filename": "dot.png",
        },
    ]
    responses = real_kernel.send(real_kernel.message(None, _ctx("image"), parts=parts))
    assert _final_texts(status_updates(responses)) == ["I see 1 image(s)."]


def test_pipeline_question_interrupt_and_answer(real_kernel: RealKernel) -> None:
    context_id = _ctx("pipe")
    pipeline = {"run_mode": "pipeline"}
    first = real_kernel.send(real_kernel.message("[PIPE-ASK] put my site online", context_id, iac_code=pipeline))
    updates = status_updates(first)
    assert updates[-1]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    envelope = iac_meta(updates[-1])["input"]
    assert envelope["kind"] == "ask_user_question"
    assert [o["label"] for o in envelope["options"]] == ["cn-hangzhou", "cn-shanghai"]
    events = [iac_meta(u)["pipeline"]["eventType"] for u in updates if "pipeline" in iac_meta(u)]
    assert events[0] == "pipeline_started" and "input_required" in events

    second = real_kernel.send(
        real_kernel.message(
            "cn-hangzhou",
            context_id,
            task_id=envelope["requestTaskId"],
            iac_code=pipeline,
        )
    )
    envelopes = [iac_meta(u)["pipeline"] for u in status_updates(second) if "pipeline" in iac_meta(u)]
    received = next(e for e in envelopes if e["eventType"] == "input_received")
    assert received["data"]["selectedId"] == "hz"
    assert "TASK_STATE_COMPLETED" in states(second)


def test_restart_keeps_the_conversation(real_kernel: RealKernel) -> None:
    context_id = _ctx("restart")
    real_kernel.send(real_kernel.message("Say hello.", context_id))
    real_kernel.restart()
    assert real_kernel.is_running()
    responses = real_kernel.send(real_kernel.message("[RECALL] after restart", context_id))
    assert _final_texts(status_updates(responses)) == ["I have seen 2 user messages."]
