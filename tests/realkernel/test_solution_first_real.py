"""The real kernel's ``selling_solution_first`` pipeline through the adapter, against the fake cloud.

The fake LLM plays every step (``[PIPE-SSF]``, ``tests/support/fake_llm.py``):
``solution_planning_and_selection`` shows two candidate outlines and their details and submits
``awaiting_selection``; the kernel raises ``candidate_selection`` and resolves the answer itself (no
LLM turn). ``materialize_selected_candidate`` writes the chosen template (a ``write_file``
permission), validates, prices and previews it on the fake cloud and submits
``awaiting_confirmation``; the kernel raises ``deployment_confirmation`` and resolves a structured
``{"action": ...}`` answer itself. ``deploying`` calls the confirmed ``ros_deploy`` wrapper (STS,
then a permission); ``CreateStack`` fails at the TLS handshake (the synchronous SDK path refuses the
test CA: tests/data/a2a-selling/README.md), the step concludes ``failed`` and the pipeline completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, RunResult, session_value
from tests.support.fake_aliyun import FakeAliyun
from tests.support.fake_llm import SSF_CANDIDATES, SSF_CONFIRM_WORDS, ssf_output_path

from . import fake_cloud
from .fake_cloud import assert_clean_delivery, calls_since, cloud_body, describe, resume_with
from .harness import (
    RealKernel,
    journal,
    llm_log,
    only_interrupt,
    pipeline_events,
    step_names,
)

# the fake cloud, the kernel that uses it and a fake secret per test: the same fixtures as test_cloud_real
fake_aliyun = fake_cloud.fake_aliyun
real_kernel = fake_cloud.real_kernel
secret = fake_cloud.secret

SSF = "selling_solution_first"
STEPS = ["solution_planning_and_selection", "materialize_selected_candidate", "deploying"]


def ssf_body(tag: str, ws: Path, secret: str) -> dict[str, Any]:
    return cloud_body(f"[PIPE-SSF] I want a small website on Alibaba Cloud. {tag}", ws, secret, pipelineName=SSF)


def to_the_deployment_confirmation(
    client: Client, ws: Path, cloud: FakeAliyun, secret: str, tag: str
) -> tuple[dict[str, Any], list[RunResult], dict[str, Any]]:
    """Planning, the selection, the template's write permission and step 2 up to its confirmation."""
    body = ssf_body(tag, ws, secret)
    first = client.run(body)
    selection = only_interrupt(first)
    assert step_names(first, "STEP_STARTED") == STEPS[:1]
    assert (selection["reason"], selection["metadata"]["kind"]) == ("confirmation", "candidate_selection")
    assert [o["label"] for o in selection["metadata"]["options"]] == [c["name"] for c in SSF_CANDIDATES]
    second = client.run(resume_with(body, secret, selection, {"selectedId": "1"}))
    write = only_interrupt(second)
    assert (write["reason"], write["metadata"]["toolName"]) == ("tool_call", "write_file")
    assert write["metadata"]["target"] == ssf_output_path(1)
    mark = len(cloud.calls)
    third = client.run(resume_with(body, secret, write, {"decision": "allow_once"}))
    confirmation = only_interrupt(third)
    # step 2 validated, priced and previewed the written template on the fake cloud (the template
    # body travels, no TemplateURL) before it asked for the confirmation
    assert [(c["host"], c["action"]) for c in calls_since(cloud, mark)] == [
        ("ros.aliyuncs.com", "ValidateTemplate"),
        ("ros.aliyuncs.com", "GetTemplateEstimateCost"),
        ("ros.aliyuncs.com", "PreviewStack"),
    ], describe(third, cloud)
    assert (ws / ssf_output_path(1)).is_file()
    return body, [first, second, third], confirmation


