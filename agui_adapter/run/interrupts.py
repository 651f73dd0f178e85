"""Interrupts: from the kernel's ``iac_code.input`` envelopes to AG-UI ``Interrupt``
objects, and from AG-UI ``resume`` answers back to what the kernel accepts.

Pure functions. A permission interrupt's ``responseSchema`` is exactly the contract's
(``decision`` in allow_once/deny); a question's admits one listed option id or free
text when the kernel allows it. Only allowlisted envelope fields are kept, so nothing
unexpected from the kernel lands in the state file or in front of the user.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.i18n import translate
from agui_adapter.state.record import PendingInterrupt

log = logging.getLogger("agui_adapter.run")

INPUT_FIELDS = (
    "schemaVersion",
    "kind",
    "requestTaskId",
    "contextId",
    "inputId",
    "toolUseId",
    "toolName",
    "title",
    "purpose",
    "effect",
    "target",
    "isReadOnly",
    "prompt",
    "safeSummary",
    "options",
    "language",
    "deploymentSummary",
    "scope",
    "subPipelineId",
    "operation",
    "displayParameters",
    "allowFreeText",
    "freeTextPrompt",
    "required",
    "question",
    "selector",
)
METADATA_EXCLUDE = ("required", "requestTaskId", "contextId", "schemaVersion")

PERMISSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"decision": {"type": "string", "enum": ["allow_once", "deny"]}},
    "required": ["decision"],
    "additionalProperties": False,
}

RESOURCE_SELECTION = "cloud_resource_selection"
DEPLOYMENT_CONFIRMATION = "deployment_confirmation"

REASONS = {
    "permission": "tool_call",
    "candidate_selection": "confirmation",
    "deployment_confirmation": "confirmation",
}


def allowlisted(kernel_input: dict[str, Any]) -> dict[str, Any]:
    return {k: kernel_input[k] for k in INPUT_FIELDS if k in kernel_input}


def option_entries(options: Any) -> list[dict[str, Any]]:
    """Options as ``{"id", "label", ...}`` with unique string ids, order kept."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    if not isinstance(options, list):
        return out
    for index, option in enumerate(options):
        if isinstance(option, dict):
            raw_id = option.get("id", option.get("candidate_index", index))
            label = option.get("label") or option.get("name") or option.get("title")
            entry = dict(option)
        else:
            raw_id, label, entry = option, option, {}
        option_id = str(raw_id) if raw_id not in (None, "") else f"option-{index + 1}"
        base, n = option_id, 1
        while option_id in seen:
            n += 1
            option_id = f"{base}-{n}"
        seen.add(option_id)
        entry["id"] = option_id
        entry["label"] = str(label) if label not in (None, "") else option_id
        out.append(entry)
    return out


def is_permission(kernel_input: dict[str, Any]) -> bool:
    return kernel_input.get("kind") == "permission"


def resource_options(kernel_input: dict[str, Any]) -> list[dict[str, Any]]:
    """The choices of a cloud_resource_selection wait (``selector.options``)."""
    selector = kernel_input.get("selector")
    options = selector.get("options") if isinstance(selector, dict) else None
    out = []
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and isinstance(option.get("value"), str):
            out.append({"id": option["value"], "label": str(option.get("label") or option["value"]), **option})
    return out


def resource_response(kernel_input: dict[str, Any], payload: Any, *, task_id: str | None) -> dict[str, Any]:
    """``metadata.iac_code.inputResponse`` for a cloud_resource_selection answer (None: cancelled)."""
    selector = kernel_input.get("selector") if isinstance(kernel_input.get("selector"), dict) else {}
    response: dict[str, Any] = {
        "schemaVersion": 1,
        "kind": RESOURCE_SELECTION,
        "status": "canceled" if payload is None else "selected",
        "requestTaskId": kernel_input.get("requestTaskId") or task_id,
        "contextId": kernel_input.get("contextId"),
        "inputId": kernel_input.get("inputId"),
        "toolUseId": kernel_input.get("toolUseId"),
        "selectorId": selector.get("selectorId"),
    }
    if payload is not None:
        value = payload["value"]
        response["value"] = value
        label = next((o["label"] for o in resource_options(kernel_input) if o["id"] == value), None)
        if label:
            response["label"] = label
    return {k: v for k, v in response.items() if v is not None}


