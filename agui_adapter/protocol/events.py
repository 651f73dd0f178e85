"""AG-UI 1.0 events as plain dicts, and their SSE wire encoding.

Constructors take every value explicitly (timestamps included: the core never reads
a clock) and omit optional fields instead of writing ``null``: the official 1.0 client
rejects ``null`` in optional fields. ``encode`` writes ``data: <compact JSON>\\n\\n``
with LF only, since CRLF breaks the official client's parser; a run's frames also carry
``id: <n>``, numbered from 1 within the run (heartbeats carry none).
"""

from __future__ import annotations

import json
from typing import Any

Event = dict[str, Any]

HEARTBEAT = b": heartbeat\n\n"


def _make_dumps() -> Any:
    """Compact UTF-8 JSON. ``JSONEncoder.encode`` rebuilds its C encoder on every call;
    on the streaming hot path the C encoder is built once and reused."""
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    c_encode_basestring = getattr(json.encoder, "c_encode_basestring", None)
    if c_make_encoder is None or c_encode_basestring is None:
        return encoder.encode

    def fail(value: Any) -> Any:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    make = c_make_encoder(None, fail, c_encode_basestring, None, ":", ",", False, False, False)

    def dumps(value: Any) -> str:
        return "".join(make(value, 0))

    return dumps


_dumps = _make_dumps()

#: The streaming deltas, most of a run's events, each written from a template: about 2.5 times
#: faster than the encoder, and byte for byte what it writes (its own string escaping,
#: ``json.encoder.encode_basestring``, and the constructors' key order); any other shape of
#: them (another key, another order, a value of another type) goes to the encoder.
_DELTAS = {
    kind: (("type", "timestamp", ident, "delta"), f'{{"type":"{kind}","timestamp":%d,"{ident}":%s,"delta":%s}}')
    for kind, ident in (
        ("TEXT_MESSAGE_CONTENT", "messageId"),
        ("REASONING_MESSAGE_CONTENT", "messageId"),
        ("TOOL_CALL_ARGS", "toolCallId"),
    )
}
_escape = json.encoder.encode_basestring


def _event_json(event: Event) -> str:
    delta = _DELTAS.get(event["type"])
    if delta is not None and tuple(event) == delta[0]:
        _kind, ts, ident, text = event.values()
        if type(ts) is int and type(ident) is str and type(text) is str:
            return delta[1] % (ts, _escape(ident), _escape(text))
    return _dumps(event)


def encode(event: Event) -> bytes:
    """One SSE frame for one event."""
    return encode_many([event])


def encode_many(events: list[Event], first_id: int | None = None) -> bytes:
    """Several frames as one chunk (one write per wake-up, design rule 5); with
    ``first_id``, each frame carries its ``id:`` (``first_id``, ``first_id + 1``, ...),
    the number a client sends back as ``Last-Event-ID`` to reattach (``state.journal``)."""
    # "replace": a lone surrogate from the kernel must not break the stream
    if first_id is None:
        return "".join(["data: " + _event_json(e) + "\n\n" for e in events]).encode("utf-8", "replace")
    return "".join([f"id: {n}\ndata: {_event_json(e)}\n\n" for n, e in enumerate(events, first_id)]).encode(
        "utf-8", "replace"
    )


def _event(kind: str, ts: int, **fields: Any) -> Event:
    event: Event = {"type": kind, "timestamp": ts}
    for key, value in fields.items():
        if value is not None:
            event[key] = value
    return event


def run_started(ts: int, thread_id: str, run_id: str, parent_run_id: str | None = None) -> Event:
    return _event(
        "RUN_STARTED",
        ts,
        threadId=thread_id,
        runId=run_id,
        parentRunId=parent_run_id,
        protocolVersion="1.0",
    )


def run_finished(
    ts: int, thread_id: str, run_id: str, outcome: dict[str, Any], usage: list[dict] | None = None
) -> Event:
    return _event("RUN_FINISHED", ts, threadId=thread_id, runId=run_id, outcome=outcome, usage=usage or None)


def run_error(ts: int, code: str, message: str, usage: list[dict] | None = None) -> Event:
    return _event("RUN_ERROR", ts, message=message, code=code, usage=usage or None)


def text_start(ts: int, message_id: str) -> Event:
    return _event("TEXT_MESSAGE_START", ts, messageId=message_id, role="assistant")


def text_content(ts: int, message_id: str, delta: str) -> Event:
    return {"type": "TEXT_MESSAGE_CONTENT", "timestamp": ts, "messageId": message_id, "delta": delta}


def text_end(ts: int, message_id: str) -> Event:
    return _event("TEXT_MESSAGE_END", ts, messageId=message_id)


def reasoning_start(ts: int, message_id: str) -> Event:
    return _event("REASONING_START", ts, messageId=message_id)


def reasoning_message_start(ts: int, message_id: str) -> Event:
    return _event("REASONING_MESSAGE_START", ts, messageId=message_id, role="reasoning")


def reasoning_content(ts: int, message_id: str, delta: str) -> Event:
    return _event("REASONING_MESSAGE_CONTENT", ts, messageId=message_id, delta=delta)


def reasoning_message_end(ts: int, message_id: str) -> Event:
    return _event("REASONING_MESSAGE_END", ts, messageId=message_id)


def reasoning_end(ts: int, message_id: str) -> Event:
    return _event("REASONING_END", ts, messageId=message_id)


def tool_start(ts: int, tool_call_id: str, name: str, parent_message_id: str | None) -> Event:
    return _event(
        "TOOL_CALL_START",
        ts,
        toolCallId=tool_call_id,
        toolCallName=name,
        parentMessageId=parent_message_id,
    )


def tool_args(ts: int, tool_call_id: str, delta: str) -> Event:
    return _event("TOOL_CALL_ARGS", ts, toolCallId=tool_call_id, delta=delta)


def tool_end(ts: int, tool_call_id: str) -> Event:
    return _event("TOOL_CALL_END", ts, toolCallId=tool_call_id)


def tool_result(ts: int, message_id: str, tool_call_id: str, content: str) -> Event:
    fields = {"messageId": message_id, "toolCallId": tool_call_id, "content": content, "role": "tool"}
    return _event("TOOL_CALL_RESULT", ts, **fields)


def step_started(ts: int, name: str) -> Event:
    return _event("STEP_STARTED", ts, stepName=name)


def step_finished(ts: int, name: str) -> Event:
    return _event("STEP_FINISHED", ts, stepName=name)


def activity_snapshot(ts: int, message_id: str, activity_type: str, content: dict) -> Event:
    return _event(
        "ACTIVITY_SNAPSHOT",
        ts,
        messageId=message_id,
        activityType=activity_type,
        content=content,
        replace=True,
    )


def custom(ts: int, name: str, value: Any) -> Event:
    # CUSTOM.value is required: it is written even when it is null.
    return {"type": "CUSTOM", "timestamp": ts, "name": name, "value": value}