def test_solution_first_runs_every_step_to_pipeline_completed(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, confirmation = to_the_deployment_confirmation(client, ws, fake_aliyun, secret, tag)
    # the kernel sends this wait without an iac_code.input (tests/data/a2a-selling/15): the adapter
    # builds the interrupt from the pipeline's input_required envelope
    meta = confirmation["metadata"]
    assert (confirmation["reason"], meta["kind"]) == ("confirmation", "deployment_confirmation")
    assert [o["id"] for o in meta["options"]] == ["confirm", "reselect", "cancel"]
    assert confirmation["responseSchema"]["oneOf"] == [{"required": ["selectedId"]}, {"required": ["freeText"]}]
    summary = meta["deploymentSummary"]
    assert summary["template"] == ssf_output_path(1) and summary["previewReadyForCreate"] is True
    assert summary["totalMonthlyCost"].startswith("¥1.00/month")  # the fake's quote for a template body
    assert summary["solutionSummary"].endswith("[PIPE-SSF]")
    task_id = session_value(runs[0])["taskId"]
    waits = [e for e in journal(real_kernel, task_id) if e["eventType"] == "input_required"]
    assert confirmation["id"] == f"input-{waits[-1]['eventId']}"
    assert waits[-1]["data"]["kind"] == "deployment_confirmation"
    assert step_names(runs[2], "STEP_STARTED") == STEPS[1:2]

    mark = len(fake_aliyun.calls)
    fourth = client.run(resume_with(body, secret, confirmation, {"selectedId": "confirm"}))
    runs.append(fourth)
    permission = only_interrupt(fourth)
    assert (permission["reason"], permission["metadata"]["toolName"]) == ("tool_call", "ros_deploy")
    assert permission["metadata"]["deploymentSummary"]["template"] == ssf_output_path(1)
    assert [c["action"] for c in calls_since(fake_aliyun, mark)] == ["GetCallerIdentity"]
    # the kernel resolved the structured answer itself: no LLM turn between the answer and deploying
    [received] = [
        e["data"]
        for e in journal(real_kernel, task_id)
        if e["eventType"] == "input_received" and e["data"]["kind"] == "deployment_confirmation"
    ]
    assert (received["action"], received["structured"], received["selectedValue"]) == (
        "confirm",
        True,
        '{"action": "confirm"}',
    )
    assert step_names(fourth, "STEP_STARTED") == STEPS[1:]

    mark, refused = len(fake_aliyun.calls), len(fake_aliyun.tls_failures)
    fifth = client.run(resume_with(body, secret, permission, {"decision": "allow_once"}))
    runs.append(fifth)
    assert fifth.terminal["type"] == "RUN_FINISHED" and fifth.terminal["outcome"] == {"type": "success"}
    assert [c["action"] for c in calls_since(fake_aliyun, mark)] == ["GetCallerIdentity"]
    assert [f for f in fake_aliyun.tls_failures[refused:] if f.startswith("ros.aliyuncs.com")]
    events = journal(real_kernel, task_id)
    done = {
        (e.get("step") or {}).get("id"): e["data"]["conclusion"] for e in events if e["eventType"] == "step_completed"
    }
    assert done["solution_planning_and_selection"]["selected_candidate_name"] == SSF_CANDIDATES[1]["name"]
    assert (
        done["materialize_selected_candidate"]["status"],
        done["materialize_selected_candidate"]["deployment_confirmed"],
    ) == (
        "confirmed",
        True,
    )
    assert done["deploying"]["status"] == "failed" and "CERTIFICATE_VERIFY_FAILED" in done["deploying"]["error"]
    ends = [e for e in pipeline_events(fifth) if e["eventType"] == "pipeline_completed"]
    assert ends and ends[-1]["data"] == {"totalSteps": 3}
    started = [name for run in runs for name in step_names(run, "STEP_STARTED")]
    finished = [name for run in runs for name in step_names(run, "STEP_FINISHED")]
    assert sorted(set(started)) == sorted(STEPS) and sorted(set(finished)) == sorted(STEPS)
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)


