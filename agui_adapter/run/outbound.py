"""What the adapter sends to the kernel: A2A messages built from an admitted run.

Pure functions. The ``metadata.iac_code`` keys are the ones the iac-code runtime
reads (spec: cwd, preferredLanguage, user_id, channel, iac_code_model,
iac_code_api_key, thinking, run_mode, pipeline_name, cleanupOnly, credentials,
llm_headers). Secrets pass through here on their way to the kernel and nowhere else.
"""

from __future__ import annotations

from typing import Any

from agui_adapter.protocol.validation import IacCodeProps

# The only candidate presentation the kernel honours (upstream forwards "rich", ignored).
RICH_PRESENTATION = "rich-v1"

_CLOUD_KEYS = {
    "accessKeyId": "alibaba_cloud_access_key_id",
    "accessKeySecret": "alibaba_cloud_access_key_secret",
    "securityToken": "alibaba_cloud_security_token",
    "regionId": "alibaba_cloud_region_id",
}


def turn_metadata(props: IacCodeProps, cwd: str, language: str) -> dict[str, Any]:
    """``metadata.iac_code`` for every message of a run."""
    meta: dict[str, Any] = {
        "cwd": cwd,
        "preferredLanguage": language,
        "rosInvocationId": props.ros_invocation_id,
        "cleanupOnly": props.cleanup_only,
    }
    if props.user_id is not None:
        meta["user_id"] = props.user_id
    if props.channel is not None:
        meta["channel"] = props.channel
    if props.model and props.model.strip():
        meta["iac_code_model"] = props.model.strip()
    if props.llm_api_key and props.llm_api_key.strip():
        meta["iac_code_api_key"] = props.llm_api_key.strip()
    if props.llm_headers:
        meta["llm_headers"] = dict(props.llm_headers)
    if props.thinking is not None:
        thinking: dict[str, Any] = {"enabled": bool(props.thinking.get("enabled", False))}
        effort = props.thinking.get("effort")
        if isinstance(effort, str) and effort.strip():
            thinking["effort"] = effort.strip()
        budget = props.thinking.get("budget")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            thinking["budget"] = budget
        meta["thinking"] = thinking
    if props.run_mode is not None:
        meta["run_mode"] = props.run_mode
    if props.pipeline_name is not None:
        meta["pipeline_name"] = props.pipeline_name
    if props.candidate_presentation == "rich":
        meta["candidatePresentation"] = RICH_PRESENTATION
    for key, meta_key in _CLOUD_KEYS.items():
        value = (props.alibaba_cloud or {}).get(key)
        if isinstance(value, str) and value:
            meta[meta_key] = value
    return meta


def user_turn(
    *,
    message_id: str,
    context_id: str,
    parts: list[dict[str, Any]],
    metadata: dict[str, Any],
    task_id: str | None = None,
) -> dict[str, Any]:
    """A ROLE_USER message; ``task_id`` only when answering an interrupt of that task."""
    message: dict[str, Any] = {
        "messageId": message_id,
        "role": "ROLE_USER",
        "contextId": context_id,
        "parts": parts,
        "metadata": {"iac_code": metadata},
    }
    if task_id:
        message["taskId"] = task_id
    return message


def permission_decision(*, task_id: str, input_id: str, tool_use_id: str, decision: str) -> dict[str, Any]:
    """The sideband permission answer: one data part with exactly six keys."""
    return {
        "data": {
            "schemaVersion": 1,
            "kind": "permission",
            "requestTaskId": task_id,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "decision": decision,
        },
        "mediaType": "application/json",
    }
