"""Span closing is one rule: a run's translator and the "process gone" ending close the same
spans the same way (``protocol.spans``, ``run.process_gone``)."""

from __future__ import annotations

from typing import Any

from agui_adapter.protocol.spans import OpenSpans, close_spans
from agui_adapter.run.process_gone import process_gone_ending
from agui_adapter.run.translation import RunTranslator, inspect_frame
from tests.support.agui_stream import check_stream


def _status(iac: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": "TASK_STATE_WORKING"}
    if text is not None:
        status["message"] = {"messageId": "m-1", "role": "ROLE_AGENT", "parts": [{"text": text}]}
    body = {"taskId": "t-1", "contextId": "c-1", "status": status, "metadata": {"iac_code": iac}}
    return {"result": {"statusUpdate": body}}


def _envelope(kind: str, step: str, candidate: str | None = None) -> dict[str, Any]:
    envelope: dict[str, Any] = {"eventType": kind, "step": {"id": step}, "pipelineRunId": "p-1"}
    if candidate is not None:
        envelope["candidate"] = {"id": candidate}
        envelope["candidateStep"] = {"id": step}
    return envelope


def _open_everything() -> tuple[RunTranslator, list[dict[str, Any]]]:
    """A run with a text message, a tool call, reasoning and three steps (one of a
    candidate) all open."""
    translator = RunTranslator("thread-1", "run-1")
    events: list[dict[str, Any]] = [{"type": "RUN_STARTED", "timestamp": 1, "threadId": "thread-1", "runId": "run-1"}]
    for envelope in (
        _envelope("step_started", "alpha"),
        _envelope("step_started", "zeta"),
        _envelope("step_started", "price", candidate="c1"),
    ):
        translator.map_envelope(envelope, 2, events)
    events += translator.map(inspect_frame(_status({}, "Hello")), 2)
    events += translator.map(
        inspect_frame(_status({"tool": {"status": "started", "toolUseId": "tool-9", "name": "ls"}})), 2
    )
    events += translator.map(inspect_frame(_status({"thinking": {"type": "raw_thinking", "text": "hmm"}})), 2)
    return translator, events


def test_translator_and_journal_close_the_same_spans_the_same_way() -> None:
    translator, events = _open_everything()
    kinds = {e["type"] for e in events}
    assert {"TEXT_MESSAGE_START", "TOOL_CALL_START", "REASONING_START", "STEP_STARTED"} <= kinds
    from_journal = OpenSpans(events).closing(7)
    from_translator = translator.close_all(7)
    assert from_journal == from_translator
    assert [e["type"] for e in from_translator] == [
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TOOL_CALL_END",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "STEP_FINISHED",
        "STEP_FINISHED",
    ]
    # steps in the order of their keys: candidate steps before plain ones
    assert [e["stepName"] for e in from_translator if e["type"] == "STEP_FINISHED"] == [
        "candidate:c1:price",
        "alpha",
        "zeta",
    ]


def test_process_gone_ending_is_one_valid_run() -> None:
    _, events = _open_everything()
    ending = process_gone_ending(events, 9, "zh-CN")
    assert ending[-1]["type"] == "RUN_ERROR" and ending[-1]["code"] == "EXECUTION_LOST"
    assert ending[-1]["message"] != process_gone_ending([], 9, "en")[-1]["message"]  # localized
    check_stream([*events, *ending])


def test_a_reasoning_message_already_closed_is_not_closed_again() -> None:
    events = [
        {"type": "REASONING_START", "messageId": "r"},
        {"type": "REASONING_MESSAGE_START", "messageId": "r"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r", "delta": "x"},
        {"type": "REASONING_MESSAGE_END", "messageId": "r"},
    ]
    assert [e["type"] for e in OpenSpans(events).closing(1)] == ["REASONING_END"]


def test_closed_spans_are_not_closed() -> None:
    events = [
        {"type": "TEXT_MESSAGE_START", "messageId": "a"},
        {"type": "TEXT_MESSAGE_END", "messageId": "a"},
        {"type": "STEP_STARTED", "stepName": "s"},
        {"type": "STEP_FINISHED", "stepName": "s"},
    ]
    assert OpenSpans(events).closing(1) == [] == close_spans(1)
