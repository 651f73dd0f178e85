"""A scripted OpenAI-compatible chat-completions server for the project's real-kernel tests.

The iac-code kernel is pointed at this server (provider "OpenAI Compatible") so that a whole
A2A turn runs offline and deterministically. The reply is chosen from the conversation the
kernel sends, using markers in the latest user message:

``[PIPE-ASK]``  (pipeline turn: the tools include ``ask_user_question`` and ``complete_step``)
                ``ask_user_question`` with the options cn-hangzhou / cn-shanghai; once that
                question has been answered, ``complete_step``.
(tool result)   when the last message is a tool result: "Tool finished. Result: <result>"
                (with ``[SLOW-AFTER]`` in the user's message, its chunks ``slow_interval`` apart).
``[PIPE-SELL]`` (pipeline turn of the real ``selling`` pipeline) every step is played, recognised
                by the skill named in its system prompt (:func:`pipeline_step`): intent (with
                ``[PIPE-ASK]`` first the region question), architecture (two candidates), per
                candidate template and cost (no cloud tool: ``preview_validation.succeeded``
                false), the candidate selection (options, then the ``selected_*`` fields once the
                user chose, following the offered ``complete_step`` schema, ``rich-v1`` or not)
                and deploying (``status: failed``, no cloud account; then a closing text).
                The markers travel on in the conclusions, since each step is a new conversation.
                ``[PIPE-FAIL-AT:<step>]`` HTTP 400 in that step; ``[PIPE-WRITE]`` a ``write_file``
                of the template in each candidate's template step; ``[PIPE-SLOW]`` the
                architecture step streams one chunk per ``slow_interval``; ``[PIPE-DEPLOY]``
                deploying first calls ``ros_deploy`` (create, remote template URL: a permission
                is asked before any cloud call) and concludes ``failed`` with its result;
                ``[PIPE-CLOUD]`` (with the fake cloud of ``tests/support/fake_aliyun.py``) each
                candidate's cost step calls ``ros_validate_template``, ``ros_preview_template``
                and ``ros_estimate_template_cost`` on a remote template URL and concludes with
                the ``TradeAmount`` the kernel handed back (``preview_validation.succeeded``),
                confirm_and_select offers those prices, and deploying calls ``ros_deploy``
                (create) and concludes with its result. The markers reach a candidate's cost
                step through the candidates' ``resource_intents``, the only candidate field
                its prompt shows.
``[PIPE-SSF]``  (pipeline turn of the real ``selling_solution_first``, :func:`ssf_next_call`)
                planning: ``show_architecture_plan`` (two outlines), ``show_candidate_detail`` per
                candidate, ``complete_step`` ``awaiting_selection`` with the intent (the kernel
                resolves the choice itself); materialize: ``write_file`` of the template at the
                path the prompt names, ``ros_validate_template``, ``ros_estimate_template_cost``,
                ``ros_preview_template`` on it, ``complete_step`` ``awaiting_confirmation`` (a
                structured ``{"action": ...}`` reaching the LLM gets the matching status, the
                free text :data:`SSF_CONFIRM_WORDS` gets ``confirmed``);
                deploying: ``ros_deploy`` (create), ``complete_step`` ``failed``, a closing text.
                The markers ride in ``intent.summary``; ``[PIPE-FAIL-AT:<step>]`` works here too.
(judge)         the kernel's interrupt judge (guidance into a running pipeline): a JSON verdict,
                ``supplement`` when the guidance says ``[GUIDE-SUPPLEMENT]``, else ``continue``.
``[FAIL]``      HTTP 400 (``invalid_request_error``). The kernel does not retry 4xx other than
                408/409/429, and neither does the OpenAI SDK, so the turn fails at once.
``[WRITE]``     a streamed ``write_file`` tool call (path ``hello.txt``); the kernel asks for
                permission before running it.
``[THINK]``     ``reasoning_content`` deltas, then the default text.
``[SLOW]``      one text chunk per ``slow_interval`` seconds, ``slow_chunks`` times (with
                ``[WRITE]``: the write_file call, each chunk ``slow_interval`` apart)
                (defaults 1.0 s x 10; env ``FAKE_LLM_SLOW_INTERVAL`` / ``FAKE_LLM_SLOW_CHUNKS``).
``[RECALL]``    "I have seen N user messages." (N = user messages in the request).
``[IMAGE]``     "I see N image(s)." (N = image content parts in the request).
(default)       "Hello from the fake LLM." in three chunks.

Every POST is appended to the log file as one JSON line
(``{"time", "path", "model", "stream", "tools", "messages", "behaviour"}``) so tests can
assert how often the LLM ran and what it saw.

Use it as a library (``FakeLLM(log_path).start() -> base_url``, ``.stop()``) or run it:
``python tests/support/fake_llm.py PORT [LOG_PATH]`` prints the base URL and serves until Ctrl-C
(the log path defaults to env ``FAKE_LLM_LOG`` or ``fake-llm-requests.jsonl`` in the temp dir).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

MODEL_ID = "fake-model"
DEFAULT_TEXT = ("Hello", " from the", " fake LLM.")
WRITE_PATH = "hello.txt"
WRITE_CONTENT = "hello from the fake llm\n"
ASK_QUESTION = "Which region should host the site?"
ASK_OPTIONS = (
    {"id": "hz", "label": "cn-hangzhou"},
    {"id": "sh", "label": "cn-shanghai"},
)
FAIL_STATUS = 400
FAIL_BODY = {
    "error": {
        "message": "scripted non-retryable failure from the fake LLM",
        "type": "invalid_request_error",
        "code": "fake_llm_failure",
    }
}
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def message_text(message: dict[str, Any]) -> str:
    """The text of one chat message (string content or the text parts of a list)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


