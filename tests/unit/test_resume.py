"""The pure Resume rules, without any I/O."""

from __future__ import annotations

from typing import Any

import pytest

from agui_adapter.protocol.errors import AguiError
from agui_adapter.protocol.validation import ResumeEntry
from agui_adapter.run import interrupts as intr
from agui_adapter.run import resume
from agui_adapter.state.record import PendingInterrupt

PERMISSION = {"kind": "permission", "inputId": "p1", "toolUseId": "call-1", "required": True}
QUESTION = {
    "kind": "ask_user_question",
    "inputId": "q1",
    "toolUseId": "call-2",
    "required": True,
    "options": [{"id": "hz", "label": "cn-hangzhou"}],
    "allowFreeText": True,
}
SIDEBAND = {"kind": "permission", "inputId": "s1", "toolUseId": "call-3", "scope": "candidate", "required": True}


def pending(
    *inputs: dict[str, Any], expires_at: str = "2999-01-01T00:00:00Z", sideband: bool = False
) -> dict[str, PendingInterrupt]:
    return {
        i["inputId"]: PendingInterrupt(
            i,
            intr.build_interrupt(i, expires_at=expires_at, language="en"),
            sideband or i.get("scope") == "candidate",
        )
        for i in inputs
    }


def entry(interrupt_id: str, payload: Any = None, status: str = "resolved") -> ResumeEntry:
    return ResumeEntry(interrupt_id, status, payload, has_payload=payload is not None)


def plan(entries: list[ResumeEntry], waiting: dict, applied: dict[str, str] | None = None) -> list[resume.Answer]:
    return resume.plan(entries, waiting, (applied or {}).get, task_id="task-1", now=1_000_000.0)


def code(entries: list[ResumeEntry], waiting: dict, applied: dict[str, str] | None = None) -> str:
    with pytest.raises(AguiError) as info:
        plan(entries, waiting, applied)
    return info.value.code


def test_permission_and_question_answers_become_kernel_parts() -> None:
    answers = plan(
        [entry("q1", {"selectedId": "hz"}), entry("p1", {"decision": "allow_once"})], pending(PERMISSION, QUESTION)
    )
    assert [a.interrupt_id for a in answers] == ["p1", "q1"]  # permissions first
    assert answers[0].part["data"] == {
        "schemaVersion": 1,
        "kind": "permission",
        "requestTaskId": "task-1",
        "inputId": "p1",
        "toolUseId": "call-1",
        "decision": "allow_once",
    }
    assert answers[1].part == {"text": "cn-hangzhou"} and answers[1].result == "cn-hangzhou"


def test_sideband_answers_go_first() -> None:
    answers = plan(
        [entry("p1", {"decision": "deny"}), entry("s1", {"decision": "allow_once"})], pending(PERMISSION, SIDEBAND)
    )
    assert [(a.interrupt_id, a.sideband) for a in answers] == [("s1", True), ("p1", False)]


def test_cancelled_permission_is_a_denial_and_cancelled_question_ends_the_execution() -> None:
    [answer] = plan([entry("p1", status="cancelled")], pending(PERMISSION))
    assert answer.part["data"]["decision"] == "deny"
    with pytest.raises(resume.CancelExecution):
        plan([entry("q1", status="cancelled")], pending(QUESTION))


def test_rule_codes() -> None:
    waiting = pending(PERMISSION, QUESTION)
    ok_p, ok_q = entry("p1", {"decision": "deny"}), entry("q1", {"freeText": "x"})
    assert code([ok_p], waiting) == "INCOMPLETE_RESUME"
    assert code([ok_p, ok_p, ok_q], waiting) == "INCOMPLETE_RESUME"
    assert code([ok_p, ok_q, entry("zz", {})], waiting) == "UNKNOWN_INTERRUPT"
    assert code([ok_p, entry("q1")], waiting) == "RESUME_PAYLOAD_INVALID"
    assert code([ok_p, entry("q1", {"selectedId": "nope"})], waiting) == "RESUME_PAYLOAD_INVALID"
    assert code([ok_p], {}) == "EXECUTION_LOST"
    digest = intr.answer_digest("resolved", {"decision": "deny"})
    assert code([ok_p], {}, {"p1": digest}) == "RESUME_ALREADY_APPLIED"
    assert code([entry("p1", {"decision": "allow_once"})], {}, {"p1": digest}) == "RESUME_ALREADY_APPLIED"
    # an answer already applied with the same digest is skipped next to pending ones
    answers = plan([ok_p, ok_q], pending(QUESTION), {"p1": digest})
    assert [a.interrupt_id for a in answers] == ["q1"]


def test_expiry() -> None:
    with pytest.raises(resume.Expired) as info:
        plan([entry("p1", {"decision": "deny"})], pending(PERMISSION, expires_at="1970-01-02T00:00:00Z"))
    assert info.value.expires_at == "1970-01-02T00:00:00Z"
