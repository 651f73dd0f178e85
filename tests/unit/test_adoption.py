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
from agui_adapter.run.reconcile import GapToolCall, Reconciliation, gap_tool_calls
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
    catching_up = Reconciliation(adopter, before)
    frames = lines("04-subscribe-after-drop.jsonl")
    snapshot = inspect_frame(frames[0])
    assert snapshot.kind == "task"
    after = catching_up.reconcile(snapshot.body, 2) + adopter.map(snapshot, 2)
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
    catching_up = Reconciliation(RunTranslator("t", "r"), before)
    task = json.loads((DATA / "05-gettask-after-end.json").read_text())["result"]
    info = inspect_frame({"result": {"task": task}})
    assert info.state == "input-required"
    after = catching_up.reconcile(info.body, 2)
    # the history holds every delta and the final repeat: the repeat is not text of its own
    assert text(before + after) == "".join(f"Chunk {i}. " for i in range(1, 11))


def test_nothing_is_made_up_when_the_journal_lost_the_start_of_a_message() -> None:
    journal = [ev.text_start(1, "m"), ev.text_content(1, "m", "something else")]
    catching_up = Reconciliation(RunTranslator("t", "r"), journal)
    task = {
        "status": {"state": "TASK_STATE_WORKING"},
        "history": [{"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "Chunk 1. "}]}],
    }
    assert catching_up.reconcile(task, 2) == []


def test_restore_keeps_ids_unique_and_closes_what_was_left_open() -> None:
    first = RunTranslator("t", "r")
    events = [ev.text_start(1, "m"), ev.text_content(1, "m", "a"), ev.tool_start(1, "call-1", "read_file", "m")]
    Reconciliation(first, events)
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


def test_the_tool_calls_of_the_gap_are_the_ones_each_recorded_run_streamed() -> None:
    """``gap_tool_calls`` on the real kernel's conversation (``tests/data/history/``): for each
    recorded run, taken as the run being adopted (its task not written yet), the calls and
    results it finds are those the run streamed, with the same ids and arguments; a run
    whose journal holds none of them gets them all back from ``reconcile``."""
    from agui_adapter.run.identity import run_tag
    from agui_adapter.state.record import RunEntry

    history = Path(__file__).resolve().parent.parent / "data" / "history"
    streams = json.loads((history / "agui-streams.json").read_text())
    conversation = json.loads((history / "kernel-history.json").read_text())["GET /iac-code/session/recovery"]["body"][
        "messages"
    ]
    entries = []
    for stream in streams:
        events = stream["events"]
        [session] = [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.session.v1"]
        outcome = events[-1].get("outcome", {})
        calls = [i["toolCallId"] for i in outcome.get("interrupts", []) if i.get("toolCallId")]
        mode = "resume" if "resume" in stream["request"] else "turn"
        entries.append(
            RunEntry(stream["request"]["runId"], "t", mode, task_id=session["taskId"], interrupt_tool_calls=calls)
        )
    found_any = 0
    for index, stream in enumerate(streams):
        events, run_id = stream["events"], stream["request"]["runId"]
        # the run being adopted has no task in the record yet (written when it ends)
        entry = RunEntry(run_id, "t", entries[index].mode, interrupt_tool_calls=entries[index].interrupt_tool_calls)
        running = [*entries[:index], entry, *entries[index + 1 :]]
        namespace = run_tag(run_id) if entries[index].mode == "resume" else None
        calls, results = gap_tool_calls(conversation, running, run_id, str(entries[index].task_id), namespace)
        streamed_calls = [(e["toolCallId"], e["toolCallName"]) for e in events if e["type"] == "TOOL_CALL_START"]
        assert [(c.tool_call_id, c.name) for c in calls] == streamed_calls
        args = [e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"]
        assert [c.arguments for c in calls] == args
        assert results == [(e["toolCallId"], e["content"]) for e in events if e["type"] == "TOOL_CALL_RESULT"]
        found_any += len(calls) + len(results)
        # the adopter of a run whose journal holds only RUN_STARTED sends them as the run did
        adopter = Reconciliation(RunTranslator("t", run_id, id_namespace=namespace), events[:1])
        adopter.gap_tool_calls, adopter.gap_tool_results = calls, results
        sent = [e for e in adopter.reconcile({"history": []}, 5) if e["type"].startswith("TOOL_CALL")]
        kept = ("type", "toolCallId", "toolCallName", "delta", "content", "messageId")
        streamed = [e for e in events if e["type"].startswith("TOOL_CALL")]
        assert [{k: e[k] for k in kept if k in e} for e in sent] == [
            {k: e[k] for k in kept if k in e and not (k == "messageId" and e["type"] != "TOOL_CALL_RESULT")}
            for e in streamed
        ]
    assert found_any >= 2  # the write_file call (a turn) and its result (the Resume)


def test_reconcile_finishes_a_tool_call_the_journal_left_open_and_sends_nothing_twice() -> None:
    journal = [
        ev.run_started(1, "t", "r"),
        ev.tool_start(1, "call-1", "read_file", None),  # the dead process sent START only
        ev.tool_start(1, "call-0", "ls", None),
        ev.tool_args(1, "call-0", "{}"),
        ev.tool_end(1, "call-0"),
        ev.tool_result(1, "tool-result-call-0", "call-0", "done"),
    ]
    adopter = RunTranslator("t", "r")
    catching_up = Reconciliation(adopter, journal)
    catching_up.gap_tool_calls = [GapToolCall("call-0", "ls", "{}"), GapToolCall("call-1", "read_file", '{"path":"x"}')]
    catching_up.gap_tool_results = [("call-0", "done"), ("call-1", "read 3 lines")]
    sent = catching_up.reconcile({"history": []}, 2)
    assert [(e["type"], e.get("toolCallId")) for e in sent] == [
        ("TOOL_CALL_ARGS", "call-1"),
        ("TOOL_CALL_END", "call-1"),
        ("TOOL_CALL_RESULT", "call-1"),
    ]
    # the live stream goes on with the same call: nothing of it twice
    live = {"toolUseId": "call-1", "name": "read_file", "status": "input_complete", "toolInput": {"path": "x"}}
    again = adopter._map_tool(live, 3, out := [])  # noqa: SLF001 - as a live frame would
    assert again is None and out == []
    adopter.emit_tool_result("call-1", "read 3 lines", 3, out)
    assert out == []
    # a journal cut between a call's ARGS and its END: only the END is owed
    cut = Reconciliation(
        RunTranslator("t", "r"),
        [ev.run_started(1, "t", "r"), ev.tool_start(1, "call-2", "ls", None), ev.tool_args(1, "call-2", "{}")],
    )
    cut.gap_tool_calls = [GapToolCall("call-2", "ls", "{}")]
    assert [e["type"] for e in cut.reconcile({"history": []}, 2)] == ["TOOL_CALL_END"]


def _artifact_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from agui_adapter.run.translation import ARTIFACT_EVENT

    return [e for e in events if e["type"] == "CUSTOM" and e["name"] == ARTIFACT_EVENT]


def test_the_artifact_made_while_no_process_followed_comes_back_once_from_the_subscribe_snapshot() -> None:
    """Captures 10 and 12: ``write_file`` ran after the dead process's last frame; the snapshot's
    ``artifacts`` give it back, in the shape a live run's ``artifactUpdate`` gives it."""
    from agui_adapter.run import gap_artifacts

    before: list[dict[str, Any]] = []
    dead = RunTranslator("t", "r")
    for frame in lines("10-auto-write-before-drop.jsonl"):
        before += dead.map(inspect_frame(frame), 1)
    assert _artifact_events(before) == []
    adopter = RunTranslator("t", "r")
    catching_up = Reconciliation(adopter, before)
    catching_up.gap_artifacts = gap_artifacts.for_journal(before)
    frames = lines("12-subscribe-after-artifact.jsonl")
    snapshot = inspect_frame(frames[0])
    after = catching_up.reconcile(snapshot.body, 2) + adopter.map(snapshot, 2)
    for frame in frames[1:]:
        after += adopter.map(inspect_frame(frame), 3)
    after += adopter.finish(4, {"type": "success"})
    [artifact] = snapshot.body["artifacts"]
    live = RunTranslator("t", "r").map(inspect_frame({"result": {"artifactUpdate": {"artifact": artifact}}}), 2)
    assert _artifact_events(after) == live  # once, as a live run sends it
    value = live[0]["value"]
    assert value["artifactId"] == artifact["artifactId"] and value["parts"][0]["metadata"]["byteSize"] == 24
    types = [e["type"] for e in after]
    assert types.index("CUSTOM") < types.index("TEXT_MESSAGE_CONTENT")  # before the gap's text, as live
    # an adopter whose journal already holds it sends nothing more
    again = Reconciliation(RunTranslator("t", "r"), before + live)
    again.gap_artifacts = gap_artifacts.for_journal(before + live)
    assert _artifact_events(again.reconcile(snapshot.body, 2)) == []


def test_the_artifact_of_a_task_that_ended_unfollowed_comes_back_from_get_task() -> None:
    """Capture 13 (``GetTask`` after the end): the artifact, once; capture 15: the stored task of a
    Resume whose stream closed holds none (the kernel never learnt it), and nothing is made up."""
    from agui_adapter.run.gap_artifacts import gap_artifact_events, journal_artifact_ids

    ended = json.loads((DATA / "13-gettask-artifact-after-end.json").read_text())["result"]
    events = gap_artifact_events(ended, journal_artifact_ids([]), 5)
    assert [e["value"]["artifactId"] for e in events] == [a["artifactId"] for a in ended["artifacts"]]
    assert gap_artifact_events(ended, journal_artifact_ids(events), 6) == []
    twice = {**ended, "artifacts": ended["artifacts"] * 2}
    assert len(gap_artifact_events(twice, (), 5)) == 1
    stale = json.loads((DATA / "15-gettask-after-answer-drop.json").read_text())["result"]
    assert "artifacts" not in stale and gap_artifact_events(stale, (), 5) == []