def count_images(messages: list[dict[str, Any]]) -> int:
    """Image content parts (``image_url`` / ``input_image`` / ``image``) in all messages."""
    count = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            count += sum(
                1
                for part in content
                if isinstance(part, dict) and part.get("type") in {"image_url", "input_image", "image"}
            )
    return count


def tool_names(body: dict[str, Any]) -> list[str]:
    """Function names of the tools offered in a request."""
    names: list[str] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            name = (tool.get("function") or {}).get("name") or tool.get("name")
            if isinstance(name, str):
                names.append(name)
    return names


@dataclass
class Reply:
    """What to answer one chat-completions request with."""

    behaviour: str
    deltas: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    delay: float = 0.0
    error_status: int | None = None
    error_body: dict[str, Any] | None = None


def _text_deltas(pieces: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    return [{"content": piece} for piece in pieces]


def _tool_call_deltas(call_id: str, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """A tool call streamed the way OpenAI does: header first, then the arguments in two pieces."""
    raw = json.dumps(arguments)
    half = len(raw) // 2
    return [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": raw[:half]}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": raw[half:]}}]},
    ]


class Script:
    """Chooses a :class:`Reply` from a request body; holds the per-server counters."""

    def __init__(self, slow_interval: float, slow_chunks: int) -> None:
        self.slow_interval = slow_interval
        self.slow_chunks = slow_chunks
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _call_id(self, kind: str) -> str:
        with self._lock:
            return f"call_fake_{kind}_{next(self._ids)}"

    def plan(self, body: dict[str, Any]) -> Reply:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last = messages[-1] if messages else {}
        user_texts = [message_text(m) for m in messages if m.get("role") == "user"]
        last_user = user_texts[-1] if user_texts else ""
        names = set(tool_names(body))
        after_tool = last.get("role") == "tool"

        if JUDGE_MARK in prompt_text(messages):
            return self._judge(last_user)
        if "complete_step" in names and SSF_MARK in prompt_text(messages):
            return self._pipe_ssf(messages)
        if "complete_step" in names and is_selling(prompt_text(messages)):
            return self._pipe_sell(messages, conclusion_schema(body))
        if any("[PIPE-ASK]" in t for t in user_texts) and {"ask_user_question", "complete_step"} <= names:
            return self._pipe_ask(messages)
        if after_tool:
            result = message_text(last)[:200]
            delay = self.slow_interval if "[SLOW-AFTER]" in last_user else 0.0
            return Reply("tool-result", _text_deltas(["Tool finished. ", "Result: ", result]), delay=delay)
        if "[FAIL]" in last_user:
            return Reply("fail", error_status=FAIL_STATUS, error_body=FAIL_BODY)
        if "[WRITE]" in last_user:
            deltas = _text_deltas(["I will write the file now."])
            deltas += _tool_call_deltas(
                self._call_id("write"),
                "write_file",
                {"path": WRITE_PATH, "content": WRITE_CONTENT},
            )
            # with [SLOW] too, every chunk waits slow_interval: time to act before the permission wait
            delay = self.slow_interval if "[SLOW]" in last_user else 0.0
            return Reply("write", deltas, finish_reason="tool_calls", delay=delay)
        if "[THINK]" in last_user:
            deltas = [
                {"reasoning_content": "Let me think"},
                {"reasoning_content": " about this."},
            ]
            return Reply("think", deltas + _text_deltas(DEFAULT_TEXT))
        if "[SLOW]" in last_user:
            pieces = [f"Chunk {i + 1}. " for i in range(self.slow_chunks)]
            return Reply("slow", _text_deltas(pieces), delay=self.slow_interval)
        if "[RECALL]" in last_user:
            return Reply(
                "recall",
                _text_deltas([f"I have seen {len(user_texts)} user messages."]),
            )
        if "[IMAGE]" in last_user:
            return Reply("image", _text_deltas([f"I see {count_images(messages)} image(s)."]))
        return Reply("default", _text_deltas(DEFAULT_TEXT))

    def _judge(self, last_user: str) -> Reply:
        """The kernel's interrupt judge (guidance sent into a running pipeline): a JSON verdict."""
        action = "supplement" if "[GUIDE-SUPPLEMENT]" in last_user else "continue"
        verdict = {
            "action": action,
            "reason": f"scripted fake LLM verdict: {action}",
            "rollback_target": None,
            "rollback_context": None,
            "candidate_scope": None,
            "supplement_target": None,
        }
        return Reply(f"judge-{action}", _text_deltas([json.dumps(verdict)]))

    def _pipe_sell(self, messages: list[dict[str, Any]], schema: dict[str, Any]) -> Reply:
        """One step of the real ``selling`` pipeline, recognised by the skill in its system prompt.

        Each step is a new conversation that sees only the earlier conclusions, so the
        ``[PIPE-...]`` markers of the user's request travel on in the conclusions (intent summary,
        candidate topology) and are read back from the whole prompt.
        """
        step = pipeline_step(messages)
        everything = prompt_text(messages)
        if step is not None and f"[PIPE-FAIL-AT:{step}]" in everything:
            return Reply(f"sell-{step}-fail", error_status=FAIL_STATUS, error_body=FAIL_BODY)
        calls = _assistant_calls(messages)
        deltas = _text_deltas([f"Working on {step or 'the step'}."])
        if step == "intent_parsing" and "[PIPE-ASK]" in everything and "ask_user_question" not in calls:
            arguments: dict[str, Any] = {
                "question": ASK_QUESTION,
                "options": [dict(o) for o in ASK_OPTIONS],
                "allow_free_text": True,
            }
            deltas += _tool_call_deltas(self._call_id("ask"), "ask_user_question", arguments)
            return Reply("sell-intent-ask", deltas, finish_reason="tool_calls")
        if step == "template_generating" and "[PIPE-WRITE]" in everything and "write_file" not in calls:
            index = _candidate_index(messages)
            candidate = SELL_CANDIDATES[index]
            arguments = {"path": candidate["output_path"], "content": SELL_TEMPLATE}
            deltas += _tool_call_deltas(self._call_id("write"), "write_file", arguments)
            return Reply("sell-template-write", deltas, finish_reason="tool_calls")
        if step == "cost_estimating" and "[PIPE-CLOUD]" in everything:
            index = _candidate_index(messages)
            for tool, arguments in sell_cloud_cost_calls(index):
                if tool not in calls:
                    deltas += _tool_call_deltas(self._call_id("cloud"), tool, arguments)
                    return Reply(f"sell-cost-{tool}", deltas, finish_reason="tool_calls")
        if step == "deploying" and "[PIPE-CLOUD]" in everything and "ros_deploy" not in calls:
            chosen = _deploy_choice(messages)
            arguments = {"action": "create", "stack_name": f"agui-fake-{chosen}", "parameters": {}}
            arguments |= {"template_url": sell_template_url(chosen), "region_id": "cn-hangzhou"}
            deltas += _tool_call_deltas(self._call_id("deploy"), "ros_deploy", arguments)
            return Reply("sell-deploying-ros-deploy", deltas, finish_reason="tool_calls")
        if step == "deploying" and "[PIPE-DEPLOY]" in everything and "ros_deploy" not in calls:
            deltas += _tool_call_deltas(self._call_id("deploy"), "ros_deploy", dict(SELL_DEPLOY_INPUT))
            return Reply("sell-deploying-ros-deploy", deltas, finish_reason="tool_calls")
        if step == "deploying" and "complete_step" in calls:
            # deploying is not ended by complete_step (complete_step_terminal: false): a text ends it
            return Reply("sell-deploying-done", _text_deltas(["Deployment step finished."]))
        conclusion = sell_conclusion(step, messages, schema)
        if conclusion is None:
            return Reply(f"sell-{step}-text", _text_deltas(["Nothing to do in this step."]))
        deltas += _tool_call_deltas(self._call_id("complete"), "complete_step", {"conclusion": conclusion})
        # [PIPE-SLOW]: architecture_planning takes slow_interval per chunk (a window to act in)
        delay = self.slow_interval if "[PIPE-SLOW]" in everything and step == "architecture_planning" else 0.0
        return Reply(f"sell-{step}", deltas, finish_reason="tool_calls", delay=delay)

    def _pipe_ssf(self, messages: list[dict[str, Any]]) -> Reply:
        """One step of the real ``selling_solution_first`` pipeline (``[PIPE-SSF]``).

        The step is recognised by its skill; within a step the next call follows from the calls
        already made in the conversation (:func:`ssf_next_call`). The markers travel on in the
        intent the planning step submits (``intent.summary``), which the later steps' prompts show.
        """
        step = ssf_step(messages)
        everything = prompt_text(messages)
        if step is not None and f"[PIPE-FAIL-AT:{step}]" in everything:
            return Reply(f"ssf-{step}-fail", error_status=FAIL_STATUS, error_body=FAIL_BODY)
        planned = ssf_next_call(step, messages)
        if planned is None:
            # deploying is not ended by complete_step (complete_step_terminal: false): a text ends it
            return Reply(f"ssf-{step}-done", _text_deltas([f"Finished {step or 'the step'}."]))
        tool, arguments = planned
        deltas = _text_deltas([f"Working on {step or 'the step'}."])
        deltas += _tool_call_deltas(self._call_id("ssf"), tool, arguments)
        return Reply(f"ssf-{step}-{tool}", deltas, finish_reason="tool_calls")

    def _pipe_ask(self, messages: list[dict[str, Any]]) -> Reply:
        asked = any(
            (call.get("function") or {}).get("name") == "ask_user_question"
            for m in messages
            if m.get("role") == "assistant"
            for call in m.get("tool_calls") or []
            if isinstance(call, dict)
        )
        deltas = _text_deltas(["Working on the step."])
        if not asked:
            arguments: dict[str, Any] = {
                "question": ASK_QUESTION,
                "options": [dict(o) for o in ASK_OPTIONS],
                "allow_free_text": True,
            }
            deltas += _tool_call_deltas(self._call_id("ask"), "ask_user_question", arguments)
            return Reply("pipe-ask", deltas, finish_reason="tool_calls")
        conclusion = {
            "is_infra_intent": False,
            "confidence": "high",
            "category": "chat",
            "rejection_reason": "scripted fake LLM conclusion",
            "user_message_summary": "scripted pipeline test",
        }
        deltas += _tool_call_deltas(self._call_id("complete"), "complete_step", {"conclusion": conclusion})
        return Reply("pipe-complete", deltas, finish_reason="tool_calls")


