"""The thread resource's pure parts: the conversation as AG-UI messages (``history``), the
recent runs of the record (``RunBegan``, ``RunEnded``), the thread view (``web.thread_resource``) and the
journal's last event id.

The conversation is checked on the real kernel's own answer (``tests/data/history/``): the
messages rebuilt from its session conversation carry the ids the recorded runs streamed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.protocol import events as ev
from agui_adapter.run import history
from agui_adapter.state.journal import JournalStore, last_written_id
from agui_adapter.state.record import (
    MAX_RUNS,
    Execution,
    PendingInterrupt,
    RunBegan,
    RunEnded,
    RunEntry,
    ThreadRecord,
)
from agui_adapter.web.thread_resource import thread_view

DATA = Path(__file__).resolve().parents[1] / "data" / "history"


def captured() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    streams = json.loads((DATA / "agui-streams.json").read_text())
    answers = json.loads((DATA / "kernel-history.json").read_text())
    return streams, answers


def runs_of(streams: list[dict[str, Any]]) -> list[RunEntry]:
    """The record's runs as the adapter wrote them for the recorded runs."""
    entries = []
    for stream in streams:
        events = stream["events"]
        [session] = [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.session.v1"]
        terminal = events[-1]
        outcome = terminal.get("outcome", {})
        calls = [i["toolCallId"] for i in outcome.get("interrupts", []) if i.get("toolCallId")]
        entry = RunEntry(
            stream["request"]["runId"],
            "2026-12-03T08:00:00Z",
            "resume" if "resume" in stream["request"] else "turn",
            outcome=outcome.get("type"),
            task_id=session["taskId"],
            interrupt_tool_calls=calls,
        )
        entries.append(entry)
    return entries


def streamed(streams: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    texts: dict[str, str] = {}
    results: dict[str, dict[str, str]] = {}
    for stream in streams:
        for event in stream["events"]:
            if event["type"] == "TEXT_MESSAGE_START":
                texts[event["messageId"]] = ""
            elif event["type"] == "TEXT_MESSAGE_CONTENT":
                texts[event["messageId"]] += event["delta"]
            elif event["type"] == "TOOL_CALL_RESULT":
                results[event["messageId"]] = {"toolCallId": event["toolCallId"], "content": event["content"]}
    return texts, results


def test_the_real_kernels_conversation_gets_the_ids_the_runs_streamed() -> None:
    streams, answers = captured()
    conversation = answers["GET /iac-code/session/recovery"]["body"]["messages"]
    messages = history.agui_messages(conversation, runs_of(streams))
    texts, results = streamed(streams)
    roles = ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [m["role"] for m in messages] == roles
    users = [s["request"]["messages"][0]["content"] for s in streams if s["request"]["messages"]]
    assert [m["content"] for m in messages if m["role"] == "user"] == users
    for message in messages:
        if message["role"] == "assistant":
            assert texts[message["id"]] == message["content"]
        elif message["role"] == "tool":
            assert results[message["id"]] == {"toolCallId": message["toolCallId"], "content": message["content"]}
    assert {m["id"] for m in messages if m["role"] != "user"} == set(texts) | set(results)
    [with_call] = [m for m in messages if m.get("toolCalls")]
    [call] = with_call["toolCalls"]
    start = next(e for s in streams for e in s["events"] if e["type"] == "TOOL_CALL_START")
    assert call["id"] == start["toolCallId"] and call["function"]["name"] == start["toolCallName"] == "write_file"
    assert json.loads(call["function"]["arguments"])["path"] == "hello.txt"


def test_turns_older_than_the_runs_kept_get_stable_ids() -> None:
    streams, answers = captured()
    conversation = answers["GET /iac-code/session/recovery"]["body"]["messages"]
    runs = runs_of(streams)[2:]  # the first two runs fell out of the record
    messages = history.agui_messages(conversation, runs)
    assert [m["id"] for m in messages[:4]] == ["history-0", "history-1", "history-2", "history-3"]
    texts, _ = streamed(streams)
    assert messages[-1]["id"] in texts  # the newest turn still gets its streamed id
    assert history.agui_messages(conversation, []) == history.agui_messages(conversation, [])
    assert all(m["id"].startswith("history-") for m in history.agui_messages(conversation, []))


def test_thinking_only_and_odd_entries_are_left_out() -> None:
    conversation: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}]},
        "not a message",
        {"role": "assistant", "content": "plain"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "r"}]}],
        },  # noqa: E501
    ]
    messages = history.agui_messages(conversation, [])
    assert messages == [
        {"id": "history-0", "role": "user", "content": "hi"},
        {"id": "history-2", "role": "assistant", "content": "plain"},  # positions among the messages
        {"id": "history-3-0", "role": "tool", "toolCallId": "c1", "content": "r"},
    ]


