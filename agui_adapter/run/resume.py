"""Resume: checking a client's answers against the pending interrupts (sans-I/O).

The contract's rules, in one pure function: every pending interrupt answered exactly
once (INCOMPLETE_RESUME), no unknown ids (UNKNOWN_INTERRUPT), payloads valid against
the stored ``responseSchema`` (RESUME_PAYLOAD_INVALID), repeated answers recognised by
their digest (RESUME_ALREADY_APPLIED), expiry (EXECUTION_EXPIRED). The result is the
list of ``Answer`` values ready to send; nothing is sent or stored here, so a refused
Resume leaves every interrupt pending and retryable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code, clip_detail
from agui_adapter.protocol.timestamps import parse_rfc3339
from agui_adapter.protocol.validation import ResumeEntry
from agui_adapter.run import interrupts as intr
from agui_adapter.run import outbound
from agui_adapter.state.record import PendingInterrupt


@dataclass
class Answer:
    """One answer ready to send, and the kernel message part that carries it."""

    interrupt_id: str
    digest: str
    kind: str  # "permission" | "text" | "resource"
    part: dict[str, Any] = field(default_factory=dict)
    tool_use_id: str | None = None
    sideband: bool = False  # a candidate-scope permission: sent as a unary call
    input_response: dict[str, Any] | None = None  # cloud_resource_selection
    result: str | None = None  # the answer text, reported as the tool call's result


class CancelExecution(Exception):
    """A question answered ``cancelled``: the execution cannot go on without it."""


class Expired(Exception):
    """A pending interrupt expired at ``expires_at``."""

    def __init__(self, expires_at: str) -> None:
        super().__init__(expires_at)
        self.expires_at = expires_at


def first_expiry(pending: Mapping[str, PendingInterrupt], now: float) -> str | None:
    """The ``expiresAt`` of a pending interrupt that has passed, if any."""
    for entry in pending.values():
        expires_at = entry.expires_at
        if expires_at is not None:
            try:
                if parse_rfc3339(expires_at) <= now:
                    return expires_at
            except ValueError:
                continue
    return None


def payload_error(schema: dict[str, Any], payload: Any) -> str | None:
    """None when ``payload`` satisfies ``schema``, else a short English reason (jsonschema is
    imported here, on the first Resume: most runs never need it)."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(payload))
    return None if error is None else error.message


def plan(
    entries: Sequence[ResumeEntry],
    pending: Mapping[str, PendingInterrupt],
    applied_digest: Callable[[str], str | None],
    *,
    task_id: str | None,
    now: float,
) -> list[Answer]:
    """The answers to send, or AguiError / Expired / CancelExecution."""
    ids = [e.interrupt_id for e in entries]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise AguiError(Code.INCOMPLETE_RESUME, msg.RESUME_DUPLICATE_IDS, {"ids": ", ".join(duplicates)})
    digests = {e.interrupt_id: intr.answer_digest(e.status, e.payload) for e in entries}
    applied = {i: applied_digest(i) for i in ids}
    if not pending:
        if any(applied[i] is not None for i in ids):
            raise AguiError(Code.RESUME_ALREADY_APPLIED, msg.RESUME_ALREADY_APPLIED)
        raise AguiError(Code.EXECUTION_LOST, msg.RESUME_TASK_UNAVAILABLE)
    expired = first_expiry(pending, now)
    if expired is not None:
        raise Expired(expired)
    unknown = sorted(i for i in ids if i not in pending and applied[i] is None)
    if unknown:
        raise AguiError(Code.UNKNOWN_INTERRUPT, msg.RESUME_UNKNOWN, {"ids": ", ".join(unknown)})
    if any(i not in pending and applied[i] != digests[i] for i in ids):
        raise AguiError(Code.RESUME_ALREADY_APPLIED, msg.RESUME_ALREADY_APPLIED)
    missing = [i for i in pending if i not in digests]
    if missing:
        raise AguiError(Code.INCOMPLETE_RESUME, msg.RESUME_INCOMPLETE, {"ids": ", ".join(missing)})
    answers = [
        answer_for(e, pending[e.interrupt_id], digests[e.interrupt_id], task_id=task_id)
        for e in entries
        if e.interrupt_id in pending
    ]
    # Sideband answers first (unary calls), then permission decisions, which unblock tools
    # the questions may depend on; the last answer's stream continues the run.
    return sorted(answers, key=lambda a: (not a.sideband, a.kind != "permission"))


def answer_for(entry: ResumeEntry, stored: PendingInterrupt, digest: str, *, task_id: str | None) -> Answer:
    """Validate one answer against its interrupt and build the kernel message part."""
    kernel_input = stored.input
    interrupt = stored.interrupt
    input_id = entry.interrupt_id
    kind = kernel_input.get("kind")
    permission = intr.is_permission(kernel_input)
    tool_use_id = kernel_input.get("toolUseId") if isinstance(kernel_input.get("toolUseId"), str) else None
    answer = Answer(
        input_id,
        digest,
        "permission" if permission else "resource" if kind == intr.RESOURCE_SELECTION else "text",
        tool_use_id=tool_use_id,
        sideband=stored.sideband and permission,
    )
    payload = entry.payload
    if entry.status == "cancelled":
        if answer.kind == "resource":
            answer.part = {"text": "cancel"}
            answer.input_response = intr.resource_response(kernel_input, None, task_id=task_id)
            return answer
        if not permission:
            raise CancelExecution(input_id)
        payload = {"decision": "deny"}
    elif not entry.has_payload or payload is None:
        raise AguiError(Code.RESUME_PAYLOAD_INVALID, msg.RESUME_PAYLOAD_MISSING, {"id": input_id})
    reason = payload_error(interrupt.get("responseSchema") or {}, payload)
    if reason is not None:
        raise AguiError(
            "RESUME_PAYLOAD_INVALID", msg.RESUME_PAYLOAD_INVALID, {"id": input_id, "reason": clip_detail(reason)}
        )
    if permission:
        if not tool_use_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.RESUME_TASK_MISMATCH)
        answer.part = outbound.permission_decision(
            task_id=task_id or "", input_id=input_id, tool_use_id=tool_use_id, decision=payload["decision"]
        )
    elif answer.kind == "resource":
        answer.input_response = intr.resource_response(kernel_input, payload, task_id=task_id)
        answer.part = {"text": str(answer.input_response.get("label") or answer.input_response.get("value"))}
    else:
        text = intr.answer_text(kernel_input, payload)
        if not text:
            raise AguiError(Code.RESUME_PAYLOAD_INVALID, msg.RESUME_NO_ANSWER, {"id": input_id})
        answer.part = {"text": text}
        answer.result = text
    return answer