SELL_TEMPLATE = """ROSTemplateFormatVersion: '2015-09-01'
Description: scripted fake LLM template
Parameters:
  ZoneId:
    Type: String
    Default: cn-hangzhou-k
Resources:
  Vpc:
    Type: ALIYUN::ECS::VPC
    Properties:
      CidrBlock: 192.168.0.0/16
Outputs:
  VpcId:
    Value:
      Fn::GetAtt: [Vpc, VpcId]
"""
SELL_CANDIDATES: tuple[dict[str, Any], ...] = (
    {
        "name": "ECS behind SLB",
        "output_path": "templates/1-ecs-behind-slb.yml",
        "products": ["ECS", "SLB", "VPC"],
        "hard_constraints": [],
        "topology": "user -> SLB -> ECS in a VPC",
        "monthly_estimate": "about 40 CNY",
        "pros": ["simple"],
        "cons": ["one instance"],
    },
    {
        "name": "Static site on OSS",
        "output_path": "templates/2-static-site-on-oss.yml",
        "products": ["OSS"],
        "hard_constraints": [],
        "topology": "user -> OSS",
        "monthly_estimate": "about 5 CNY",
        "pros": ["cheap"],
        "cons": ["static only"],
    },
)
SELL_COSTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("¥42.50/月", (("ALIYUN::ECS::Instance", "¥30.00/月"), ("ALIYUN::SLB::LoadBalancer", "¥12.50/月"))),
    ("¥8.00/月", (("ALIYUN::OSS::Bucket", "¥8.00/月"),)),
)
SELL_DEPLOY_ERROR = "scripted fake LLM: no cloud account in this test"
# [PIPE-DEPLOY]: a remote template URL, so the kernel asks permission before any cloud call
SELL_DEPLOY_INPUT = {
    "action": "create",
    "stack_name": "fake-sell-stack",
    "template_url": "https://templates.example.invalid/static-site.yml",
    "parameters": {},
}