def test_pages_go_from_the_newest_towards_older_messages() -> None:
    items = [{"id": str(n)} for n in range(7)]
    first, cursor = history.page(items, 3, None)
    assert [m["id"] for m in first] == ["4", "5", "6"] and cursor is not None
    limit, before = history.parse_page("3", cursor)
    second, cursor = history.page(items, limit, before)
    assert [m["id"] for m in second] == ["1", "2", "3"]
    third, cursor = history.page(items, 3, history.parse_page(None, cursor)[1])
    assert [m["id"] for m in third] == ["0"] and cursor is None
    assert history.parse_page(None, None) == (history.DEFAULT_LIMIT, None)
    for limit_text in ("0", "-1", "201", "1.5", "x", "1" * 10):
        with pytest.raises(history.BadPage, match="limit"):
            history.parse_page(limit_text, None)
    for before_text in ("", "!!", history.cursor(3)[:-1] + "!", "eDE", history.cursor(10**12)):
        with pytest.raises(history.BadPage, match="before"):
            history.parse_page(None, before_text)


# ====================================================================== the record's runs
def record() -> ThreadRecord:
    return ThreadRecord("t-1", "ctx-1", "/tmp/ws", None, Execution("ex-1", "inv-1"))


def test_the_record_keeps_the_last_runs_with_their_outcomes() -> None:
    rec = record()
    for n in range(MAX_RUNS + 5):
        RunBegan(f"run-{n}", "2026-12-03T08:00:00Z", "turn").apply(rec)
    assert len(rec.runs) == MAX_RUNS and rec.runs[0].run_id == "run-5"
    RunEnded("run-54", "error", "2026-12-03T08:01:00Z", "CANCELLED", "task-9").apply(rec)
    RunEnded("run-0", "success", "2026-12-03T08:01:00Z").apply(rec)  # no longer kept: nothing
    assert rec.runs[-1].public() == {
        "runId": "run-54",
        "outcome": "error",
        "errorCode": "CANCELLED",
        "startedAt": "2026-12-03T08:00:00Z",
        "endedAt": "2026-12-03T08:01:00Z",
    }
    again = ThreadRecord.from_json(json.loads(json.dumps(rec.to_json())), "t-1")
    assert again.runs == rec.runs and again.runs[-1].task_id == "task-9"
    old = rec.to_json()
    del old["runs"]  # a state file written before runs were kept
    assert ThreadRecord.from_json(old, "t-1").runs == []


def test_the_view_lists_only_answerable_interrupts_exactly_as_announced() -> None:
    rec = record()
    live = {"id": "p1", "reason": "tool_call", "message": "m", "expiresAt": "2026-12-03T09:00:00Z", "metadata": {}}
    gone = dict(live, id="p2", expiresAt="2026-12-03T07:00:00Z")
    rec.execution.pending = {"p1": PendingInterrupt({}, live), "p2": PendingInterrupt({}, gone)}
    now = 1796284800.0  # 2026-12-03T08:00:00Z
    view = thread_view(rec, None, now)
    assert view["pendingInterrupts"] == [live]
    assert view["execution"] == {"executionId": "ex-1", "rosInvocationId": "inv-1"}
    rec.retire_execution()
    view = thread_view(rec, None, now)
    assert view["pendingInterrupts"] == [] and view["execution"] is None


def test_the_journal_tells_its_last_event_id(tmp_path: Path) -> None:
    store = JournalStore(tmp_path, retention_seconds=60, buffer_bytes=4096)
    writer = store.open_writer("t", "r")
    assert store.progress("t", "r") == (True, None, True)
    event = ev.run_started(1, "t", "r")
    for first in range(1, 40, 3):
        writer.append(ev.encode_many([event, event, event], first), first + 3)
    alive, last, attached = store.progress("t", "r")  # type: ignore[misc]
    assert alive and last == 39 and attached
    writer.client_left()
    writer.end()
    assert store.progress("t", "r") == (False, 39, False)
    segments = sorted(int(p.stem) for p in store.run_dir("t", "r").glob("*.sse"))
    assert len(segments) > 1  # the newest segment is read, not the first
    assert last_written_id(store.run_dir("t", "r"), [*segments, 10**6]) == 39  # one listed but gone
    assert store.progress("t", "other") is None
