"""The pipeline scripts: a scripted selling pipeline as a generator of envelopes and waits.

Why: a pipeline turn (``iac_code.run_mode: "pipeline"``) runs five steps with
optional questions, candidates, permissions and failures chosen by the
``[PIPE-...]`` directives, pausing at each wait until an answer resumes it. A
generator that yields ``(envelopes, waits)`` and receives the answer keeps that
story in order in one place; :mod:`agui_adapter.scripted_kernel.pipeline_waits` drives it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import queue
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from agui_adapter.scripted_kernel.frames import PipeRun
from agui_adapter.scripted_kernel.pipeline_journal import PIPELINE_STEPS, SOLUTION_FIRST_STEPS, pipeline_steps
from agui_adapter.scripted_kernel.tasks import Canceled, Pending
from agui_adapter.scripted_kernel.turn_scripts import ASK_OPTIONS, ASK_PROMPT, write_file_result, write_permission_shown
from agui_adapter.scripted_kernel.wire import as_struct, random_hex

PIPELINE_FIELDS = {
    "intent_parsing": "intent",
    "architecture_planning": "architecture",
    "evaluate_candidates": "evaluated_candidates",
    "confirm_and_select": "selected_plan",
    "deploying": "deployment",
    "solution_planning_and_selection": "solution_selection",
    "materialize_selected_candidate": "selected_plan",
}
PIPELINE_CONCLUSIONS: dict[str, dict[str, Any]] = {
    "intent_parsing": {
        "is_infra_intent": True,
        "confidence": "high",
        "category": "website",
        "user_message_summary": "small website",
    },
    "architecture_planning": {"summary": "A small web tier on Alibaba Cloud.", "region": "cn-hangzhou"},
    "evaluate_candidates": {"candidateIds": []},
    "confirm_and_select": {"candidateId": None},
    "deploying": {"deployed": True},
}


SELECT_PROMPT = "Which plan should be deployed?"
SOLUTION_PROMPT = "Choose the solution to implement and deploy"  # selling_solution_first's (capture 13)
RESOURCE_PROMPT = "Which VPC should host the site?"
RESOURCE_SELECTOR = {"selectorId": "vpc", "options": [{"value": "vpc-1", "label": "default VPC"}]}
STEP_FAIL_TEXT = "No conclusion extracted"


@dataclass(frozen=True)
class _Question:
    """A question wait of a step: its input kind, the tool that asks, the id prefix, the texts."""

    kind: str
    tool: str
    prefix: str
    prompt: str
    allow_free_text: bool
    options: tuple[dict[str, Any], ...] = ()


_ASK = _Question("ask_user_question", "ask_user_question", "ask", ASK_PROMPT, True, ASK_OPTIONS)


def _cost(value: float) -> str:
    """A monthly cost as the cost step writes it (the real kernel passes the LLM's strings on)."""
    return f"¥{value:.2f}/月"


def _candidate(cid: str, label: str, summary: str, flow: str, costs: dict[str, float]) -> dict[str, Any]:
    """A candidate plan as ``rich-v1`` presents it (the total is the sum of its cost items)."""
    return {
        "id": cid,
        "label": label,
        "summary": summary,
        "architectureDiagram": "flowchart LR\n  " + flow,
        "totalMonthlyCost": _cost(sum(costs.values())),
        "costItems": [{"name": name, "monthlyCost": _cost(cost)} for name, cost in costs.items()],
    }


def _llm_option(index: int, plan: dict[str, Any], rich: bool) -> dict[str, Any]:
    """An option of confirm_and_select's first conclusion, as the LLM writes it (snake case)."""
    option: dict[str, Any] = {"name": plan["label"], "summary": plan["summary"], "candidate_index": index}
    if rich:
        option.update(
            total_monthly_cost=plan["totalMonthlyCost"],
            architecture_diagram=plan["architectureDiagram"],
            cost_items=[{"name": item["name"], "monthly_cost": item["monthlyCost"]} for item in plan["costItems"]],
        )
    return option


CANDIDATES: tuple[dict[str, Any], ...] = (
    _candidate(
        "c1",
        "Plan A",
        "One ECS instance behind an SLB.",
        "user --> slb --> ecs",
        {"ECS ecs.t6-c1m1.large": 30.0, "SLB": 12.5},
    ),
    _candidate(
        "c2",
        "Plan B",
        "A static site on OSS behind CDN.",
        "user --> cdn --> oss",
        {"OSS standard storage": 2.0, "CDN traffic": 6.0},
    ),
)


_PIPE_USAGE = {
    "cachedInputTokens": 0,
    "provider": "openai",
    "model": "other",
    "inputTokens": 11,
    "outputTokens": 7,
    "totalTokens": 18,
}


def _context_usage(messages: int) -> dict[str, Any]:
    """A ``context_usage`` envelope's data after ``messages`` messages."""
    user, assistant = 13 * messages, 9 * messages
    total = 4871 + 1237 + user + assistant
    return {
        "contextWindow": 128000,
        "assistantMessageTokens": assistant,
        "toolResultTokens": 0,
        "messageCount": messages,
        "totalTokens": total,
        "userMessageTokens": user,
        "systemPromptTokens": 4871,
        "toolDefinitionTokens": 1237,
        "usagePercent": total / 1280,
    }


def _handoff_summary(name: str, outcome: str) -> str:
    return (
        "[Pipeline Handoff Context]\n"
        "This is injected context for the assistant, not a user request.\n"
        f"Pipeline: {name}\nOutcome: {outcome}\n\n"
        "Use this context when answering follow-up questions after the pipeline handoff."
    )


def pipeline_body(p: PipeRun) -> Generator[Any, Any, None]:
    """The scripted pipeline; yields ``(envelopes, waits)`` and receives the answer."""
    pipe = p.pipe
    if pipe.name == "selling_solution_first":
        yield from solution_first_body(p)
        return
    flags = pipe.flags
    outcome = "completed"
    plans, chosen = copy.deepcopy(CANDIDATES), 0  # the plans offered and the one chosen
    p.emit(
        "pipeline_started",
        {
            "totalSteps": len(PIPELINE_STEPS),
            "stepNames": list(PIPELINE_STEPS),
            "userRequest": pipe.user_request,
            "pipelineType": pipe.name,
        },
    )
    for name in PIPELINE_STEPS:
        step = p.coord(name)
        index = step["index"]
        # selling.yaml: confirm_and_select is the step with a ui_mode (step_started, tests/data/a2a-selling/01)
        ui_mode = "candidate_selection" if name == "confirm_and_select" else None
        if index > 1 and "PIPE-SLOW" in flags:
            assert p.run is not None
            p.run.sleep(0.5)
        p.emit(
            "step_started",
            {
                "transcript_id": f"transcript_att_{index:04d}",
                "active_attempt_id": f"att_{index:04d}",
                "total": len(PIPELINE_STEPS),
                "uiMode": ui_mode,
                "index": index,
                "name": name,
                "attempt": 1,
                "stepType": "normal",
            },
            step=dict(step, type="normal", uiMode=ui_mode),
        )
        if name == "evaluate_candidates" and flags & {"PIPE-CANDIDATES", "PIPE-PERMS"}:
            # the parallel step has no LLM turn of its own: it completes with its candidates' results
            evaluated = _pipe_candidates(p, step)
            data = {"durationS": 0.05, "conclusionField": PIPELINE_FIELDS[name], "conclusion": evaluated}
            p.emit("step_completed", dict(data, candidatesCount=len(evaluated)), step=step)
            continue
        p.emit("context_usage", _context_usage(0), step=step)
        p.say(f"Working on {name}.", step=step)
        conclusion = copy.deepcopy(PIPELINE_CONCLUSIONS[name])
        asked = False
        if name == "intent_parsing" and "PIPE-ASK" in flags:
            option, reply = yield from _pipe_question(p, step, _ASK, _ASK.options)
            conclusion["clarification_choice"] = option["id"] if option else reply
            asked = True
        elif name == "architecture_planning" and "PIPE-RESOURCE" in flags:
            selection = yield from _pipe_resource(p, step)
            conclusion["vpcId"] = selection["value"] if selection["status"] == "selected" else None
            asked = True
        elif name == "confirm_and_select" and "PIPE-CANDIDATES" in flags:
            # as the real kernel (tests/data/a2a-selling/01, 02): the step first completes with the
            # LLM's options, then waits; the options' ids are the candidates' indexes ("0", "1")
            offered = [_llm_option(i, c, pipe.rich) for i, c in enumerate(plans)]
            shown = [
                dict(c, id=str(i)) if pipe.rich else {"id": str(i), "label": c["label"]} for i, c in enumerate(plans)
            ]
            _pipe_complete_step(p, step, {"options": offered, "user_prompt": SELECT_PROMPT}, ooo=False)
            chosen = yield from _pipe_selection(p, step, offered, shown, SELECT_PROMPT)
            conclusion = {
                "selected_evaluated_candidate_index": chosen,
                "selected_candidate_name": plans[chosen]["label"],
                "selected_candidate_index": chosen,
            }
            asked = True
        elif name == "deploying" and "PIPE-CANDIDATES" in flags:
            conclusion = yield from _pipe_deploy_permission(p, step, chosen=plans[chosen])
            asked = True
        if asked:
            p.emit("context_usage", _context_usage(3), step=step)
            p.say(f"Working on {name}.", step=step)
        if name == "architecture_planning" and "PIPE-FAIL" in flags:
            _pipe_fail(p, step)
            return
        _pipe_complete_step(p, step, conclusion, ooo="PIPE-OOO" in flags and name == "architecture_planning")
    _pipe_finish(p, outcome)


def solution_first_body(p: PipeRun) -> Generator[Any, Any, None]:
    """``selling_solution_first`` as the real kernel runs it (tests/data/a2a-selling/13-20): three steps.

    solution_planning_and_selection (``uiMode: candidate_selection``) completes with the candidates'
    options (``status: awaiting_selection``); with ``[PIPE-CANDIDATES]`` it then waits for
    ``candidate_selection`` (prompt "Choose the solution to implement and deploy", options with
    their summaries) and the kernel resolves the answer itself: ``input_received`` and at once a
    second ``step_completed`` (``status: selected``), no LLM turn. materialize_selected_candidate
    (``uiMode: deployment_confirmation``) completes ``awaiting_confirmation`` and waits for the
    deployment confirmation (:func:`_pipe_confirmation`): confirm goes on to deploying (``ros_deploy``
    behind its permission), cancel ends the pipeline early, reselect rolls back to the planning
    step (a new attempt). The template write and the ROS validation, pricing and preview of the real
    step 2 are not scripted.
    """
    pipe = p.pipe
    waits = "PIPE-CANDIDATES" in pipe.flags
    plans, chosen, outcome = copy.deepcopy(CANDIDATES), 0, "completed"
    offered = [{"name": c["label"], "summary": c["summary"], "candidate_index": i} for i, c in enumerate(plans)]
    tried = dict.fromkeys(SOLUTION_FIRST_STEPS, 0)  # attempts per step (a rollback starts a new one)
    attempts = 0  # the kernel's attempt ids count step starts and resumed waits (att_0001, att_0002, ...)
    p.emit(
        "pipeline_started",
        {
            "totalSteps": len(SOLUTION_FIRST_STEPS),
            "stepNames": list(SOLUTION_FIRST_STEPS),
            "userRequest": pipe.user_request,
            "pipelineType": pipe.name,
        },
    )
    position = 0
    while position < len(SOLUTION_FIRST_STEPS):
        name = SOLUTION_FIRST_STEPS[position]
        position += 1
        tried[name] += 1
        step = p.coord(name, tried[name])
        ui_mode = {
            "solution_planning_and_selection": "candidate_selection",
            "materialize_selected_candidate": "deployment_confirmation",
        }.get(name)
        attempts += 1
        p.emit(
            "step_started",
            {
                "transcript_id": f"transcript_att_{attempts:04d}",
                "active_attempt_id": f"att_{attempts:04d}",
                "total": len(SOLUTION_FIRST_STEPS),
                "uiMode": ui_mode,
                "index": step["index"],
                "name": name,
                "attempt": tried[name],
                "stepType": "normal",
            },
            step=dict(step, type="normal", uiMode=ui_mode),
        )
        p.emit("context_usage", _context_usage(0), step=step)
        p.say(f"Working on {name}.", step=step)
        selection = {"status": "selected", "continue_pipeline": True, "is_infra_intent": True, "options": offered}
        if name == "solution_planning_and_selection" and waits:
            awaiting = dict(selection, status="awaiting_selection", user_prompt=SOLUTION_PROMPT)
            _pipe_complete_step(p, step, awaiting, ooo=False)
            shown = [{"id": str(i), "label": o["name"], "summary": o["summary"]} for i, o in enumerate(offered)]
            chosen = yield from _pipe_selection(p, step, offered, shown, SOLUTION_PROMPT)
            attempts += 1
            selected = dict(awaiting, status="selected", selected_candidate_index=chosen)
            selected.update(selected_candidate_name=plans[chosen]["label"], user_input=offered[chosen]["name"])
            _pipe_step_resolved(p, step, selected)
            continue
        if name == "materialize_selected_candidate" and waits:
            awaiting = dict(CONFIRMATION_PLAN, options=copy.deepcopy(CONFIRMATION_OPTIONS))
            awaiting["template_url"] = f"templates/{chosen}-{plans[chosen]['label'].lower().replace(' ', '-')}.yml"
            _pipe_complete_step(p, step, awaiting, ooo=False)
            action = yield from _pipe_confirmation(p, step, awaiting)
            attempts += 1
            if action == "reselect":
                # the step concludes reselect_requested and the pipeline rolls back to the planning step
                reason = json.dumps({"action": action})
                _pipe_step_resolved(p, step, {"status": "reselect_requested", "reselect_reason": reason})
                position = 0
                rolled = p.coord(SOLUTION_FIRST_STEPS[0], tried[SOLUTION_FIRST_STEPS[0]] + 1)
                rollback = {"fromStep": name, "reason": reason, "toStep": SOLUTION_FIRST_STEPS[0]}
                p.emit(
                    "rollback_completed", dict(rollback, staleFields=["selected_plan"]), scope="pipeline", step=rolled
                )
                continue
            confirmed = action == "confirm"
            conclusion = dict(awaiting, status="confirmed", deployment_confirmed=True)
            if not confirmed:
                conclusion = {"status": "cancelled", "continue_pipeline": False, "deployment_confirmed": False}
                outcome = "early_exit"  # continue_pipeline false: the pipeline ends after this step
            _pipe_step_resolved(p, step, conclusion)
            if not confirmed:
                break
            continue
        if name == "solution_planning_and_selection":
            conclusion = dict(selection, selected_candidate_index=0, selected_candidate_name=plans[0]["label"])
        elif name == "materialize_selected_candidate":
            conclusion = {"status": "confirmed", "continue_pipeline": True, "deployment_confirmed": True}
        elif waits:
            conclusion = yield from _pipe_deploy_permission(p, step, chosen=plans[chosen])
            p.emit("context_usage", _context_usage(3), step=step)
            p.say(f"Working on {name}.", step=step)
        else:
            conclusion = copy.deepcopy(PIPELINE_CONCLUSIONS[name])
        _pipe_complete_step(p, step, conclusion, ooo=False)
    _pipe_finish(p, outcome)


def _pipe_step_resolved(p: PipeRun, step: dict[str, Any], conclusion: dict[str, Any]) -> None:
    """A step the kernel completes itself from a structured answer: ``step_completed``, no LLM turn."""
    data = {"durationS": 0.04, "conclusionField": PIPELINE_FIELDS[step["id"]], "conclusion": conclusion}
    p.emit("step_completed", data, step=step)


#: What materialize_selected_candidate concludes before the confirmation (tests/data/a2a-selling/15).
CONFIRMATION_PLAN: dict[str, Any] = {
    "status": "awaiting_confirmation",
    "continue_pipeline": True,
    "deployment_confirmed": False,
    "selection_valid": True,
    "user_prompt": "Choose the next action",
    "solution_summary": "A small web tier on Alibaba Cloud.",
    "cost": {"quote_status": "succeeded", "monthly_estimate": "¥8.00/month", "currency": "CNY", "resources": []},
    "parameter_overrides": {},
    "effective_deployment_parameters": {},
    "preview_ready_for_create": True,
}
CONFIRMATION_OPTIONS: tuple[dict[str, str], ...] = (
    {
        "action": "confirm",
        "name": "Confirm deployment",
        "summary": "Create cloud resources using the current solution and parameters",
    },
    {
        "action": "reselect",
        "name": "Choose another solution",
        "summary": "Return to solution planning and choose again",
    },
    {"action": "cancel", "name": "Cancel", "summary": "End the workflow without creating cloud resources"},
)


def _pipe_confirmation(p: PipeRun, step: dict[str, Any], plan: dict[str, Any]) -> Generator[Any, Any, str]:
    """The deployment_confirmation wait as the real kernel raises it (tests/data/a2a-selling/15-20).

    No tool call and no ``iac_code.input``: the INPUT_REQUIRED frame carries only the
    ``input_required`` envelope (data ``solution_summary, options`` by ``action``, ``template_url,
    stepId, preview_ready_for_create, kind, cost, effective_deployment_parameters, prompt,
    parameter_overrides``), and no stored task lists it (capture 21). The answer is the structured
    ``{"action": ...}`` or a 1-based option number (:func:`confirmation_action`): ``input_received``
    ``{userInputLength, kind, selectedValue, action, parameter_overrides, structured}``. Returns the action.
    """
    data = {
        "solution_summary": plan["solution_summary"],
        "options": copy.deepcopy(plan["options"]),
        "template_url": plan["template_url"],
        "stepId": step["id"],
        "preview_ready_for_create": plan["preview_ready_for_create"],
        "kind": "deployment_confirmation",
        "cost": copy.deepcopy(plan["cost"]),
        "effective_deployment_parameters": {},
        "prompt": plan["user_prompt"],
        "parameter_overrides": {},
    }
    envelope = p.event("input_required", data, status="input_required", step=step)
    shown = {"kind": "deployment_confirmation", "options": copy.deepcopy(plan["options"])}
    answer = yield [envelope], [Pending("deployment_confirmation", "input-" + envelope["eventId"], "", shown)]
    action, text = answer["action"], answer["text"]
    received = {"userInputLength": len(text), "kind": "deployment_confirmation", "selectedValue": text}
    p.emit("input_received", dict(received, action=action, parameter_overrides={}, structured=True), step=step)
    return str(action)


def confirmation_action(options: list[dict[str, Any]], answer: str) -> tuple[str, str] | None:
    """``(action, text)`` of a deployment confirmation answer, or None (not a structured answer).

    As the real kernel (``iac_code/pipeline/engine/ui_contract.py``, ``pipeline_runner.py``): JSON
    ``{"action": ...}`` naming one of the offered actions, or a 1-based option number, which the
    kernel turns into that JSON. Natural language, which the real kernel hands to its LLM, is not
    scripted.
    """
    actions = [str(o.get("action")) for o in options]
    reply = answer.strip()
    if reply.isdecimal() and 0 < int(reply) <= len(actions):
        return actions[int(reply) - 1], json.dumps({"action": actions[int(reply) - 1]})
    try:
        value = json.loads(reply)
    except ValueError:
        return None
    action = value.get("action") if isinstance(value, dict) else None
    if not isinstance(action, str) or action.strip().lower() not in actions:
        return None
    return action.strip().lower(), reply


def _input_wait(
    p: PipeRun,
    step: dict[str, Any],
    *,
    kind: str,
    tool: str,
    prefix: str,
    tool_input: dict[str, Any],
    asked: dict[str, Any],
    offered: dict[str, Any],
    received: Callable[[Any], dict[str, Any]],
) -> Generator[Any, Any, Any]:
    """A wait for the user inside a step; returns the answer the resume sends in.

    The tool call and its usage, then ``input_required`` (``asked``: the keys of
    its data after kind/inputId/toolUseId) with the ``iac_code.input`` envelope
    (``offered``: its keys after the ids); the answer gets ``input_received``
    (``received(answer)``: its keys after kind/inputId/toolUseId).
    """
    pipe = p.pipe
    tool_use_id = f"call_{prefix}_" + random_hex(12)
    input_id = f"{prefix}-{tool_use_id}"
    ids = {"kind": kind, "inputId": input_id, "toolUseId": tool_use_id}
    p.emit("tool_started", {"toolUseId": tool_use_id, "toolName": tool, "input": tool_input}, step=step)
    with p.batch():
        p.emit("usage", dict(_PIPE_USAGE), step=step)
        p.emit("context_usage", _context_usage(1), step=step)
    data = dict(ids, **asked)
    envelope = p.event("input_required", data, status="input_required", step=step, input_=dict(data, required=True))
    unified = as_struct(
        {
            "schemaVersion": 1,
            "kind": kind,
            "required": True,
            "requestTaskId": pipe.task_id,
            "contextId": pipe.context_id,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            **offered,
        }
    )
    answer = yield [envelope], [Pending(kind, input_id, tool_use_id, unified)]
    p.emit("input_received", dict(ids, **received(answer)), step=step)
    return answer


def _pipe_question(
    p: PipeRun, step: dict[str, Any], question: _Question, offered: Any
) -> Generator[Any, Any, tuple[dict[str, Any] | None, str]]:
    """A question wait (ask_user_question / candidate_selection / deployment_confirmation)."""
    prompt, allow_free_text = question.prompt, question.allow_free_text
    options = [dict(o) for o in offered]

    def received(answer: dict[str, Any]) -> dict[str, Any]:
        option, reply = answer["option"], answer["text"]
        return {
            "question": prompt,
            "options": options,
            "allowFreeText": allow_free_text,
            "selectedId": option["id"] if option else None,
            "selectedLabel": option["label"] if option else None,
            "freeText": "" if option else reply,
            "freeTextLength": 0 if option else len(reply),
            "answerTextLength": len(reply),
        }

    answer = yield from _input_wait(
        p,
        step,
        kind=question.kind,
        tool=question.tool,
        prefix=question.prefix,
        tool_input={"question": prompt, "options": options, "allow_free_text": allow_free_text},
        asked={
            "question": prompt,
            "prompt": prompt,
            "options": options,
            "allowFreeText": allow_free_text,
            "freeTextPrompt": "",
        },
        offered={"prompt": prompt, "allowFreeText": allow_free_text, "options": options},
        received=received,
    )
    return answer["option"], answer["text"]


def _pipe_selection(
    p: PipeRun, step: dict[str, Any], offered: list[dict[str, Any]], shown: list[dict[str, Any]], prompt: str
) -> Generator[Any, Any, int]:
    """The candidate_selection wait as the real kernel raises it (tests/data/a2a-selling/01, 02).

    No tool call: ``input_required`` (data ``stepId, options, prompt, kind``, the options as the
    LLM concluded them; no ``input`` in the envelope) whose ``iac_code.input`` has the id
    ``input-<the envelope's eventId>``, the ``shown`` options and no ``toolUseId`` or
    ``allowFreeText``; the answer (the label or the id) gets ``input_received`` with
    ``userInputLength, selectedValue, kind, selectedIndex, selectedOption``. Returns the index.
    """
    pipe = p.pipe
    data = {"stepId": step["id"], "options": offered, "prompt": prompt, "kind": "candidate_selection"}
    envelope = p.event("input_required", data, status="input_required", step=step)
    input_id = "input-" + envelope["eventId"]
    unified = as_struct(
        {
            "schemaVersion": 1,
            "inputId": input_id,
            "contextId": pipe.context_id,
            "options": shown,
            "requestTaskId": pipe.task_id,
            "required": True,
            "prompt": prompt,
            "kind": "candidate_selection",
        }
    )
    answer = yield [envelope], [Pending("candidate_selection", input_id, "", unified)]
    index = int(answer["option"]["id"])
    p.emit(
        "input_received",
        {
            "userInputLength": len(answer["text"]),
            "selectedValue": answer["text"],
            "kind": "candidate_selection",
            "selectedIndex": index,
            "selectedOption": offered[index],
        },
        step=step,
    )
    return index


def _pipe_resource(p: PipeRun, step: dict[str, Any]) -> Generator[Any, Any, dict[str, Any]]:
    """A cloud_resource_selection wait (answered through ``iac_code.inputResponse``)."""
    selector = copy.deepcopy(RESOURCE_SELECTOR)
    shown = {"prompt": RESOURCE_PROMPT, "selector": selector}
    selection: dict[str, Any] = yield from _input_wait(
        p,
        step,
        kind="cloud_resource_selection",
        tool="select_cloud_resource",
        prefix="resource",
        tool_input={"prompt": RESOURCE_PROMPT, "selectorId": selector["selectorId"]},
        asked=shown,
        offered=shown,
        received=lambda chosen: {key: chosen[key] for key in ("selectorId", "status", "value", "label")},
    )
    return selection


#: A candidate's sub-pipeline and its steps, with the conclusion field of each (selling's
#: ``evaluate_candidate``; the optional ``reviewing`` step is off by default).
SUB_PIPELINE = "evaluate_candidate"
CANDIDATE_STEPS: tuple[tuple[str, str], ...] = (("template_generating", "template"), ("cost_estimating", "cost"))
TEMPLATE = "ROSTemplateFormatVersion: '2015-09-01'\nDescription: scripted kernel template\nResources: {}\n"


@dataclass
class _CandidateRun:
    """One candidate of ``evaluate_candidates``: its coordinates and what its steps concluded."""

    plan: dict[str, Any]
    index: int
    cid: str
    coordinate: dict[str, Any]
    conclusions: dict[str, Any]

    @property
    def ids(self) -> dict[str, Any]:
        """The keys every candidate event's data starts with."""
        return {
            "candidateName": self.plan["label"],
            "subPipelineId": self.cid,
            "candidateIndex": self.index,
            "subPipelineName": SUB_PIPELINE,
        }

    def step_coordinate(self, position: int) -> dict[str, Any]:
        step_id = CANDIDATE_STEPS[position][0]
        return {
            "total": len(CANDIDATE_STEPS),
            "id": step_id,
            "runId": f"{self.coordinate['runId']}-{step_id}-1",
            "attempt": 1,
            "index": position + 1,
        }

    def conclusion(self, step_id: str) -> dict[str, Any]:
        plan = self.plan
        if step_id == "template_generating":
            return {
                "description": f"template for {plan['label']}",
                "file_path": f"templates/{self.index + 1}-{plan['label'].lower().replace(' ', '-')}.yml",
                "template": TEMPLATE,
                "region": "cn-hangzhou",
            }
        return {
            "monthly_estimate": plan["totalMonthlyCost"],
            "deployment_parameters": {},
            "template_fixed": False,
            "resources": [{"cost": item["monthlyCost"], "type": item["name"]} for item in plan["costItems"]],
            "preview_validation": {"succeeded": True},
            "currency": "CNY",
            "hard_constraint_checks": [],
        }


def _candidate_runs(step: dict[str, Any]) -> list[_CandidateRun]:
    """The candidates as the real kernel names them (tests/data/a2a-selling/01)."""
    runs = []
    for index, plan in enumerate(CANDIDATES):
        cid = f"{SUB_PIPELINE}_{random_hex(8)}"
        coordinate = {
            "name": plan["label"],
            "id": cid,
            "runId": f"candidate-{cid}-{index}-1",
            "totalSteps": len(CANDIDATE_STEPS),
            "pipelineName": SUB_PIPELINE,
            "index": index,
            "attempt": 1,
        }
        runs.append(_CandidateRun(plan, index, cid, coordinate, {}))
    return runs


def _pipe_candidates(p: PipeRun, step: dict[str, Any]) -> list[dict[str, Any]]:
    """Two candidates evaluated in parallel (interleaved), as the real kernel sends them.

    Each runs ``template_generating`` then ``cost_estimating``; every event inside a candidate's
    step has scope ``candidate_step``. With ``[PIPE-PERMS]`` each candidate's template step first
    writes its template, behind a permission. Returns the step's conclusion (one entry per candidate).
    """
    pipe = p.pipe
    runs = _candidate_runs(step)
    for run in runs:
        steps = [
            dict(run.step_coordinate(i), name=CANDIDATE_STEPS[i][0], status="pending")
            for i in range(len(CANDIDATE_STEPS))
        ]
        data = dict(run.ids, totalSteps=len(CANDIDATE_STEPS))
        p.emit("candidate_started", data, step=step, candidate=dict(run.coordinate, steps=steps))
    for position, (step_id, field) in enumerate(CANDIDATE_STEPS):
        at = [
            {"step": step, "candidate": run.coordinate, "candidate_step": run.step_coordinate(position)} for run in runs
        ]
        for run, where in zip(runs, at, strict=True):
            attempt = 4 + 2 * position + run.index
            data = dict(
                run.ids,
                stepId=step_id,
                totalSteps=len(CANDIDATE_STEPS),
                active_attempt_id=f"att_{attempt:04d}",
                stepIndex=position,
                transcript_id=f"transcript_att_{attempt:04d}",
            )
            p.emit("candidate_step_started", data, **where)
        for where in at:
            p.emit("context_usage", _context_usage(0), **where)
        for where in at:
            p.emit("message_started", {"messageId": "msg_" + random_hex(24)}, **where)
        for run, where in zip(runs, at, strict=True):
            p.emit("text_delta", {"text": f"{run.plan['label']}: working on {step_id}."}, **where)
        if step_id == "template_generating" and "PIPE-PERMS" in pipe.flags:
            _candidate_permissions(p, runs, at)
        calls = [(run, where, "call_complete_" + random_hex(12)) for run, where in zip(runs, at, strict=True)]
        for run, where, call in calls:
            tool_input = {"conclusion": run.conclusion(step_id)}
            p.emit("tool_started", {"toolUseId": call, "toolName": "complete_step", "input": tool_input}, **where)
        with p.batch():
            for where in at:
                p.emit("usage", dict(_PIPE_USAGE), **where)
                p.emit("context_usage", _context_usage(2), **where)
        for run, where, call in calls:
            conclusion = run.conclusion(step_id)
            result = {
                "toolUseId": call,
                "toolName": "complete_step",
                "isError": False,
                "result": f"Step {step_id.replace('_', ' ').capitalize()} completed. Conclusion submitted.",
                "input": {"conclusion": conclusion},
            }  # no normalizedConclusion inside a candidate's step (tests/data/a2a-selling/01)
            p.emit("tool_result", result, **where)
        for run, where in zip(runs, at, strict=True):
            conclusion = run.conclusion(step_id)
            run.conclusions[step_id] = conclusion
            data = dict(
                run.ids,
                stepId=step_id,
                conclusionField=field,
                totalSteps=len(CANDIDATE_STEPS),
                conclusion=conclusion,
            )
            p.emit("candidate_step_completed", data, **where)
            if step_id == "template_generating":
                _template_artifact(p, conclusion, where)
    evaluated = []
    for run in runs:
        conclusions = {field: run.conclusions[step_id] for step_id, field in CANDIDATE_STEPS}
        data = dict(
            run.ids,
            totalSteps=len(CANDIDATE_STEPS),
            failed=False,
            conclusions=conclusions,
            step_conclusions=dict(run.conclusions),
        )
        p.emit("candidate_completed", data, step=step, candidate=run.coordinate)
        evaluated.append(dict(conclusions, candidate={"name": run.plan["label"]}, failed=False))
    return evaluated


def _template_artifact(p: PipeRun, conclusion: dict[str, Any], where: dict[str, Any]) -> None:
    """The template a candidate's template step concluded, published as the real kernel does.

    selling's ``a2a_artifacts`` (tests/data/a2a-selling/01): an ``artifactUpdate`` frame with the
    file as an ``iac-code-artifact://`` part, then an ``artifact_created`` envelope (scope
    ``candidate_step``) whose data and ``artifact`` describe it.
    """
    assert p.run is not None
    content = conclusion["template"].encode("utf-8")
    digest = hashlib.sha256(content).hexdigest()
    artifact_id = str(uuid.uuid4())
    filename = conclusion["file_path"].rsplit("/", 1)[-1]
    uri = f"iac-code-artifact://{artifact_id}/{filename}"
    meta = {"byteSize": len(content), "uri": uri, "mediaType": "text/yaml", "sha256": digest}
    part = {"url": uri, "metadata": dict(meta), "filename": filename, "mediaType": "text/yaml"}
    p.run.artifact(as_struct({"artifactId": artifact_id, "name": filename, "parts": [part], "metadata": meta}))
    described = dict(
        meta,
        role="final",
        supersedesPath=conclusion["file_path"],
        supersedesKey="sha256:" + hashlib.sha256(conclusion["file_path"].encode()).hexdigest()[:16],
        artifactId=artifact_id,
        filename=filename,
        dedupeKey=hashlib.sha256(f"{artifact_id}:{digest}".encode()).hexdigest(),
    )
    p.emit("artifact_created", dict(described, source="conclusion"), artifact=described, **where)


def _candidate_permissions(p: PipeRun, runs: list[_CandidateRun], at: list[dict[str, Any]]) -> None:
    """Each candidate's template step writes its template: a ``write_file`` permission per candidate.

    As the real kernel (tests/data/a2a-selling/05, 08): each ``permission_requested`` (data
    ``{toolName, toolUseId}``, a ``permission`` object in the envelope) goes out in its own WORKING
    statusUpdate with ``iac_code.input`` (``scope: "candidate_step"``, ``subPipelineId``); the
    task stays WORKING and the stream open while the kernel waits; GetTask lists the waits in
    ``pendingPermissions``. Answers come out of band (:func:`sideband_answer_locked`); each gets
    ``permission_resolved`` on the pipeline's stream, then the writes run.
    """
    pipe = p.pipe
    waits: list[Pending] = []
    for run, where in zip(runs, at, strict=True):
        path = run.conclusion("template_generating")["file_path"]
        tool_use_id = f"call_write_{run.index}_" + random_hex(8)
        tool_input = {"content": TEMPLATE, "path": path}
        p.emit("tool_started", {"toolName": "write_file", "input": tool_input, "toolUseId": tool_use_id}, **where)
        shown = dict(
            write_permission_shown(pipe.language, path, TEMPLATE), scope="candidate_step", subPipelineId=run.cid
        )
        waits.append(
            Pending.for_permission(
                task_id=pipe.task_id,
                context_id=pipe.context_id,
                language=pipe.language,
                tool_use_id=tool_use_id,
                tool_name="write_file",
                shown=shown,
                extra={"coords": where, "input": tool_input},
            )
        )
    with p.batch():
        for where in at:
            p.emit("usage", dict(_PIPE_USAGE), **where)
            p.emit("context_usage", _context_usage(1), **where)
    with p.state.lock:
        pipe.side_waits = list(waits)
    for wait in waits:
        envelope = wait.envelope
        permission = {
            key: envelope[key]
            for key in (
                "safeSummary",
                "language",
                "title",
                "purpose",
                "effect",
                "toolUseId",
                "target",
                "inputId",
                "toolName",
                "prompt",
                "options",
                "isReadOnly",
            )
        }
        permission.update(permissionId=wait.input_id, pending=True)
        requested = p.event(
            "permission_requested",
            {"toolName": "write_file", "toolUseId": wait.tool_use_id},
            permission=permission,
            **wait.extra["coords"],
        )
        p.send(requested, extra={"input": envelope})
    decisions = _await_sideband(p, waits)
    assert p.run is not None
    for wait in waits:
        tool_input = wait.extra["input"]
        if decisions[wait.input_id] == "allow_once":
            denied, result = write_file_result(pipe.language, p.run.task.cwd, tool_input["path"], TEMPLATE)
        else:
            denied, result = True, "The user denied permission to run write_file."
        data = {"result": result, "toolName": "write_file", "isError": denied, "input": tool_input}
        p.emit("tool_result", dict(data, toolUseId=wait.tool_use_id), **wait.extra["coords"])


def _await_sideband(p: PipeRun, waits: list[Pending]) -> dict[str, str]:
    """Block until every candidate-step permission is answered; ``permission_resolved`` for each."""
    pipe = p.pipe
    assert p.run is not None
    decisions: dict[str, str] = {}
    while len(decisions) < len(waits):
        try:
            pending, decision = pipe.side_answers.get(timeout=0.02)
        except queue.Empty:
            if p.run.task.cancel_event.is_set():
                with p.state.lock:
                    pipe.side_waits = []
                raise Canceled() from None
            continue
        decisions[pending.input_id] = decision
        data = {
            "kind": "permission",
            "decision": decision,
            "pending": False,
            "toolName": pending.envelope["toolName"],
            "inputId": pending.input_id,
            "permissionId": pending.input_id,
            "toolUseId": pending.tool_use_id,
        }
        permission = {k: v for k, v in data.items() if k != "kind"}
        p.emit("permission_resolved", data, permission=permission, **pending.extra["coords"])
    return decisions


def _pipe_deploy_permission(
    p: PipeRun, step: dict[str, Any], *, chosen: dict[str, Any]
) -> Generator[Any, Any, dict[str, Any]]:
    """deploying calls ``ros_deploy``, whose permission is the step's wait (tests/data/a2a-selling/10, 11).

    ``tool_started``, the usage pair, then ``permission_requested`` (status ``input_required``,
    data ``{toolName, toolUseId}``, a ``permission`` object; journaled twice, ``pending_backup``
    then ``committed``, only the second sent) in an INPUT_REQUIRED frame with ``iac_code.input``
    (scope ``step``, ``deploymentSummary``, ``operation``), then ``backup_committed`` in one more
    INPUT_REQUIRED frame without ``input``. Answered with the six-key permission data part:
    ``inputReceived`` (WORKING, no envelope), ``permission_resolved``, the tool's result. Returns
    the step's conclusion (``success`` with a stack id, or ``failed`` when denied).
    """
    pipe = p.pipe
    tool_use_id = "call_deploy_" + random_hex(12)
    stack = "agui-scripted-" + random_hex(6)
    template = f"templates/{chosen['label'].lower().replace(' ', '-')}.yml"
    tool_input = {
        "template_url": template,
        "stack_name": stack,
        "action": "create",
        "region_id": "cn-hangzhou",
        "parameters": {},
    }
    p.emit("tool_started", {"toolName": "ros_deploy", "input": tool_input, "toolUseId": tool_use_id}, step=step)
    with p.batch():
        p.emit("usage", dict(_PIPE_USAGE), step=step)
        p.emit("context_usage", _context_usage(1), step=step)
    summary = {
        "resources": [{"name": item["name"], "monthlyCost": item["monthlyCost"]} for item in chosen["costItems"]],
        "action": "create",
        "region": "cn-hangzhou",
        "template": template,
        "candidateName": chosen["label"],
        "totalMonthlyCost": chosen["totalMonthlyCost"],
        "stackName": stack,
    }
    operation = {
        "apiCalls": [{"effect": "change", "product": "ROS", "action": "CreateStack"}],
        "region": "cn-hangzhou",
        "product": "ros",
        "action": "create",
        "target": {"type": "resource", "name": stack},
    }
    shown = {
        "title": "Create ROS stack",
        "purpose": "Call ros CreateStack for the requested Alibaba Cloud infrastructure task.",
        "effect": "cloud_change",
        "target": f"{stack} · {template} · cn-hangzhou",
        "isReadOnly": False,
        "prompt": "Create ROS stack Allow once?",
        "safeSummary": f"Deploy a ROS stack; plan: {chosen['label']}; region: cn-hangzhou; stack: {stack}",
        "options": [{"id": "allow_once", "label": "Allow once"}, {"id": "deny", "label": "Deny"}],
        "scope": "step",
        "deploymentSummary": summary,
        "operation": operation,
    }
    wait = Pending.for_permission(
        task_id=pipe.task_id,
        context_id=pipe.context_id,
        language=pipe.language,
        tool_use_id=tool_use_id,
        tool_name="ros_deploy",
        shown=shown,
        extra={},
    )
    permission = {k: v for k, v in wait.envelope.items() if k in shown and k != "scope"}
    permission.update(toolUseId=tool_use_id, inputId=wait.input_id, toolName="ros_deploy", language=pipe.language)
    permission.update(permissionId=f"perm-{tool_use_id}", pending=True)
    data = {"toolName": "ros_deploy", "toolUseId": tool_use_id}
    kwargs = {"status": "input_required", "permission": permission, "step": step}
    p.event("permission_requested", dict(data), visibility="pending_backup", **kwargs)
    requested = p.event("permission_requested", dict(data), visibility="committed", **kwargs)
    committed = {
        "committedSequence": requested["sequence"],
        "committedEventId": requested["eventId"],
        "committedEventType": "permission_requested",
    }
    backup = p.event("backup_committed", committed, status="input_required")
    with p.state.lock:
        pipe.waits = [wait]
    p.send(requested, extra={"input": wait.envelope})
    decision = yield [backup], [wait]
    resolved = {
        "pending": False,
        "toolName": "ros_deploy",
        "toolUseId": tool_use_id,
        "decision": decision,
        "kind": "permission",
        "inputId": wait.input_id,
        "permissionId": f"perm-{tool_use_id}",
    }
    p.emit("permission_resolved", resolved, step=step)  # no permission object here (capture 11)
    if decision != "allow_once":
        result = {"toolName": "ros_deploy", "toolUseId": tool_use_id, "input": tool_input, "isError": True}
        p.emit("tool_result", dict(result, result="The user denied permission to run ros_deploy."), step=step)
        return {"status": "failed", "error": "The user denied the deployment."}
    stack_id = str(uuid.uuid4())
    outcome = {"StackId": stack_id, "Status": "CREATE_COMPLETE", "StackName": stack}
    result = {"toolName": "ros_deploy", "toolUseId": tool_use_id, "input": tool_input, "isError": False}
    p.emit("tool_result", dict(result, result=json.dumps(outcome)), step=step)
    return {"status": "success", "stack_id": stack_id, "stack_name": stack, "region": "cn-hangzhou"}


def _pipe_complete_step(p: PipeRun, step: dict[str, Any], conclusion: dict[str, Any], *, ooo: bool) -> None:
    """complete_step: tool_started, usage + context_usage, tool_result, step_completed.

    With ``ooo`` the two usage envelopes go out in reverse order and the
    tool_result exists only in the journal (a gap on the live stream).
    """
    name = step["id"]
    tool_use_id = "call_complete_" + random_hex(12)
    tool_input = {"conclusion": conclusion}
    p.emit("tool_started", {"toolUseId": tool_use_id, "toolName": "complete_step", "input": tool_input}, step=step)
    result = {
        "toolUseId": tool_use_id,
        "toolName": "complete_step",
        "isError": False,
        "result": f"Step {name.replace('_', ' ').capitalize()} completed. Conclusion submitted.",
        "input": tool_input,
        "normalizedConclusion": conclusion,
    }
    if ooo:
        usage = p.event("usage", dict(_PIPE_USAGE), step=step)
        context_usage = p.event("context_usage", _context_usage(2), step=step)
        p.event("tool_result", result, step=step)  # journal only
        p.send(context_usage)
        p.send(usage)
    else:
        with p.batch():
            p.emit("usage", dict(_PIPE_USAGE), step=step)
            p.emit("context_usage", _context_usage(2), step=step)
        p.emit("tool_result", result, step=step)
    data = {"durationS": 0.05, "conclusionField": PIPELINE_FIELDS[name], "conclusion": conclusion}
    p.emit("step_completed", data, step=step)


def _pipe_fail(p: PipeRun, step: dict[str, Any]) -> None:
    error_id = random_hex(12)
    details = {
        "type": "StepFailed",
        "errorId": error_id,
        "traceback": "Stack trace omitted from public event; see error_id.",
        "step_id": step["id"],
    }
    data = {"errorSummary": STEP_FAIL_TEXT, "error": STEP_FAIL_TEXT, "errorDetails": details}
    p.emit("step_failed", data, status="failed", step=step)
    p.emit(
        "pipeline_error",
        {"error": STEP_FAIL_TEXT, "errorId": error_id, "stepId": step["id"], "recoverable": False},
        status="failed",
    )
    _pipe_finish(p, "failed")


def _pipe_finish(p: PipeRun, outcome: str) -> None:
    """The end pattern of capture 38: two journal-only events, then 21, 23, 22, 24 live."""
    failed = outcome == "failed"
    status = "failed" if failed else "completed"
    terminal = "pipeline_failed" if failed else "pipeline_completed"
    total = len(pipeline_steps(p.pipe.name))
    terminal_data = (
        {"totalSteps": total, "failed": True}
        if failed
        # a completed pipeline's data has no earlyExit (tests/data/a2a-selling/02, 11); an early exit's
        # has earlyExit: true (tests/data/a2a/39)
        else {"totalSteps": total, "earlyExit": True}
        if outcome == "early_exit"
        else {"totalSteps": total}
    )
    handoff = {
        "action": "switch_to_normal",
        "targetMode": "normal",
        "outcome": outcome,
        "summary": _handoff_summary(p.pipe.name, outcome),
        "cleanup": {
            "status": "unavailable",
            "statusMessage": "Cleanup state unavailable. Inspect the session file and cloud resources manually.",
        },
    }
    p.event(terminal, dict(terminal_data), status=status, visibility="pending_backup")
    p.event("pipeline_handoff_ready", copy.deepcopy(handoff), status=status, visibility="pending_backup")
    done = p.event(terminal, dict(terminal_data), status=status, visibility="committed")
    ready = p.event("pipeline_handoff_ready", copy.deepcopy(handoff), status=status, visibility="committed")
    backups = [
        p.event(
            "backup_committed",
            {
                "committedEventId": e["eventId"],
                "committedEventType": e["eventType"],
                "committedSequence": e["sequence"],
            },
            status=status,
        )
        for e in (done, ready)
    ]
    p.send(done)
    p.send(backups[0])
    p.send(ready)
    p.send(backups[1], close=True)