def sell_template_url(index: int) -> str:
    """[PIPE-CLOUD]: where candidate ``index``'s template is (a remote URL: ROS reads it, not the kernel)."""
    return (
        f"https://agui-fake-templates.oss-cn-hangzhou.aliyuncs.com/{Path(SELL_CANDIDATES[index]['output_path']).name}"
    )


def sell_cloud_cost_calls(index: int) -> list[tuple[str, dict[str, Any]]]:
    """[PIPE-CLOUD]: the ROS calls of a candidate's cost step, in order (validate, preview, price)."""
    url = sell_template_url(index)
    return [
        ("ros_validate_template", {"template_url": url, "region_id": "cn-hangzhou"}),
        (
            "ros_preview_template",
            {"template_url": url, "stack_name": f"agui-preview-{index}", "parameters": {}, "region_id": "cn-hangzhou"},
        ),
        ("ros_estimate_template_cost", {"template_url": url, "parameters": {}, "region_id": "cn-hangzhou"}),
    ]


def prompt_costs(text: str) -> list[str]:
    """The ``¥N.NN/月`` amounts of a prompt, in order (JSON in prompts may escape the symbols)."""
    found = re.findall(r"(?:¥|\\u00a5)([0-9]+\.[0-9]{2})/(?:月|\\u6708)", text)
    return [f"¥{amount}/月" for amount in found]


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [message_text(m) for m in messages if m.get("role") == "tool"]