def confirmation_input(iac: dict[str, Any]) -> dict[str, Any] | None:
    """The input of a ``deployment_confirmation`` wait, which the kernel sends without one.

    ``selling_solution_first``'s materialize step waits for it with an INPUT_REQUIRED frame that
    carries only the pipeline's ``input_required`` envelope (``data.kind``, ``prompt``, ``options``
    by ``action``, the plan's cost): the kernel projects an ``iac_code.input`` for questions and
    selections only (tests/data/a2a-selling/15). Built here the way the kernel builds those:
    inputId ``input-<eventId>``; the answer is the structured ``{"action": ...}`` it resolves
    without the LLM, or free text, which its LLM reads.
    """
    envelopes: list[Any] = [iac.get("pipeline")]
    batch = iac.get("pipelineBatch")
    if isinstance(batch, dict) and isinstance(batch.get("events"), list):
        envelopes.extend(batch["events"])
    for envelope in reversed(envelopes):
        if not isinstance(envelope, dict) or envelope.get("eventType") != "input_required":
            continue
        data = envelope.get("data")
        if not isinstance(data, dict) or data.get("kind") != DEPLOYMENT_CONFIRMATION:
            continue
        if not isinstance(envelope.get("eventId"), str) or not envelope["eventId"]:
            return None
        options = [
            {"id": o["action"], "label": str(o.get("name") or o["action"]), "summary": str(o.get("summary") or "")}
            for o in data.get("options") or []
            if isinstance(o, dict) and isinstance(o.get("action"), str) and o["action"]
        ]
        cost = data.get("cost") if isinstance(data.get("cost"), dict) else {}
        resources = cost.get("resources") if isinstance(cost.get("resources"), list) else []
        summary = {
            "solutionSummary": str(data.get("solution_summary") or ""),
            "template": str(data.get("template_url") or ""),
            "totalMonthlyCost": str(cost.get("monthly_estimate") or ""),
            "resources": [
                {
                    "name": str(r.get("type") or ""),
                    "spec": str(r.get("spec") or ""),
                    "monthlyCost": str(r.get("cost") or ""),
                }
                for r in resources
                if isinstance(r, dict)
            ],
            "previewReadyForCreate": data.get("preview_ready_for_create") is True,
        }
        kernel_input: dict[str, Any] = {
            "schemaVersion": 1,
            "kind": DEPLOYMENT_CONFIRMATION,
            "inputId": f"input-{envelope['eventId']}",
            "prompt": str(data.get("prompt") or ""),
            "options": options,
            "allowFreeText": True,
            "deploymentSummary": summary,
            "required": True,
        }
        for key in ("taskId", "contextId"):
            if isinstance(envelope.get(key), str):
                kernel_input["requestTaskId" if key == "taskId" else key] = envelope[key]
        return kernel_input
    return None


def sideband_ids(iac: dict[str, Any]) -> set[str]:
    """Inputs answered out of band: candidate-scope permissions and the pendingPermissions list."""
    out: set[str] = set()
    direct = iac.get("input")
    if isinstance(direct, dict) and isinstance(direct.get("inputId"), str):
        if direct.get("scope") == "candidate" or isinstance(direct.get("subPipelineId"), str):
            out.add(direct["inputId"])
    pending = iac.get("pendingPermissions")
    for item in pending if isinstance(pending, list) else []:
        if isinstance(item, dict) and isinstance(item.get("inputId"), str):
            out.add(item["inputId"])
    return out


def response_schema(kernel_input: dict[str, Any]) -> dict[str, Any]:
    if is_permission(kernel_input):
        return json.loads(json.dumps(PERMISSION_SCHEMA))
    if kernel_input.get("kind") == RESOURCE_SELECTION:
        values = [o["id"] for o in resource_options(kernel_input)]
        value_schema: dict[str, Any] = {"type": "string", "minLength": 1}
        if values:
            value_schema["enum"] = values
        return {
            "type": "object",
            "properties": {"value": value_schema},
            "required": ["value"],
            "additionalProperties": False,
        }
    options = option_entries(kernel_input.get("options"))
    free_text = bool(kernel_input.get("allowFreeText")) or not options
    properties: dict[str, Any] = {}
    branches: list[dict[str, Any]] = []
    if options:
        properties["selectedId"] = {"type": "string", "enum": [o["id"] for o in options]}
        branches.append({"required": ["selectedId"]})
    if free_text:
        properties["freeText"] = {"type": "string", "minLength": 1}
        branches.append({"required": ["freeText"]})
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if len(branches) == 1:
        schema["required"] = branches[0]["required"]
    else:
        schema["oneOf"] = branches
    return schema


