"""The real iac-code 0.16.0 ``selling`` pipeline through the adapter, past the first step.

The fake LLM plays every step (``[PIPE-SELL]``, see ``tests/support/fake_llm.py``): intent,
architecture with two candidates, both candidates' template and cost steps in parallel, the
candidate selection and the deploying step. No step reaches a cloud API: the cost step submits
``preview_validation.succeeded: false`` (its schema allows it) and deploying concludes
``status: failed`` (a ``success`` conclusion is refused unless a real ``ros_deploy`` result with
``CREATE_COMPLETE`` exists), and the pipeline still ends in ``pipeline_completed``.

Every stream is read through ``Client`` (checked by ``check_stream``) and, where the official
client is installed, by ``check_streams``. Facts come from the kernel's own journal
(``/iac-code/pipeline/state``) and the fake LLM's request log.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, run_body, session_value
from tests.support.agui_stream import check_stream, parse_sse
from tests.support.fake_llm import SELL_CANDIDATES, SELL_DEPLOY_ERROR, message_text

from .harness import (
    PIPELINE,
    RealKernel,
    assert_journal_delivered_once,
    get_task,
    journal,
    llm_log,
    official_check,
    only_interrupt,
    pipeline_answer,
    pipeline_events,
    step_names,
    thread_id,
    wait_task_state,
)

BUSINESS_STEPS = ["intent_parsing", "architecture_planning", "evaluate_candidates", "confirm_and_select", "deploying"]
CANDIDATE_STEPS = ["template_generating", "cost_estimating"]


# ============================================================================ helpers
def sell_body(text: str, ws: Path, **props: Any) -> dict[str, Any]:
    return run_body(
        text,
        thread_id=thread_id("sell"),
        cwd=str(ws),
        runMode="pipeline",
        pipelineName="selling",
        candidatePresentation="rich",
        **props,
    )


# ============================================================================ tests
def test_selling_pipeline_runs_every_step_to_pipeline_completed(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-ASK] I want a small website on Alibaba Cloud. {tag}", ws)
    first = client.run(body)
    question = only_interrupt(first)
    assert question["metadata"]["kind"] == "ask_user_question" and question["reason"] == "input_required"
    assert step_names(first, "STEP_STARTED") == ["intent_parsing"]

    second = client.run(pipeline_answer(body, question, {"selectedId": "sh"}))
    selection = only_interrupt(second)
    # every business step up to the selection, in order, each closed; the candidates' steps too
    assert step_names(second, "STEP_STARTED")[0] == "intent_parsing"  # reopened after the interrupt
    business = [s for s in step_names(second, "STEP_STARTED") if not s.startswith("candidate:")]
    assert business == BUSINESS_STEPS[:4]
    assert [s for s in step_names(second, "STEP_FINISHED") if not s.startswith("candidate:")] == BUSINESS_STEPS[:4]
    events = pipeline_events(second)
    started = [e for e in events if e["eventType"] == "candidate_started"]
    assert [e["data"]["candidateName"] for e in started] == [c["name"] for c in SELL_CANDIDATES]
    candidate_ids = [e["candidate"]["id"] for e in started]
    for cid in candidate_ids:
        assert [s for s in step_names(second, "STEP_STARTED") if s.startswith(f"candidate:{cid}:")] == [
            f"candidate:{cid}:{step}" for step in CANDIDATE_STEPS
        ]
    # parallel: both candidates started before either completed
    kinds = [(e["eventType"], (e.get("candidate") or {}).get("id")) for e in events]
    first_done = min(i for i, (kind, _) in enumerate(kinds) if kind == "candidate_completed")
    assert all(kinds.index(("candidate_started", cid)) < first_done for cid in candidate_ids)
    # the selection interrupt carries the rich-v1 costs and diagrams of the cost steps
    assert selection["metadata"]["kind"] == "candidate_selection"
    options = selection["metadata"]["options"]
    assert [o["label"] for o in options] == [c["name"] for c in SELL_CANDIDATES]
    assert options[1]["totalMonthlyCost"] == "¥8.00/月" and options[1]["costItems"][0]["monthlyCost"] == "¥8.00/月"
    assert all(o["architectureDiagram"].startswith("flowchart") for o in options)
    assert selection["responseSchema"]["properties"]["selectedId"]["enum"] == ["0", "1"]

    third = client.run(pipeline_answer(body, selection, {"selectedId": "1"}))
    assert third.terminal["type"] == "RUN_FINISHED" and third.terminal["outcome"] == {"type": "success"}
    assert "deploying" in step_names(third, "STEP_STARTED") and "deploying" in step_names(third, "STEP_FINISHED")
    ends = [e for e in pipeline_events(third) if e["eventType"] == "pipeline_completed"]
    assert ends and all(e["data"] == {"totalSteps": 5} for e in ends)
    # the real kernel journals two pipeline_completed, pending_backup then committed; its live
    # stream carries only the committed one (tests/data/a2a-selling/02), and so does the adapter,
    # live or from the gap fill
    assert [e["visibility"] for e in ends] == ["committed"]
    twins = [e for e in journal(real_kernel, session_value(first)["taskId"]) if e["eventType"] == "pipeline_completed"]
    assert sorted(e["visibility"] for e in twins) == ["committed", "pending_backup"]
    # the LLM saw the user's choice (the label) in the selection step, and the choice reached deploying
    selects = [r for r in real_kernel.llm_requests() if r["behaviour"] == "sell-confirm_and_select"]
    assert any(m.get("content") == SELL_CANDIDATES[1]["name"] for r in selects for m in r["messages"])
    runs = [first, second, third]
    assert_journal_delivered_once(real_kernel, runs)
    done = [e for e in journal(real_kernel, session_value(first)["taskId"]) if e["eventType"] == "step_completed"]
    deployed = [e for e in done if (e.get("step") or {}).get("id") == "deploying"]
    assert deployed and deployed[-1]["data"]["conclusion"] == {"status": "failed", "error": SELL_DEPLOY_ERROR}
    official_check(runs, [{"selectedId": "sh"}])


def test_selling_pipeline_failing_step_ends_in_run_error(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-FAIL-AT:architecture_planning] a small website {tag}", ws)
    result = client.run(body)
    assert result.terminal["type"] == "RUN_ERROR" and result.terminal["code"] == "A2A_EXECUTION_FAILED"
    assert step_names(result, "STEP_STARTED") == ["intent_parsing", "architecture_planning"]
    assert step_names(result, "STEP_FINISHED") == ["intent_parsing", "architecture_planning"]
    kinds = [e["eventType"] for e in pipeline_events(result)]
    assert "step_failed" in kinds and "pipeline_completed" not in kinds
    assert_journal_delivered_once(real_kernel, [result])
    assert "pipeline_failed" in [e["eventType"] for e in journal(real_kernel, session_value(result)["taskId"])]
    official_check([result], [])


class OpenRun:
    """A pipeline run read incrementally over a raw socket (to act mid-run, or to drop it)."""

    def __init__(self, client: Client, body: dict[str, Any]) -> None:
        host, port = client.url.split("//")[1].rstrip("/").split(":")
        payload = json.dumps(body).encode()
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        self.raw = b""

    def read_until(self, marker: bytes, timeout: float = 60) -> bool:
        """Read until ``marker`` arrived (True) or ``timeout`` passed / the stream ended (False)."""
        deadline = time.monotonic() + timeout
        while marker not in self.raw:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            if not chunk:
                return False
            self.raw += chunk
        return True

    def events(self) -> list[dict[str, Any]]:
        """The AG-UI events read so far (chunked transfer framing removed)."""
        body = self.raw.split(b"\r\n\r\n", 1)[1]
        out = bytearray()
        while body:
            size_line, _, rest = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out += rest[:size]
            body = rest[size + 2 :]
        return parse_sse(bytes(out))

    def close(self) -> None:
        self.sock.close()


def guidance_body(body: dict[str, Any], text: str) -> dict[str, Any]:
    props = body["forwardedProps"]["iacCode"]
    return run_body(
        text,
        thread_id=body["threadId"],
        cwd=props["cwd"],
        ros=props["rosInvocationId"],
        runMode="pipeline",
        pipelineName="selling",
        activeGuidance=True,
    )


def test_guidance_into_a_running_pipeline_is_judged_and_supplements_the_step(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-SLOW] a small website {tag}", ws)
    run = OpenRun(client, body)
    try:
        assert run.read_until(b'"stepName":"architecture_planning"')
        guidance = client.run(guidance_body(body, f"[GUIDE-SUPPLEMENT] Please prefer cn-shanghai. {tag}"))
        assert guidance.status == 200, guidance.error
        assert guidance.types() == ["RUN_STARTED", "RUN_FINISHED"]
        assert guidance.terminal["outcome"] == {"type": "success"}
        assert run.read_until(b'"RUN_FINISHED"')
    finally:
        run.close()
    events = run.events()
    check_stream(events)
    assert events[-1]["outcome"]["type"] == "interrupt"  # the pipeline went on to the candidate selection
    assert events[-1]["outcome"]["interrupts"][0]["metadata"]["kind"] == "candidate_selection"
    # the real answer: the kernel asked its interrupt judge (an LLM call with the guidance), and on
    # "supplement" put the guidance into the running step's conversation as a user message
    seen = [
        (r["behaviour"], [m["role"] for m in r["messages"] if "prefer cn-shanghai" in message_text(m)])
        for r in llm_log(real_kernel, "prefer cn-shanghai")
    ]
    assert seen[0] == ("judge-supplement", ["user"])
    assert ("sell-architecture_planning", ["user"]) in seen[1:]


def test_client_disconnect_mid_pipeline_cancels_the_real_pipeline_and_the_thread_goes_on(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-SLOW] a small website {tag}", ws)
    run = OpenRun(client, body)
    assert run.read_until(b'"stepName":"architecture_planning"')
    task_id = run.raw.split(b'"taskId":"')[1].split(b'"')[0].decode()
    run.close()
    assert wait_task_state(real_kernel, task_id, "TASK_STATE_CANCELED") == "TASK_STATE_CANCELED"
    events = journal(real_kernel, task_id)
    assert "pipeline_completed" not in [e["eventType"] for e in events]
    assert not [e for e in events if e["eventType"] == "step_completed" and e["step"]["id"] == "architecture_planning"]
    # the thread is usable again, but the real kernel handed the cancelled pipeline's context over to
    # normal chat (selling's on_complete: switch_to_normal, apply_on: canceled): a pipeline request on
    # the same thread now runs as a chat turn, no pipeline_started and no complete_step offered
    again = client.run(dict(sell_body(f"[PIPE-SELL] a small website again {tag}", ws), threadId=body["threadId"]))
    assert again.terminal["type"] == "RUN_FINISHED" and again.terminal["outcome"] == {"type": "success"}
    assert not [c for c in again.of("CUSTOM") if c["name"] == PIPELINE] and not again.of("STEP_STARTED")
    assert again.text() == "Hello from the fake LLM."
    last = llm_log(real_kernel, tag)[-1]
    assert last["behaviour"] == "default" and "complete_step" not in last["tools"]
    assert session_value(again)["taskId"] != task_id


def test_candidate_step_permissions_are_interrupts_answered_by_resume(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    # the real kernel waits for a candidate-step permission in TASK_STATE_WORKING (no INPUT_REQUIRED,
    # no pendingPermissions; tests/data/a2a-selling/05): the adapter ends the run with the interrupt
    # all the same, answers it with a unary SendMessage on Resume and follows the task on
    body = sell_body(f"[PIPE-SELL] [PIPE-WRITE] a small website {tag}", ws)
    runs = [client.run(body)]
    permissions: list[dict[str, Any]] = []
    for _ in range(4):
        terminal = runs[-1].terminal
        assert terminal["type"] == "RUN_FINISHED" and terminal["outcome"]["type"] == "interrupt", terminal
        interrupts = terminal["outcome"]["interrupts"]
        if any(i["metadata"].get("kind") != "permission" for i in interrupts):
            break
        assert all(i["reason"] == "tool_call" and i["metadata"]["toolName"] == "write_file" for i in interrupts)
        permissions += interrupts
        props = body["forwardedProps"]["iacCode"]
        answers = [
            {"interruptId": i["id"], "status": "resolved", "payload": {"decision": "allow_once"}} for i in interrupts
        ]
        resume_body = pipeline_answer(body, interrupts[0], {"decision": "allow_once"}) | {"resume": answers}
        assert resume_body["forwardedProps"]["iacCode"]["cwd"] == props["cwd"]
        runs.append(client.run(resume_body))
    assert len({p["id"] for p in permissions}) == 2  # one per candidate, each answered once
    [selection] = runs[-1].terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection"
    task_id = session_value(runs[0])["taskId"]
    resolved = [e for e in journal(real_kernel, task_id) if e["eventType"] == "permission_resolved"]
    assert len(resolved) == 2


def test_ros_deploy_without_cloud_credentials_fails_the_pipeline_before_any_permission(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-DEPLOY] a small website {tag}", ws)
    selection = only_interrupt(client.run(body))
    result = client.run(pipeline_answer(body, selection, {"selectedId": "1"}))
    # before asking permission for a cloud-writing tool the kernel resolves the caller through STS
    # GetCallerIdentity (iac_code/services/permission_wait.py); without credentials the task fails
    assert result.terminal["type"] == "RUN_ERROR" and result.terminal["code"] == "A2A_EXECUTION_FAILED"
    assert "cloud_credentials_unavailable" in result.terminal["message"]
    assert step_names(result, "STEP_STARTED") == ["confirm_and_select", "deploying"]
    assert [e["toolCallName"] for e in result.of("TOOL_CALL_START")][-1] == "ros_deploy"
    assert not any(r["behaviour"] == "sell-deploying" for r in llm_log(real_kernel, tag))  # no conclusion
    task_id = session_value(result)["taskId"]
    assert get_task(real_kernel, task_id)["status"]["state"] == "TASK_STATE_FAILED"
    assert "permission_requested" not in [e["eventType"] for e in journal(real_kernel, task_id)]