def test_cancelled_confirmation_ends_the_pipeline_early_without_deploying(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, confirmation = to_the_deployment_confirmation(client, ws, fake_aliyun, secret, tag)
    mark = len(fake_aliyun.calls)
    last = client.run(resume_with(body, secret, confirmation, {"selectedId": "cancel"}))
    runs.append(last)
    # the kernel resolves the structured cancel itself (tests/data/a2a-selling/19): step 2 concludes
    # cancelled, continue_pipeline false ends the pipeline early; deploying never starts
    assert last.terminal["type"] == "RUN_FINISHED" and last.terminal["outcome"] == {"type": "success"}
    assert step_names(last, "STEP_STARTED") == STEPS[1:2] and "deploying" not in step_names(last, "STEP_FINISHED")
    assert calls_since(fake_aliyun, mark) == []
    ends = [e for e in pipeline_events(last) if e["eventType"] == "pipeline_completed"]
    assert ends and ends[-1]["data"] == {"totalSteps": 3, "earlyExit": True}
    events = journal(real_kernel, session_value(runs[0])["taskId"])
    [handoff] = {e["data"]["outcome"] for e in events if e["eventType"] == "pipeline_handoff_ready"}
    assert handoff == "early_exit"
    done = [e["data"]["conclusion"] for e in events if e["eventType"] == "step_completed"]
    assert (done[-1]["status"], done[-1]["continue_pipeline"]) == ("cancelled", False)
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)


def test_reselect_rolls_back_to_the_planning_step_and_asks_again(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, confirmation = to_the_deployment_confirmation(client, ws, fake_aliyun, secret, tag)
    again = client.run(resume_with(body, secret, confirmation, {"selectedId": "reselect"}))
    runs.append(again)
    # reselect_requested with a rollback to step 1 (tests/data/a2a-selling/20): the planning step runs
    # again (attempt 2, a new candidate batch) and raises a new candidate_selection
    selection = only_interrupt(again)
    first_selection = only_interrupt(runs[0])
    assert selection["metadata"]["kind"] == "candidate_selection" and selection["id"] != first_selection["id"]
    assert step_names(again, "STEP_STARTED") == STEPS[1::-1]
    rollbacks = [e for e in pipeline_events(again) if e["eventType"] == "rollback_completed"]
    assert [(e["data"]["fromStep"], e["data"]["toStep"]) for e in rollbacks] == [(STEPS[1], STEPS[0])]
    # and the pipeline goes on from there: choosing the other candidate writes its template
    runs.append(client.run(resume_with(body, secret, selection, {"selectedId": "0"})))
    write = only_interrupt(runs[-1])
    assert (write["metadata"]["toolName"], write["metadata"]["target"]) == ("write_file", ssf_output_path(0))
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)


def test_free_text_confirmation_goes_to_the_step_llm_and_a_denied_deploy_creates_nothing(
    client: Client, ws: Path, real_kernel: RealKernel, fake_aliyun: FakeAliyun, secret: str, tag: str
) -> None:
    body, runs, confirmation = to_the_deployment_confirmation(client, ws, fake_aliyun, secret, tag)
    runs.append(client.run(resume_with(body, secret, confirmation, {"freeText": SSF_CONFIRM_WORDS})))
    permission = only_interrupt(runs[-1])
    assert permission["metadata"]["toolName"] == "ros_deploy"
    # natural language is not resolved by the kernel (tests/data/a2a-selling/22): input_received says
    # structured false, and the step's LLM read the text and concluded confirmed
    task_id = session_value(runs[0])["taskId"]
    events = journal(real_kernel, task_id)
    [received] = [
        e["data"]
        for e in events
        if e["eventType"] == "input_received" and e["data"]["kind"] == "deployment_confirmation"
    ]
    assert (received["selectedValue"], received["structured"]) == (SSF_CONFIRM_WORDS, False)
    asked = [r for r in llm_log(real_kernel, SSF_CONFIRM_WORDS) if r["behaviour"].startswith("ssf-materialize")]
    assert [r["behaviour"] for r in asked] == ["ssf-materialize_selected_candidate-complete_step"]
    plan = [e for e in events if e["eventType"] == "step_completed"][-1]["data"]["conclusion"]
    assert (plan["status"], plan["confirmation"]["input_type"]) == ("confirmed", "natural_language")
    mark = len(fake_aliyun.calls)
    runs.append(client.run(resume_with(body, secret, permission, {"decision": "deny"})))
    assert runs[-1].terminal["type"] == "RUN_FINISHED" and runs[-1].terminal["outcome"] == {"type": "success"}
    assert calls_since(fake_aliyun, mark) == []
    done = [e for e in journal(real_kernel, task_id) if e["eventType"] == "step_completed"][-1]
    assert done["step"]["id"] == "deploying" and done["data"]["conclusion"]["status"] == "failed"
    assert_clean_delivery(real_kernel, fake_aliyun, secret, runs)