def build_interrupt(kernel_input: dict[str, Any], *, expires_at: str, language: str) -> dict[str, Any]:
    """The AG-UI Interrupt for one kernel input (which must have an inputId)."""
    value = allowlisted(kernel_input)
    kind = value.get("kind") or "input_required"
    lang = value.get("language") if isinstance(value.get("language"), str) else language
    if kind == RESOURCE_SELECTION:
        options = resource_options(value)
    else:
        options = option_entries(value.get("options"))
    if kind == "permission":
        message = value.get("prompt") or value.get("title") or translate(lang, msg.PERMISSION_REQUIRED)
    else:
        message = value.get("prompt") or value.get("question") or translate(lang, msg.INPUT_REQUIRED)
        if not isinstance(message, str):
            message = translate(lang, msg.INPUT_REQUIRED)
        if options:
            message += "\n" + "\n".join(f"- {o['id']}: {o['label']}" for o in options)
    metadata: dict[str, Any] = {"schemaVersion": 1, "kind": kind}
    for key, item in value.items():
        if key not in METADATA_EXCLUDE and key != "kind":
            metadata[key] = item
    if options:
        metadata["options"] = options
    interrupt: dict[str, Any] = {
        "id": value["inputId"],
        "reason": REASONS.get(kind, "input_required"),
        "message": str(message),
        "responseSchema": response_schema(value),
        "expiresAt": expires_at,
        "metadata": metadata,
    }
    tool_use_id = value.get("toolUseId")
    if isinstance(tool_use_id, str) and tool_use_id:
        interrupt["toolCallId"] = tool_use_id
    return interrupt


def answer_digest(status: str, payload: Any) -> str:
    blob = json.dumps({"status": status, "payload": payload}, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def answer_text(kernel_input: dict[str, Any], payload: Any) -> str | None:
    """The text the kernel expects for a question answer: an option's label, or free text."""
    if not isinstance(payload, dict):
        return None
    free = payload.get("freeText")
    if isinstance(free, str) and free.strip():
        return free
    selected = payload.get("selectedId")
    if isinstance(selected, str) and kernel_input.get("kind") == DEPLOYMENT_CONFIRMATION:
        # the structured answer the kernel resolves itself (iac_code/pipeline/engine/ui_contract.py)
        actions = {o["id"] for o in option_entries(kernel_input.get("options"))}
        return json.dumps({"action": selected}) if selected in actions else None
    if isinstance(selected, str):
        for option in option_entries(kernel_input.get("options")):
            if option["id"] == selected:
                return option["label"]
    return None


def pending_interrupts(
    inputs: list[dict[str, Any]],
    run_id: str,
    *,
    task_id: str | None,
    context_id: str,
    expires_at: str,
    language: str,
    sideband_ids: set[str],
) -> dict[str, PendingInterrupt]:
    """The kernel's inputs as the run's pending interrupts (``PendingInterrupt`` by input id),
    ready to commit; an input of another task or context is a protocol error."""
    pending: dict[str, PendingInterrupt] = {}
    for kernel_input in inputs:
        input_id = kernel_input.get("inputId")
        if not isinstance(input_id, str) or not input_id:
            log.warning("run %s: ignoring a kernel input without inputId", run_id)
            continue
        request_task = kernel_input.get("requestTaskId")
        if request_task and request_task != task_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.INTERRUPT_OTHER_TASK)
        context = kernel_input.get("contextId")
        if context and context != context_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.INTERRUPT_OTHER_CONTEXT)
        pending[input_id] = PendingInterrupt(
            allowlisted(kernel_input),
            build_interrupt(kernel_input, expires_at=expires_at, language=language),
            input_id in sideband_ids,
        )
    return pending
