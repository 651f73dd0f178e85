"""Adoption, the sans-I/O parts (issue 22): the translator taking up a run from its journal's
events and giving back what the kernel produced meanwhile, from the real kernel's snapshots
(``tests/data/a2a-subscribe/``); the journal claimed by a new writer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agui_adapter.protocol import events as ev
from agui_adapter.run.adoption import orphaned
from agui_adapter.run.translation import RunTranslator, inspect_frame
from agui_adapter.state.journal import JournalStore, JournalWriter, scan_run, writer_alive

DATA = Path(__file__).resolve().parent.parent / "data" / "a2a-subscribe"


def lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def shown_before_the_drop(translator: RunTranslator) -> list[dict[str, Any]]:
    """What the dead process sent: the events of 01 (three deltas), mapped as it did."""
    out: list[dict[str, Any]] = []
    for frame in lines("01-slow-turn-before-drop.jsonl"):
        out += translator.map(inspect_frame(frame), 1)
    return out


def text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def test_the_subscribe_snapshot_gives_back_the_deltas_of_the_gap_and_the_live_stream_goes_on() -> None:
    before = shown_before_the_drop(RunTranslator("t", "r"))
    assert text(before) == "Chunk 1. Chunk 2. Chunk 3. "
    adopter = RunTranslator("t", "r")
    adopter.restore(before)
    frames = lines("04-subscribe-after-drop.jsonl")
    snapshot = inspect_frame(frames[0])
    assert snapshot.kind == "task"
    after = adopter.reconcile(snapshot.body, 2) + adopter.map(snapshot, 2)
    for frame in frames[1:]:
        after += adopter.map(inspect_frame(frame), 3)
    after += adopter.finish(4, {"type": "success"})
    whole = before + after
    final = next(f for f in frames if "assistantFinal" in json.dumps(f))
    final_text = final["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"]
    assert text(whole) == final_text  # the kernel's final message, each delta once
    types = [e["type"] for e in whole]
    assert types.count("TEXT_MESSAGE_START") == 1 and types.count("TEXT_MESSAGE_END") == 1
    assert types[-1] == "RUN_FINISHED"


def test_a_task_that_ended_with_nobody_following_is_concluded_from_its_final_snapshot() -> None:
    before = shown_before_the_drop(RunTranslator("t", "r"))
    adopter = RunTranslator("t", "r")
    adopter.restore(before)
    task = json.loads((DATA / "05-gettask-after-end.json").read_text())["result"]
    info = inspect_frame({"result": {"task": task}})
    assert info.state == "input-required"
    after = adopter.reconcile(info.body, 2)
    # the history holds every delta and the final repeat: the repeat is not text of its own
    assert text(before + after) == "".join(f"Chunk {i}. " for i in range(1, 11))


def test_nothing_is_made_up_when_the_journal_lost_the_start_of_a_message() -> None:
    adopter = RunTranslator("t", "r")
    adopter.restore([ev.text_start(1, "m"), ev.text_content(1, "m", "something else")])
    task = {
        "status": {"state": "TASK_STATE_WORKING"},
        "history": [{"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "Chunk 1. "}]}],
    }
    assert adopter.reconcile(task, 2) == []


def test_restore_keeps_ids_unique_and_closes_what_was_left_open() -> None:
    first = RunTranslator("t", "r")
    events = [ev.text_start(1, "m"), ev.text_content(1, "m", "a"), ev.tool_start(1, "call-1", "read_file", "m")]
    first.restore(events)
    closing = first.close_all(2)
    assert [e["type"] for e in closing] == ["TOOL_CALL_END", "TEXT_MESSAGE_END"]


def test_a_journal_whose_writer_died_is_claimed_once_and_appended_after_its_last_id(tmp_path: Path) -> None:
    store = JournalStore(tmp_path, retention_seconds=300, buffer_bytes=1 << 20)
    writer = store.open_writer("t", "r", {"threadId": "t", "runId": "r"})
    writer.append(ev.encode_many([ev.run_started(1, "t", "r", None)], 1), 2)
    directory = writer.directory
    assert not orphaned(directory)
    assert JournalWriter.claim(directory, 1 << 20, attempts=2) is None  # a live writer holds it
    writer.close()  # the process died: no end mark, no lock
    assert orphaned(directory)
    claimed = JournalWriter.claim(directory, 1 << 20)
    assert claimed is not None and writer_alive(directory) and not orphaned(directory)
    assert JournalWriter.claim(directory, 1 << 20, attempts=2) is None  # only one adopter
    claimed.append(ev.encode_many([ev.run_error(2, "EXECUTION_LOST", "gone")], 2), 3)
    claimed.end()
    last, ended, events = scan_run(directory)
    assert (last, ended) == (2, True)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert not orphaned(directory)


def test_on_shutdown_is_handover_with_an_external_kernel_and_cancel_with_our_own() -> None:
    from agui_adapter.config import ConfigError, load_settings

    assert load_settings({}, env={}).on_shutdown_mode() == "cancel"
    assert load_settings({"a2a_url": "http://127.0.0.1:1/"}, env={}).on_shutdown_mode() == "handover"
    assert load_settings({}, env={"IAC_CODE_AGUI_ON_SHUTDOWN": "handover"}).on_shutdown_mode() == "handover"
    external = {"a2a_url": "http://127.0.0.1:1/", "on_shutdown": "cancel"}
    assert load_settings(external, env={}).on_shutdown_mode() == "cancel"
    try:
        load_settings({"on_shutdown": "later"}, env={})
    except ConfigError as exc:
        assert "on_shutdown" in str(exc)
    else:
        raise AssertionError("an unknown on_shutdown was accepted")
