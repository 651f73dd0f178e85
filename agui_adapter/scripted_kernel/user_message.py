"""Reading a user message: identifiers, language, images, permission answers, pipeline choice.

Why: a JSON-RPC ``message`` carries more than directives (a permission answer in
a data part or a text transport, image parts to check, ``iac_code`` metadata);
these readers turn it into plain values and the kernel's -32602 errors, so the
submission logic only decides what to run.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from typing import Any

from agui_adapter.scripted_kernel.pipeline_journal import PIPELINE_NAMES
from agui_adapter.scripted_kernel.wire import as_struct, invalid_params

ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_SUPPORTED_LANGUAGES = frozenset({"en", "zh", "es", "fr", "de", "ja", "pt"})


PERMISSION_NOT_ACTIVE = "permission_resume_invalid: pending permission is not active."
PERMISSION_FIELDS_MISMATCH = "Permission response payload fields do not match schemaVersion 1."
PERMISSION_TEXT_PREFIX = "IAC_CODE_PERMISSION:"
PERMISSION_KEYS = frozenset({"schemaVersion", "kind", "requestTaskId", "inputId", "toolUseId", "decision"})
PERMISSION_DECISIONS = frozenset({"allow_once", "deny"})


def language_of(iac: dict[str, Any]) -> str:
    """The supported language ``preferredLanguage`` names (English otherwise)."""
    raw = iac.get("preferredLanguage", iac.get("preferred_language"))
    if isinstance(raw, str):
        code = raw.strip().lower().replace("_", "-").split("-")[0]
        if code in _SUPPORTED_LANGUAGES:
            return code
    return "en"


def _echo_part(part: dict[str, Any]) -> dict[str, Any]:
    """A user part as the kernel stores it: proto field order, Struct numbers."""
    out: dict[str, Any] = {}
    for key in ("text", "raw", "url", "data", "metadata", "filename", "mediaType"):
        if key in part and part[key] is not None:
            out[key] = as_struct(part[key]) if key in ("data", "metadata") else part[key]
    return out


def echo_message(msg: dict[str, Any], task_id: str, context_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messageId": msg["messageId"],
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_USER",
        "parts": [_echo_part(p) for p in msg["parts"]],
    }
    if isinstance(msg.get("metadata"), dict):
        out["metadata"] = as_struct(msg["metadata"])
    for key in ("extensions", "referenceTaskIds"):
        if msg.get(key):
            out[key] = msg[key]
    return out


def _decode_base64(payload: Any) -> bytes | None:
    if not isinstance(payload, str):
        return None
    text = "".join(payload.split())
    if not text or not re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", text):
        return None
    text = text.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def inspect_images(parts: list[dict[str, Any]]) -> tuple[list[str], str | None]:
    """Media types of the image parts, or an error text when one does not decode."""
    media_types: list[str] = []
    for part in parts:
        media_type = part.get("mediaType")
        if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
            continue
        data = part.get("data")
        if isinstance(data, dict) and "bytes" in data and "filename" in data:
            payload = data.get("bytes")
        elif "raw" in part:
            payload = part.get("raw")
        else:
            continue
        if not _decode_base64(payload):
            return (
                media_types,
                "ValueError: Invalid image part: data is not valid base64.",
            )
        media_types.append(media_type)
    return media_types, None


def permission_answer(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The permission decision carried by a message, if it is one.

    Raises the kernel's -32602 error when the payload is recognisably a
    permission answer but its fields do not match schemaVersion 1.
    """
    payload: Any = None
    allowed = PERMISSION_KEYS
    data_parts = [p for p in parts if isinstance(p.get("data"), dict) and p["data"].get("kind") == "permission"]
    if data_parts:
        if len(parts) != 1:
            raise invalid_params(PERMISSION_FIELDS_MISMATCH)
        payload = data_parts[0]["data"]
    elif (
        len(parts) == 1
        and isinstance(parts[0].get("text"), str)
        and parts[0]["text"].startswith(PERMISSION_TEXT_PREFIX)
    ):
        try:
            payload = json.loads(parts[0]["text"][len(PERMISSION_TEXT_PREFIX) :])
        except ValueError:
            raise invalid_params(PERMISSION_FIELDS_MISMATCH) from None
        allowed = PERMISSION_KEYS | {"contextId"}
    else:
        return None
    if not isinstance(payload, dict) or set(payload) != allowed:
        raise invalid_params(PERMISSION_FIELDS_MISMATCH)
    version = payload["schemaVersion"]
    if isinstance(version, bool) or version not in (1, "1", "1.0"):
        raise invalid_params(PERMISSION_FIELDS_MISMATCH)
    if payload["kind"] != "permission" or payload["decision"] not in PERMISSION_DECISIONS:
        raise invalid_params(PERMISSION_FIELDS_MISMATCH)
    for key in ("requestTaskId", "inputId", "toolUseId") + (("contextId",) if "contextId" in allowed else ()):
        if not isinstance(payload[key], str) or not payload[key]:
            raise invalid_params(PERMISSION_FIELDS_MISMATCH)
    return payload


def pipeline_name(iac: dict[str, Any]) -> str | None:
    """The pipeline a new turn asks for (``None``: a normal turn); unknown names are -32602."""
    if iac.get("run_mode") != "pipeline":
        return None
    name = iac.get("pipeline_name")
    if name is None or name == "":
        return PIPELINE_NAMES[0]
    if not isinstance(name, str) or name not in PIPELINE_NAMES:
        raise invalid_params(f"Unknown pipeline_name: {name}")
    return name


def permission_ack(task: Any, answer: dict[str, Any]) -> dict[str, Any]:
    """The agent Message a unary answer to a pipeline permission returns (tests/data/a2a-selling)."""
    data = {
        "kind": "permission_ack",
        "decision": answer["decision"],
        "schemaVersion": 1.0,
        "inputId": answer["inputId"],
        "accepted": True,
        "toolUseId": answer["toolUseId"],
    }
    return {
        "messageId": "permission-ack-" + uuid.uuid4().hex,
        "contextId": task.context_id,
        "taskId": task.id,
        "role": "ROLE_AGENT",
        "parts": [{"data": data, "mediaType": "application/json"}],
    }
