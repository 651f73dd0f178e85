"""Span closing: the one rule for the END events that make a run valid before its terminal event.

AG-UI wants every START (text message, tool call, reasoning, reasoning message, step) closed
by its END before ``RUN_FINISHED`` or ``RUN_ERROR``. Two places end a run: its translator
(``run.translation.RunTranslator.close_all``), which knows the spans it opened, and whoever
ends a run whose adapter process died mid-span (``run.process_gone``: a reader following its
journal, or the process concluding it), which knows only the events the journal holds
(``OpenSpans``). Both close through ``close_spans``, so the ending is the same whoever writes
it: reasoning (its message, then the reasoning), tool calls, text messages, then steps, each
in a fixed order. Pure: no I/O, timestamps are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agui_adapter.protocol import events as ev
from agui_adapter.protocol.events import Event


def step_key_of(name: str) -> str:
    """The step key a ``stepName`` came from (``run.pipeline_progress.step_name`` undone):
    ``step:<id>`` for a plain step, the name itself for a candidate step."""
    return name if name.startswith("candidate:") else f"step:{name}"


def close_spans(
    ts: int,
    *,
    reasoning: Iterable[str] = (),
    reasoning_messages: Iterable[str] = (),
    tools: Iterable[str] = (),
    texts: Iterable[str] = (),
    steps: Iterable[str] = (),
) -> list[Event]:
    """The END events of the open spans given (ids; step names), in the order every run
    closes them: per reasoning id (sorted) its message's END then its own; tool calls; text
    messages (sorted ids); steps (sorted by step key)."""
    out: list[Event] = []
    open_reasoning, open_messages = set(reasoning), set(reasoning_messages)
    for rid in sorted(open_reasoning | open_messages):
        if rid in open_messages:
            out.append(ev.reasoning_message_end(ts, rid))
        if rid in open_reasoning:
            out.append(ev.reasoning_end(ts, rid))
    out += [ev.tool_end(ts, tool_id) for tool_id in sorted(tools)]
    out += [ev.text_end(ts, message_id) for message_id in sorted(texts)]
    out += [ev.step_finished(ts, name) for name in sorted(steps, key=step_key_of)]
    return out


# START type -> (span kind, the field naming it); END type likewise
_OPENS: Mapping[str, tuple[str, str]] = {
    "TEXT_MESSAGE_START": ("texts", "messageId"),
    "TOOL_CALL_START": ("tools", "toolCallId"),
    "REASONING_START": ("reasoning", "messageId"),
    "REASONING_MESSAGE_START": ("reasoning_messages", "messageId"),
    "STEP_STARTED": ("steps", "stepName"),
}
_CLOSES: Mapping[str, tuple[str, str]] = {
    "TEXT_MESSAGE_END": ("texts", "messageId"),
    "TOOL_CALL_END": ("tools", "toolCallId"),
    "REASONING_END": ("reasoning", "messageId"),
    "REASONING_MESSAGE_END": ("reasoning_messages", "messageId"),
    "STEP_FINISHED": ("steps", "stepName"),
}


class OpenSpans:
    """The spans a run's events left open, learnt from the events alone (a journal's)."""

    def __init__(self, events: Iterable[Mapping[str, Any]] = ()) -> None:
        self._open: dict[str, dict[str, None]] = {kind: {} for kind, _ in _OPENS.values()}
        for event in events:
            self.observe(event)

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if not isinstance(kind, str):
            return
        if kind in _OPENS:
            span, key = _OPENS[kind]
            self._open[span][str(event.get(key))] = None
        elif kind in _CLOSES:
            span, key = _CLOSES[kind]
            self._open[span].pop(str(event.get(key)), None)

    def closing(self, ts: int) -> list[Event]:
        """The END events of the spans still open (``close_spans``)."""
        return close_spans(ts, **self._open)
