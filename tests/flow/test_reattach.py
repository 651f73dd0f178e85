"""Reattach (issue 13): numbered events, the disconnect grace period, and a run's stream
opened again with ``Last-Event-ID`` by ``POST /`` (same body) or ``GET .../events``.

Real sockets, the scripted kernel (``delay_scale`` 0.05: ``[SILENT 20]`` is one second of
kernel silence, ``[SLOW]`` ten deltas 0.05 s apart). Every run read in pieces is joined on
its ids and must be exactly the events of one uninterrupted run (``joined``).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.agui_client import Client, LiveStream, joined, resume, run_body
from tests.support.flow import cancelled_tasks, detached_runs, wait_for


def ids_of(kind: str, pairs: list[tuple[int, dict[str, Any]]]) -> list[int]:
    return [i for i, e in pairs if e["type"] == kind]


def test_every_event_has_an_increasing_id_and_heartbeats_none(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.2)
    stream = LiveStream(adapter.client(), run_body("[SILENT 12] [TOOL] hello", cwd=str(workspace)))
    pairs = stream.rest()
    assert [i for i, _ in pairs] == list(range(1, len(pairs) + 1))
    assert b": heartbeat\n\n" in stream.raw and b"id: 1\ndata: " in stream.raw
    for block in stream.raw.split(b"\n\n"):
        if block.startswith(b":"):
            assert b"id:" not in block
    assert joined(pairs)[-1]["type"] == "RUN_FINISHED"


def test_health_advertises_reattach_and_the_grace_period(make_adapter: Any) -> None:
    adapter = make_adapter(disconnect_grace_seconds=7.5, replay_retention_seconds=60)
    health = requests.get(adapter.url + "health", timeout=5).json()
    assert health["reattach"] is True
    assert health["disconnectGraceSeconds"] == 7.5 and health["replayRetentionSeconds"] == 60


@pytest.mark.parametrize("route", ["get", "post"])
@pytest.mark.parametrize("point", ["after-start", "in-tool-call", "before-terminal"])
def test_a_client_that_left_reattaches_and_gets_exactly_the_rest(
    make_adapter: Any, workspace: Path, route: str, point: str
) -> None:
    adapter = make_adapter(disconnect_grace_seconds=10, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 20] [TOOL] [SLOW] go", cwd=str(workspace))
    first = LiveStream(client, body)
    # what the client had when it left: a chunk may hold more, the client saw no more than this
    if point == "after-start":
        seen = first.read_events(1)[:1]
    elif point == "in-tool-call":
        first.read_until(b'"TOOL_CALL_ARGS"')
        pairs = first.read_events(1)
        seen = pairs[: ids_of("TOOL_CALL_ARGS", pairs)[0]]
    else:
        first.read_until(b'"TEXT_MESSAGE_END"')
        seen = [p for p in first.read_events(1) if p[1]["type"] != "RUN_FINISHED"]
    first.close()
    last = seen[-1][0]
    again = client.reattach(body, last) if route == "post" else client.events(body["threadId"], body["runId"], last)
    assert again.status == 200 and again.response.headers["Content-Type"].startswith("text/event-stream")
    rest = again.rest()
    assert rest and rest[0][0] == last + 1
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert len([e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]) >= 10  # every delta, once


def test_after_the_end_a_reattach_replays_to_the_terminal_event(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    client = adapter.client()
    body = run_body("[TOOL] hi", cwd=str(workspace))
    whole = LiveStream(client, body).rest()
    assert whole[-1][1]["type"] == "RUN_FINISHED"
    everything = client.events(body["threadId"], body["runId"]).rest()  # no Last-Event-ID: from the first event
    assert everything == whole
    tail = client.reattach(body, 3).rest()
    assert tail == whole[3:]
    done = client.events(body["threadId"], body["runId"], whole[-1][0])  # it has everything: 204
    assert done.status == 204 and done.rest() == [] and done.raw == b""
    scrape = requests.get(adapter.url + "metrics", timeout=5).text
    assert "agui_reattaches_total 2" in scrape


def test_post_without_last_event_id_keeps_the_contract_answers(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    client = adapter.client()
    body = run_body("hi", cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    assert client.run(body).error["code"] == "DUPLICATE_RUN_ID"
    other = dict(body, messages=[{"id": "m-x", "role": "user", "content": "something else"}])
    assert client.run(other, headers={"Last-Event-ID": "1"}).error["code"] == "RUN_ID_CONFLICT"
    bad = client.run(body, headers={"Last-Event-ID": "seven"})
    assert bad.status == 400 and bad.error["code"] == "INVALID_INPUT" and "Last-Event-ID" in bad.error["message"]
    # a run id the thread never saw: Last-Event-ID is ignored, it is a new run
    fresh = run_body("hi", thread_id=body["threadId"], cwd=str(workspace))
    assert client.run(fresh, headers={"Last-Event-ID": "4"}).terminal["type"] == "RUN_FINISHED"


def test_unknown_runs_other_threads_and_the_token(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(auth_token="reattach-secret-token")
    client = adapter.client()
    body = run_body("hi", cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    missing = client.events(body["threadId"], "run-never")
    assert missing.status == 404 and missing.error()["code"] == "RUN_NOT_FOUND"
    elsewhere = client.events("thread-other", body["runId"])
    assert elsewhere.status == 404 and elsewhere.error()["code"] == "RUN_NOT_FOUND"
    anonymous = Client(adapter.url).events(body["threadId"], body["runId"])
    assert anonymous.status == 401 and anonymous.error()["code"] == "UNAUTHORIZED"
    german = requests.get(
        f"{adapter.url}threads/{body['threadId']}/runs/run-never/events",
        headers={"Authorization": "Bearer reattach-secret-token", "Accept-Language": "de"},
        timeout=5,
    )
    assert german.status_code == 404 and "nicht gefunden" in german.json()["error"]["message"]


def test_a_detached_run_goes_on_holds_its_thread_and_ends_as_if_watched(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 30] [SLOW] go", cwd=str(workspace))
    first = LiveStream(client, body)
    seen = first.read_events(2)
    task_id = first.session()["taskId"] if b"iac-code.session.v1" in first.raw else None
    first.close()
    busy = client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert busy.error["code"] == "THREAD_BUSY"  # a detached run still holds its thread
    wait_for(lambda: adapter.app.engine.live_runs() == 0, 30)  # the run ends while nobody watches
    rest = client.events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and len(events) > len(seen)
    if task_id:
        assert task_id not in cancelled_tasks(scripted_kernel)
    assert client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace))).terminal["type"] == (
        "RUN_FINISHED"
    )


def test_nobody_reattaching_within_the_grace_period_cancels_the_kernel_task(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    adapter = make_adapter(disconnect_grace_seconds=1, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    first = LiveStream(client, body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    started = time.monotonic()
    first.close()
    wait_for(lambda: task_id in cancelled_tasks(scripted_kernel))
    assert time.monotonic() - started >= 0.9
    rest = client.events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    assert "reattached" in events[-1]["message"]


def test_a_reattach_within_the_grace_period_keeps_the_run_alive(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    adapter = make_adapter(disconnect_grace_seconds=2, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 100] [SLOW] wait", cwd=str(workspace))  # 5 s of silence, then the reply
    first = LiveStream(client, body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    first.close()
    wait_for(lambda: detached_runs(adapter.url) == 1, 10)  # the run goes on detached: the grace period runs
    again = client.events(body["threadId"], body["runId"], seen[-1][0])
    events = joined(seen, again.rest())  # 3 s more than the grace period, still watched
    assert events[-1]["type"] == "RUN_FINISHED"
    assert task_id not in cancelled_tasks(scripted_kernel)


def test_with_no_grace_period_a_disconnect_cancels_at_once_and_the_journal_says_so(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)  # disconnect_grace_seconds=0: the contract's behaviour
    client = adapter.client()
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    first = LiveStream(client, body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    first.close()
    wait_for(lambda: task_id in cancelled_tasks(scripted_kernel), 5)
    rest = wait_for(lambda: client.events(body["threadId"], body["runId"], seen[-1][0]).rest())
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"


def test_a_head_of_the_events_route_answers_without_attaching(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(disconnect_grace_seconds=5, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 20] [SLOW] go", cwd=str(workspace))
    original = LiveStream(client, body)
    seen = original.read_events(2)
    url = f"{adapter.url}threads/{body['threadId']}/runs/{body['runId']}/events"
    head = requests.head(url, timeout=5)
    assert head.status_code == 200 and head.headers["Content-Type"].startswith("text/event-stream")
    assert requests.head(url.replace(body["runId"], "run-never"), timeout=5).status_code == 404
    events = joined(seen, original.rest())  # the original client still has the run, to its end
    assert events[-1]["type"] == "RUN_FINISHED"


def test_a_new_attach_joins_the_run_and_nobody_is_taken_over(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(disconnect_grace_seconds=5, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 40] [SLOW] go", cwd=str(workspace))
    original = LiveStream(client, body)
    seen = original.read_events(2)
    second = client.events(body["threadId"], body["runId"], seen[-1][0])
    third = client.reattach(body, seen[-1][0])
    pieces = [original.rest(), second.rest(), third.rest()]  # every response goes on to the end
    for piece in pieces:
        assert piece[-1][1]["type"] == "RUN_FINISHED"
    assert joined(pieces[0]) == joined(seen, pieces[1]) == joined(seen, pieces[2])


def test_a_reattach_to_events_that_fell_out_of_the_buffer_is_replay_unavailable(
    make_adapter: Any, workspace: Path
) -> None:
    adapter = make_adapter(replay_buffer_bytes=64 * 1024)
    client = adapter.client()
    body = run_body("[FAST 3000] go", cwd=str(workspace))  # about 400 KiB of deltas
    whole = LiveStream(client, body).rest()
    assert whole[-1][1]["type"] == "RUN_FINISHED"
    early = client.events(body["threadId"], body["runId"], 1)
    assert early.status == 409 and early.error()["code"] == "REPLAY_UNAVAILABLE"
    posted = client.reattach(body, 0)
    assert posted.status == 409 and posted.error()["code"] == "REPLAY_UNAVAILABLE"
    late = client.events(body["threadId"], body["runId"], whole[-5][0]).rest()
    assert late == whole[-4:]


def test_journals_go_after_the_retention_time(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(replay_retention_seconds=0)
    client = adapter.client()
    body = run_body("hi", cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"

    journal = Path(adapter.settings.state_dir) / "journal"

    def gone() -> bool:
        return client.events(body["threadId"], body["runId"]).status == 404

    def segments() -> list[tuple[str, int]]:
        """Every segment left, by top directory and size (the sweeper may be deleting one)."""
        found = []
        for path in journal.rglob("*.sse"):
            with contextlib.suppress(FileNotFoundError):
                found.append((path.relative_to(journal).parts[0], path.stat().st_size))
        return found

    # The sweeper runs every second; its rmtree may delete run.json (the 404) before the
    # segment, so the wait is for both, with a deadline a loaded machine meets.
    wait_for(lambda: gone() and segments() in ([], [("Spares", 0)]), 30)
    assert gone()
    assert segments() in ([], [("Spares", 0)])  # only the spare made ahead of the next run, empty


def test_an_interrupt_reached_while_detached_is_on_disk_and_answerable(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 20] [WRITE] make a file", cwd=str(workspace))
    first = LiveStream(client, body)
    seen = first.read_events(1)
    first.close()
    rest = client.events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"]["type"] == "interrupt"
    interrupts = events[-1]["outcome"]["interrupts"]
    answers = [
        {"interruptId": i["id"], "status": "resolved", "payload": {"decision": "allow_once"}} for i in interrupts
    ]
    answered = client.run(resume(body, answers))
    assert answered.terminal["type"] == "RUN_FINISHED" and answered.terminal["outcome"] == {"type": "success"}
    assert (workspace / "hello.txt").exists()


def test_the_cancel_extension_stops_a_detached_run(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    first = LiveStream(client, body)
    session = first.session()
    seen = first.read_events(1)
    first.close()
    wait_for(lambda: detached_runs(adapter.url) == 1, 10)
    cancelled = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": "inv-1"})
    assert cancelled.json()["status"] == "cancelled"
    events = joined(seen, client.events(body["threadId"], body["runId"], seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    assert client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace))).terminal["type"] == (
        "RUN_FINISHED"
    )


def test_a_reader_that_comes_while_the_journal_is_being_made_follows_the_run(
    make_adapter: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's journal is made before its RUN_STARTED goes out (persist before announcing):
    a reader that comes just after RUN_STARTED follows the run, however slow the journal is to
    make (here: half a second), and a crash then still leaves the run's journal behind."""
    from agui_adapter.state.journal import JournalStore

    made = JournalStore.open_writer

    def slowly_made(self: JournalStore, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return made(self, *args, **kwargs)

    monkeypatch.setattr(JournalStore, "open_writer", slowly_made)
    adapter = make_adapter(disconnect_grace_seconds=5, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SLOW] go", cwd=str(workspace))
    original = LiveStream(client, body)
    seen = original.read_events(1)
    assert seen[0][1]["type"] == "RUN_STARTED"
    second = client.events(body["threadId"], body["runId"], 0)
    pieces = [original.rest(), second.rest()]
    assert pieces[1][0][1]["type"] == "RUN_STARTED" and pieces[1][-1][1]["type"] == "RUN_FINISHED"
    assert joined(seen, pieces[0]) == joined(pieces[1])