def cloud_monthly_cost(messages: list[dict[str, Any]]) -> str | None:
    """The total of the GetTemplateEstimateCost answer the kernel handed back (``TradeAmount``s)."""
    for text in reversed(_tool_results(messages)):
        amounts = [float(a) for a in re.findall(r'"TradeAmount"\s*:\s*([0-9.]+)', text)]
        if amounts:
            return f"¥{sum(amounts):.2f}/月"
    return None


def _deploy_choice(messages: list[dict[str, Any]]) -> int:
    """The candidate the deploying step was given (its name in the step's prompt)."""
    text = prompt_text(messages)
    return 1 if SELL_CANDIDATES[1]["name"] in text and SELL_CANDIDATES[0]["name"] not in text else _chosen_any(text)


def _chosen_any(text: str) -> int:
    found = re.search(r'"selected_candidate_index"\s*:\s*(\d+)', text)
    return int(found.group(1)) if found and int(found.group(1)) < len(SELL_CANDIDATES) else 0


def _assistant_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Names of the tools the assistant already called in this conversation, in order."""
    return [
        str((call.get("function") or {}).get("name"))
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if isinstance(call, dict)
    ]


def _candidate_index(messages: list[dict[str, Any]]) -> int:
    """Which of :data:`SELL_CANDIDATES` a candidate-scope request is about (by name in the prompt)."""
    text = " ".join(message_text(m) for m in messages if m.get("role") in {"system", "user"})
    return 1 if SELL_CANDIDATES[1]["name"] in text and SELL_CANDIDATES[0]["name"] not in text else 0


def _chosen_index(messages: list[dict[str, Any]]) -> int:
    """The candidate the user chose, from the last user message (its name or ``"selected...": N``)."""
    user_texts = [message_text(m) for m in messages if m.get("role") == "user"]
    last = user_texts[-1] if user_texts else ""
    for index, candidate in enumerate(SELL_CANDIDATES):
        if candidate["name"] in last:
            return index
    found = re.search(r"selected[a-z_]*index\D+(\d+)", last)
    return int(found.group(1)) if found and int(found.group(1)) < len(SELL_CANDIDATES) else 0


def conclusion_schema(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of ``complete_step``'s ``conclusion`` argument in a request ({} if none)."""
    for tool in body.get("tools") or []:
        function = tool.get("function") or {} if isinstance(tool, dict) else {}
        if function.get("name") == "complete_step":
            properties = (function.get("parameters") or {}).get("properties") or {}
            return dict(properties.get("conclusion") or {})
    return {}


