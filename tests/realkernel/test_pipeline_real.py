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
import signal
import time
from pathlib import Path
from typing import Any

import requests

from agui_adapter.pipeline import CUSTOM_EVENT_TYPES
from tests.support.agui_client import Client, RunResult, run_body, session_value
from tests.support.fake_llm import SELL_CANDIDATES, SELL_DEPLOY_ERROR

from .harness import RealKernel
from .test_adapter_real import (  # noqa: F401  (fixtures shared with the adapter module)
    Adapters,
    LiveStream,
    adapter,
    adapters,
    client,
    llm_log,
    tag,
    thread_id,
    ws,
)

PIPELINE = "iac-code.pipeline.v1"
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


def answer(body: dict[str, Any], interrupt: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The Resume run of ``body``'s pipeline answering ``interrupt`` with ``payload``."""
    props = body["forwardedProps"]["iacCode"]
    return run_body(
        None,
        thread_id=body["threadId"],
        cwd=props["cwd"],
        ros=props["rosInvocationId"],
        runMode="pipeline",
        pipelineName="selling",
        candidatePresentation="rich",
        resume=[{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}],
    )


def pipeline_events(*runs: RunResult) -> list[dict[str, Any]]:
    return [c["value"] for r in runs for c in r.of("CUSTOM") if c["name"] == PIPELINE]


def only_interrupt(result: RunResult) -> dict[str, Any]:
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.terminal["outcome"]["type"] == "interrupt", result.terminal
    [interrupt] = result.terminal["outcome"]["interrupts"]
    return dict(interrupt)


def journal(kernel: RealKernel, task_id: str) -> list[dict[str, Any]]:
    """Every event of the kernel's pipeline journal for ``task_id``."""
    state = requests.get(
        kernel.url + "/iac-code/pipeline/state",
        params={"taskId": task_id, "afterSequence": 0, "includeSnapshot": "false"},
        headers=kernel.headers(),
        timeout=10,
    ).json()
    return list(state["events"])


def assert_journal_delivered_once(kernel: RealKernel, runs: list[RunResult]) -> None:
    """Every allowlisted event of the real journal reached the client, and exactly once."""
    ids = [e["eventId"] for e in pipeline_events(*runs)]
    assert len(ids) == len(set(ids)), "a pipeline event was delivered twice"
    wanted = {e["eventId"] for e in journal(kernel, session_value(runs[0])["taskId"]) if e["eventType"] in CUSTOM_EVENT_TYPES}
    assert set(ids) == wanted


def step_names(result: RunResult, kind: str) -> list[str]:
    return [e["stepName"] for e in result.of(kind)]


def official_check(runs: list[RunResult], payloads: list[dict[str, Any]]) -> None:
    from tests.support.agui_check.official import check_streams, require_official_client

    require_official_client()
    verdict = check_streams([r.raw for r in runs], resume_payload=payloads[0] if payloads else None)
    assert verdict.ok, verdict.output


# ============================================================================ tests
def test_selling_pipeline_runs_every_step_to_pipeline_completed(
    client: Client, ws: Path, real_kernel: RealKernel, tag: str
) -> None:
    body = sell_body(f"[PIPE-SELL] [PIPE-ASK] I want a small website on Alibaba Cloud. {tag}", ws)
    first = client.run(body)
    question = only_interrupt(first)
    assert question["metadata"]["kind"] == "ask_user_question" and question["reason"] == "input_required"
    assert step_names(first, "STEP_STARTED") == ["intent_parsing"]

    second = client.run(answer(body, question, {"selectedId": "sh"}))
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

    third = client.run(answer(body, selection, {"selectedId": "1"}))
    assert third.terminal["type"] == "RUN_FINISHED" and third.terminal["outcome"] == {"type": "success"}
    assert "deploying" in step_names(third, "STEP_STARTED") and "deploying" in step_names(third, "STEP_FINISHED")
    ends = [e for e in pipeline_events(third) if e["eventType"] == "pipeline_completed"]
    assert ends and all(e["data"] == {"totalSteps": 5} for e in ends)
    # the real kernel journals two pipeline_completed (pending_backup, then committed)
    assert {e["visibility"] for e in ends} <= {"pending_backup", "committed"}
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
