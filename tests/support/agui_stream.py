"""Reading and judging AG-UI streams in tests.

``parse_sse`` turns raw SSE bytes into events (and insists on the wire rules: LF
only, ``data:`` frames of one JSON object). ``check_stream`` validates every event
against the ``ag-ui-protocol`` 1.0 models, rejects unknown fields and ``null`` in
optional fields, and replays the lifecycle rules of the official client's
``verifyEvents`` (first event, balanced spans, one terminal event, nothing after it),
plus the adapter's own promise that no id is reused within a run. ``RECORDER`` keeps every
stream a test read in ``AGUI_STREAM_DIR`` (when set), for the official client's replay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ag_ui.core import Event
from pydantic import TypeAdapter

_EVENT = TypeAdapter(Event)


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The events of a stream; every event must carry an ``id:`` one more than the last
    (numbered from the first id seen: a reattached stream starts after its Last-Event-ID)."""
    return [event for _, event in parse_sse_ids(raw)]


def parse_sse_ids(raw: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(id, event) pairs of a stream, with the wire rules checked (see ``parse_sse``)."""
    assert b"\r" not in raw, "CR on the wire breaks the official client"
    events: list[tuple[int, dict[str, Any]]] = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.split(b"\n")
        data = [line[5:].lstrip(b" ") for line in lines if line.startswith(b"data:")]
        ids = [line[3:].strip() for line in lines if line.startswith(b"id:")]
        others = [line for line in lines if line and not line.startswith((b"data:", b":", b"id:"))]
        assert not others, f"unexpected SSE lines: {others!r}"
        if not data:
            assert not ids, "an id on a frame without data"
            continue
        assert len(ids) == 1 and ids[0].isdigit(), f"an event without one numeric id: {block[:80]!r}"
        event_id = int(ids[0])
        if events:
            assert event_id == events[-1][0] + 1, f"event id {event_id} after {events[-1][0]}"
        events.append((event_id, json.loads(b"\n".join(data))))
    return events


def _no_nulls(event: dict[str, Any]) -> None:
    required_any = {("CUSTOM", "value"), ("STATE_SNAPSHOT", "snapshot"), ("RAW", "event")}
    for key, value in event.items():
        if value is None and (event["type"], key) not in required_any:
            raise AssertionError(f"null in optional field {key} of {event['type']}")


def check_stream(events: list[dict[str, Any]]) -> None:
    """Raise AssertionError unless ``events`` is one valid AG-UI 1.0 run."""
    assert events, "empty stream"
    assert events[0]["type"] in ("RUN_STARTED", "RUN_ERROR"), f"first event is {events[0]['type']}"
    open_text: set[str] = set()
    open_tools: set[str] = set()
    open_reasoning: set[str] = set()
    open_reasoning_msgs: set[str] = set()
    open_steps: set[str] = set()
    used: dict[str, set[str]] = {"text": set(), "tool": set(), "reasoning": set(), "result": set()}
    terminal = None
    for index, event in enumerate(events):
        assert terminal is None, f"{event['type']} after {terminal}"
        model = _EVENT.validate_python(event)
        assert not model.model_extra, f"unknown fields {model.model_extra} in {event['type']}"
        assert isinstance(event.get("timestamp"), int), f"timestamp of {event['type']} is not an int"
        _no_nulls(event)
        kind = event["type"]
        if kind == "RUN_STARTED":
            assert index == 0, "RUN_STARTED not first"
        elif kind == "TEXT_MESSAGE_START":
            mid = event["messageId"]
            assert mid not in used["text"], f"message id reused: {mid}"
            used["text"].add(mid)
            open_text.add(mid)
        elif kind == "TEXT_MESSAGE_CONTENT":
            assert event["messageId"] in open_text, "content without start"
        elif kind == "TEXT_MESSAGE_END":
            open_text.remove(event["messageId"])
        elif kind == "TOOL_CALL_START":
            tid = event["toolCallId"]
            assert tid not in used["tool"], f"tool call id reused: {tid}"
            used["tool"].add(tid)
            open_tools.add(tid)
        elif kind == "TOOL_CALL_ARGS":
            assert event["toolCallId"] in open_tools, "args without start"
        elif kind == "TOOL_CALL_END":
            open_tools.remove(event["toolCallId"])
        elif kind == "TOOL_CALL_RESULT":
            assert event["messageId"] not in used["result"], "tool result message id reused"
            used["result"].add(event["messageId"])
            assert event["toolCallId"] not in open_tools, "result before the call ended"
        elif kind == "REASONING_START":
            rid = event["messageId"]
            assert rid not in used["reasoning"], f"reasoning id reused: {rid}"
            used["reasoning"].add(rid)
            open_reasoning.add(rid)
        elif kind == "REASONING_MESSAGE_START":
            open_reasoning_msgs.add(event["messageId"])
        elif kind == "REASONING_MESSAGE_CONTENT":
            assert event["messageId"] in open_reasoning_msgs, "reasoning content without start"
        elif kind == "REASONING_MESSAGE_END":
            open_reasoning_msgs.remove(event["messageId"])
        elif kind == "REASONING_END":
            open_reasoning.remove(event["messageId"])
        elif kind == "STEP_STARTED":
            assert event["stepName"] not in open_steps, "step started twice"
            open_steps.add(event["stepName"])
        elif kind == "STEP_FINISHED":
            open_steps.remove(event["stepName"])
        elif kind in ("RUN_FINISHED", "RUN_ERROR"):
            terminal = kind
            spans = open_text | open_tools | open_reasoning | open_reasoning_msgs | open_steps
            assert not spans, f"{kind} with open spans {sorted(spans)}"
            if kind == "RUN_FINISHED" and event.get("outcome", {}).get("type") == "interrupt":
                assert event["outcome"]["interrupts"], "interrupt outcome without interrupts"
    assert terminal is not None, "the stream ended without RUN_FINISHED or RUN_ERROR"


class StreamRecorder:
    """Keeps every stream a test produced, for the official client's check in CI."""

    def __init__(self, directory: str | None) -> None:
        self.directory = Path(directory) if directory else None
        self.count = 0

    def record(self, thread_id: str, raw: bytes) -> None:
        if self.directory is None:
            return
        self.count += 1
        group = self.directory / f"{os.getpid()}-{abs(hash(thread_id)) % 10**12:012d}"
        group.mkdir(parents=True, exist_ok=True)
        (group / f"{self.count:06d}.sse").write_bytes(raw)


RECORDER = StreamRecorder(os.environ.get("AGUI_STREAM_DIR"))


def streamed(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """What runs streamed, for comparing with ``GET /threads/{id}/messages``: text per message
    id (``texts``), tool calls by id with name and arguments (``calls``), tool results per
    message id (``results``)."""
    texts: dict[str, str] = {}
    calls: dict[str, dict[str, str]] = {}
    results: dict[str, dict[str, str]] = {}
    for events in runs:
        for event in events:
            kind = event["type"]
            if kind == "TEXT_MESSAGE_START":
                texts[event["messageId"]] = ""
            elif kind == "TEXT_MESSAGE_CONTENT":
                texts[event["messageId"]] += event["delta"]
            elif kind == "TOOL_CALL_START":
                calls[event["toolCallId"]] = {"name": event["toolCallName"], "args": ""}
            elif kind == "TOOL_CALL_ARGS":
                calls[event["toolCallId"]]["args"] += event["delta"]
            elif kind == "TOOL_CALL_RESULT":
                results[event["messageId"]] = {"toolCallId": event["toolCallId"], "content": event["content"]}
    return {"texts": texts, "calls": calls, "results": results}