def sell_conclusion(step: str | None, messages: list[dict[str, Any]], schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``complete_step`` conclusion the fake LLM submits for a step of the selling pipeline.

    ``confirm_and_select`` follows the schema the kernel offers: before the choice it asks for
    ``options`` (with the ``rich-v1`` diagram and cost fields only on that surface; the plain
    surface refuses them), after the choice only for the ``selected_*`` fields.
    """
    if step == "intent_parsing":
        return {
            "is_infra_intent": True,
            "confidence": "high",
            "user_message_summary": f"a small website on Alibaba Cloud {markers(prompt_text(messages))}",
            "cloud_platform": "aliyun",
            "business_type": "website",
            "core_requirements": ["host a small website"],
            "hard_constraints": [],
        }
    if step == "architecture_planning":
        carried = markers(prompt_text(messages))
        # the cost step's prompt shows only a candidate's name and resource_intents: the markers ride there
        return {
            "candidates": [
                dict(
                    c,
                    topology=f"{c['topology']} {carried}",
                    resource_intents=[{"product": "VPC", "action": "create", "notes": carried}],
                )
                for c in SELL_CANDIDATES
            ]
        }
    if step == "template_generating":
        candidate = SELL_CANDIDATES[_candidate_index(messages)]
        return {
            "template": SELL_TEMPLATE,
            "file_path": candidate["output_path"],
            "region": "cn-hangzhou",
            "description": f"template for {candidate['name']}",
        }
    if step == "cost_estimating" and "[PIPE-CLOUD]" in prompt_text(messages):
        index = _candidate_index(messages)
        total = cloud_monthly_cost(messages) or "unknown"
        return {
            "monthly_estimate": total,
            "currency": "CNY",
            "resources": [{"type": "ALIYUN::ECS::VPC", "cost": total}],
            "template_fixed": False,
            "deployment_parameters": {},
            "hard_constraint_checks": [],
            "preview_validation": {"succeeded": True, "template_url": sell_template_url(index), "parameters": {}},
        }
    if step == "cost_estimating":
        total, items = SELL_COSTS[_candidate_index(messages)]
        return {
            "monthly_estimate": total,
            "currency": "CNY",
            "resources": [{"type": kind, "cost": cost} for kind, cost in items],
            "template_fixed": False,
            "deployment_parameters": {},
            "hard_constraint_checks": [],
            "preview_validation": {"succeeded": False, "error": "no cloud account in this test"},
        }
    if step == "confirm_and_select":
        wanted = schema.get("properties") or {}
        if "options" not in wanted:
            chosen = _chosen_index(messages)
            return {
                "selected_candidate_name": SELL_CANDIDATES[chosen]["name"],
                "selected_candidate_index": chosen,
                "selected_evaluated_candidate_index": chosen,
            }
        rich = "architecture_diagram" in json.dumps(wanted)
        options: list[dict[str, Any]] = [
            {"name": c["name"], "summary": f"{c['topology']}.", "candidate_index": i}
            for i, c in enumerate(SELL_CANDIDATES)
        ]
        # [PIPE-CLOUD]: each candidate's cost, as its cost step concluded it (once per candidate)
        text = prompt_text(messages)
        cloud = list(dict.fromkeys(prompt_costs(text))) if "[PIPE-CLOUD]" in text else []
        if rich:
            for i, option in enumerate(options):
                total, items = SELL_COSTS[i]
                if cloud:  # [PIPE-CLOUD]: the costs the cost steps got from the (fake) cloud
                    total = cloud[min(i, len(cloud) - 1)]
                    items = (("ALIYUN::ECS::VPC", total),)
                option.update(
                    architecture_diagram="flowchart LR\n  user --> site",
                    total_monthly_cost=total,
                    cost_items=[{"name": kind, "monthly_cost": cost} for kind, cost in items],
                )
        return {"user_prompt": "Which plan should be deployed?", "options": options}
    if step == "deploying":
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":  # after ros_deploy: report what the tool answered
            return {"status": "failed", "error": f"ros_deploy: {message_text(last)[:160]}"}
        return {"status": "failed", "error": SELL_DEPLOY_ERROR}
    return None


# ----------------------------------------------------------------- selling_solution_first
SSF_MARK = "[PIPE-SSF]"
SSF_SKILLS = {
    "/skills/iac-aliyun-solution-first": "solution_planning_and_selection",
    "/skills/iac-aliyun-materialize-selected-candidate": "materialize_selected_candidate",
    "selling_solution_first/skills/iac-aliyun-deploying": "deploying",
}
SSF_CANDIDATES: tuple[dict[str, Any], ...] = (
    {
        "name": "ECS web server",
        "summary": "one ECS instance in a VPC serving the site",
        "cost": "¥40～¥60/月",
        "tradeoff": "one instance, no failover",
        "products": ("VPC", "ECS"),
    },
    {
        "name": "OSS static site",
        "summary": "the site as static files in an OSS bucket",
        "cost": "¥5～¥10/月",
        "tradeoff": "static content only",
        "products": ("VPC", "OSS"),
    },
)
SSF_REGION = "cn-hangzhou"
#: a natural-language deployment confirmation (free text the kernel hands to the step's LLM)
SSF_CONFIRM_WORDS = "yes, deploy it"


def ssf_step(messages: list[dict[str, Any]]) -> str | None:
    """The ``selling_solution_first`` step a request belongs to, from the skill in its system prompt."""
    system = "".join(message_text(m) for m in messages if m.get("role") == "system")
    for skill, step in SSF_SKILLS.items():
        if skill in system:
            return step
    return None


def ssf_output_path(index: int) -> str:
    """Where the kernel tells step 2 to write candidate ``index``'s template (``templates/<i>-<slug>.yml``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", SSF_CANDIDATES[index]["name"].casefold()).strip("-")
    return f"templates/{index}-{slug}.yml"


def _ssf_template_path(text: str) -> str:
    """The template path the step's prompt names (step 2: 模板路径, step 3: 模板)."""
    found = re.search(r"模板(?:路径)?：`(templates/[^`]+)`", text)
    return found.group(1) if found else ssf_output_path(0)


def _structured_answer(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The deployment confirmation UI's JSON (``{"action": ...}``) when it is the latest user message."""
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    try:
        value = json.loads(users[-1]) if users else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("action"), str) else None


def ssf_outline() -> dict[str, Any]:
    """``show_architecture_plan``'s input: the whole lightweight candidate batch."""
    return {
        "candidates": [
            {
                "candidate_name": c["name"],
                "summary": c["summary"],
                "total_monthly_cost": c["cost"],
                "key_tradeoff": c["tradeoff"],
            }
            for c in SSF_CANDIDATES
        ]
    }


def ssf_detail(index: int, carried: str) -> dict[str, Any]:
    """``show_candidate_detail``'s input for candidate ``index`` (one per turn, in index order)."""
    candidate = SSF_CANDIDATES[index]
    products = candidate["products"]
    return {
        "candidate_index": index,
        "candidate_name": candidate["name"],
        "applicable_scenarios": ["a small website"],
        "resource_intents": [{"product": p, "action": "create", "source": "user", "notes": carried} for p in products],
        "topology_graph": {
            "nodes": [{"id": p.lower(), "label": p, "product": p} for p in products],
            "edges": [{"source": products[0].lower(), "target": products[1].lower(), "label": "hosts"}],
        },
        "resource_inventory": [
            {
                "resource_id": p.lower(),
                "product": p,
                "purpose": f"{p} of the site",
                "quantity": 1,
                "lifecycle": "create",
                "rough_monthly_cost": candidate["cost"] if p != "VPC" else "免费",
            }
            for p in products
        ],
        "cost_assumptions": ["cn-hangzhou, pay as you go"],
        "cost_exclusions": ["traffic"],
        "cost_confidence": "medium",
        "decision_notes": {
            "why_recommended": [f"fits a small website: {candidate['summary']}"],
            "problems_solved": ["hosts the site"],
            "pros": ["simple", "cheap to start"],
            "cons": [candidate["tradeoff"]],
        },
    }


def ssf_next_call(step: str | None, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The next tool call of a ``selling_solution_first`` step (None: the step's closing text)."""
    calls = _assistant_calls(messages)
    text = prompt_text(messages)
    carried = markers(text)
    if step == "solution_planning_and_selection":
        # the step's prompt shows the saved status: after the choice it says awaiting_selection
        chosen = "状态：`awaiting_selection`" in text and "show_architecture_plan" not in calls
        if chosen:  # the user's choice reached the LLM (not resolved deterministically): submit the index
            conclusion = {"status": "selected", "selected_candidate_index": _ssf_chosen_index(messages)}
            return "complete_step", {"conclusion": conclusion}
        if "show_architecture_plan" not in calls:
            return "show_architecture_plan", ssf_outline()
        details = calls.count("show_candidate_detail")
        if details < len(SSF_CANDIDATES):
            return "show_candidate_detail", ssf_detail(details, carried)
        intent = {
            "summary": f"a small website on Alibaba Cloud {carried}",
            "resource_intents": [{"product": "VPC", "action": "create", "source": "user"}],
            "hard_constraints": [],
        }
        return "complete_step", {"conclusion": {"status": "awaiting_selection", "intent": intent}}
    if step == "materialize_selected_candidate":
        answer = _structured_answer(messages)
        if answer is not None:
            status = {"confirm": "confirmed", "cancel": "cancelled"}.get(answer["action"], "reselect_requested")
            conclusion: dict[str, Any] = {"status": status}
            if status == "reselect_requested":
                conclusion["reselect_reason"] = json.dumps(answer)
            return "complete_step", {"conclusion": conclusion}
        users = [message_text(m) for m in messages if m.get("role") == "user"]
        if users and SSF_CONFIRM_WORDS in users[-1] and "complete_step" not in calls:
            # a natural-language confirmation reaches the LLM: confirm the plan the step already priced
            return "complete_step", {"conclusion": {"status": "confirmed"}}
        path = _ssf_template_path(text)
        plan = [
            ("write_file", {"path": path, "content": SELL_TEMPLATE}),
            ("ros_validate_template", {"template_url": path, "region_id": SSF_REGION}),
            ("ros_estimate_template_cost", {"template_url": path, "parameters": {}, "region_id": SSF_REGION}),
            (
                "ros_preview_template",
                {"template_url": path, "stack_name": "agui-ssf-preview", "parameters": {}, "region_id": SSF_REGION},
            ),
        ]
        for tool, arguments in plan:
            if tool not in calls:
                return tool, arguments
        conclusion = {
            "status": "awaiting_confirmation",
            "solution_summary": f"A VPC in {SSF_REGION} for the site. {carried}",
            "parameter_overrides": {},
            "missing_deployment_parameters": [],
            "hard_constraint_checks": [],
        }
        return "complete_step", {"conclusion": conclusion}
    if step == "deploying":
        if "ros_deploy" not in calls:
            path = _ssf_template_path(text)
            arguments = {"action": "create", "stack_name": "agui-fake-ssf", "template_url": path}
            return "ros_deploy", arguments | {"parameters": {}, "region_id": SSF_REGION}
        if "complete_step" not in calls:
            return "complete_step", {"conclusion": {"status": "failed"}}
        return None
    return None


def _ssf_chosen_index(messages: list[dict[str, Any]]) -> int:
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    for index, candidate in enumerate(SSF_CANDIDATES):
        if candidate["name"] in last:
            return index
    found = re.search(r"\d+", last)
    return int(found.group(0)) % len(SSF_CANDIDATES) if found else 0


# the system prompt of the kernel's interrupt judge (iac_code/pipeline/engine/prompts/interrupt_judge.md)
JUDGE_MARK = "pipeline 中断判断器"
SELL_SKILLS = {
    "iac-aliyun-intent": "intent_parsing",
    "iac-aliyun-architecture": "architecture_planning",
    "iac-aliyun-template-generating": "template_generating",
    "iac-aliyun-review": "reviewing",
    "iac-aliyun-cost": "cost_estimating",
    "iac-aliyun-deploying": "deploying",
}


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The system and user text of a request (where a pipeline step sees earlier conclusions)."""
    return " ".join(message_text(m) for m in messages if m.get("role") in {"system", "user"})


def is_selling(text: str) -> bool:
    """A ``[PIPE-SELL]`` request, or a candidate step that sees only one of its candidates' names."""
    return "[PIPE-SELL]" in text or any(f"`{c['name']}`" in text for c in SELL_CANDIDATES)


def markers(text: str) -> str:
    """The ``[PIPE-...]`` markers of a text, space separated, in order of first appearance."""
    return " ".join(dict.fromkeys(re.findall(r"\[PIPE-[A-Z_:-]+[a-z_]*\]", text)))


def pipeline_step(messages: list[dict[str, Any]]) -> str | None:
    """The selling step a request belongs to, from the skill named in its system prompt."""
    system = "".join(message_text(m) for m in messages if m.get("role") == "system")
    for skill, step in SELL_SKILLS.items():
        if f"/skills/{skill}" in system:
            return step
    if "confirm_and_select" in system or "evaluated_candidates" in system:
        return "confirm_and_select"
    return None


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _completion(reply: Reply) -> dict[str, Any]:
    """A non-streaming response equivalent to ``reply`` (tool calls merged)."""
    text = "".join(d.get("content", "") for d in reply.deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in reply.deltas)
    calls: list[dict[str, Any]] = []
    for delta in reply.deltas:
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                calls.append(
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": dict(call["function"]),
                    }
                )
            else:
                calls[-1]["function"]["arguments"] += call["function"]["arguments"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": dict(USAGE),
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], log_path: Path, script: Script) -> None:
        super().__init__(address, _Handler)
        self.log_path = log_path
        self.script = script
        self.log_lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            model = {
                "id": MODEL_ID,
                "object": "model",
                "owned_by": "fake",
                # read by the kernel's multimodal probe (OpenAI-compatible auto-detect)
                "architecture": {
                    "input_modalities": ["text", "image"],
                    "output_modalities": ["text"],
                },
            }
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send_json(
                400,
                {"error": {"message": "invalid JSON", "type": "invalid_request_error"}},
            )
            return
        is_chat = self.path.split("?")[0].rstrip("/").endswith("/chat/completions")
        reply = self.server.script.plan(body) if is_chat else Reply("not-found")
        self._log(body, reply)
        if not is_chat:
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})
            return
        if reply.error_status is not None:
            self._send_json(reply.error_status, reply.error_body or {})
            return
        if not body.get("stream"):
            self._send_json(200, _completion(reply))
            return
        self._stream(reply)

    def _log(self, body: dict[str, Any], reply: Reply) -> None:
        entry = {
            "time": time.time(),
            "path": self.path,
            "model": body.get("model"),
            "stream": bool(body.get("stream")),
            "tools": tool_names(body),
            "messages": body.get("messages") or [],
            "behaviour": reply.behaviour,
        }
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with (
            self.server.log_lock,
            self.server.log_path.open("a", encoding="utf-8") as fh,
        ):
            fh.write(line)

    def _stream(self, reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        frames = [_chunk({"role": "assistant", "content": ""})]
        frames += [_chunk(delta) for delta in reply.deltas]
        frames.append(_chunk({}, reply.finish_reason))
        usage = {k: v for k, v in _chunk({}).items() if k != "choices"}
        frames.append({**usage, "choices": [], "usage": dict(USAGE)})
        try:
            for index, frame in enumerate(frames):
                if reply.delay and 0 < index < len(frames) - 2:
                    time.sleep(reply.delay)
                self.wfile.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


class FakeLLM:
    """The fake LLM server, run on a background thread on 127.0.0.1."""

    def __init__(
        self,
        log_path: str | os.PathLike[str],
        *,
        port: int = 0,
        slow_interval: float | None = None,
        slow_chunks: int | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.port = port
        if slow_interval is None:
            slow_interval = float(os.environ.get("FAKE_LLM_SLOW_INTERVAL", "1.0"))
        if slow_chunks is None:
            slow_chunks = int(os.environ.get("FAKE_LLM_SLOW_CHUNKS", "10"))
        self.script = Script(slow_interval, slow_chunks)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (valid after :meth:`start`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        """Bind, start serving on a daemon thread, and return the base URL."""
        if self._server is not None:
            return self.base_url
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        self._server = _Server(("127.0.0.1", self.port), self.log_path, self.script)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-llm", daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def requests(self) -> list[dict[str, Any]]:
        """All logged chat-completions requests, oldest first."""
        return read_log(self.log_path)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_log(log_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse a request log written by the fake LLM (chat-completions requests only)."""
    path = Path(log_path)
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [e for e in entries if str(e.get("path", "")).split("?")[0].rstrip("/").endswith("/chat/completions")]


def main(argv: list[str]) -> int:
    """``python tests/support/fake_llm.py [PORT] [LOG_PATH]``: serve until interrupted."""
    port = int(argv[1]) if len(argv) > 1 else 0
    default_log = os.environ.get("FAKE_LLM_LOG") or str(Path(tempfile.gettempdir()) / "fake-llm-requests.jsonl")
    log_path = argv[2] if len(argv) > 2 else default_log
    llm = FakeLLM(log_path, port=port)
    print(llm.start(), flush=True)
    print(f"logging requests to {llm.log_path}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        llm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
