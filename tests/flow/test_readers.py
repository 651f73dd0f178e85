"""Several readers per run, and the events route's 204 (issue 20, items 5 and 6).

Two tabs, or a tab and a monitoring script, follow one run at once, each from its own
``Last-Event-ID``, each getting every event once; none ends another (no takeover, so no
ping-pong between two ``EventSource``s); the run goes on while any of them is there, and
the grace period starts when the last one leaves. A reader that already has all of an
ended run is answered 204, which is what stops a browser's ``EventSource`` from reconnecting.

Real sockets, the scripted kernel (``delay_scale`` 0.05: ``[SILENT 20]`` is one second of
kernel silence, ``[SLOW]`` ten deltas 0.05 s apart). Every piece is checked with the
stream checks (``joined``: the pieces make exactly one valid run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from tests.support.agui_client import LiveStream, joined, run_body
from tests.support.flow import FakeMonotonic, cancelled_tasks, wait_for


def readers(adapter: Any, body: dict[str, Any]) -> int:
    return int(adapter.app.engine.journals.readers(body["threadId"], body["runId"]))


def test_health_says_a_run_has_many_readers(make_adapter: Any) -> None:
    health = requests.get(make_adapter().url + "health", timeout=5).json()
    assert health["reattach"] is True and health["readers"] == "many"


def test_two_readers_and_the_run_s_own_client_each_get_the_whole_run_once(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)  # no grace period
    client = adapter.client()
    body = run_body("[SILENT 20] [TOOL] [SLOW] go", cwd=str(workspace))
    own = LiveStream(client, body)
    seen = own.read_events(2)
    tab = client.events(body["threadId"], body["runId"])  # a second tab: from the first event
    script = client.events(body["threadId"], body["runId"], seen[-1][0])  # a script: from where it is
    wait_for(lambda: readers(adapter, body) == 3, 5)
    own_events, tab_events, script_pairs = own.finish(), tab.rest(), script.rest()
    assert own_events[-1]["type"] == "RUN_FINISHED" and own_events[-1]["outcome"] == {"type": "success"}
    assert joined(tab_events) == own_events  # the whole run, once, from its first event
    assert script_pairs[0][0] == seen[-1][0] + 1  # from its own Last-Event-ID, every event once
    assert joined(seen, script_pairs) == own_events
    assert len([e for e in own_events if e["type"] == "TEXT_MESSAGE_CONTENT"]) >= 10
    wait_for(lambda: readers(adapter, body) == 0, 5)


def test_one_reader_leaves_the_others_go_on_and_the_run_is_not_cancelled(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)  # no grace period: only readers keep it going
    client = adapter.client()
    body = run_body("[SILENT 40] [SLOW] go", cwd=str(workspace))
    own = LiveStream(client, body)
    task_id = own.session()["taskId"]
    seen = own.read_events(2)
    first = client.events(body["threadId"], body["runId"], seen[-1][0])
    second = client.events(body["threadId"], body["runId"], seen[-1][0])
    first_seen = first.read_events(0)
    wait_for(lambda: readers(adapter, body) == 3, 5)
    first.close()  # one tab closes
    wait_for(lambda: readers(adapter, body) == 2, 5)
    own.close()  # the run's own client leaves too: the second reader still follows the run
    wait_for(lambda: readers(adapter, body) == 1, 5)
    rest = second.rest()
    events = joined(seen, first_seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert task_id not in cancelled_tasks(scripted_kernel)


def test_the_grace_period_starts_when_the_last_reader_leaves(
    make_adapter: Any, scripted_kernel: Any, workspace: Path
) -> None:
    clock = FakeMonotonic()  # the grace period's clock: moved by the test, never waited for
    adapter = make_adapter(monotonic=clock, disconnect_grace_seconds=1, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    own = LiveStream(client, body)
    task_id = own.session()["taskId"]
    seen = own.read_events(2)
    first = client.events(body["threadId"], body["runId"], seen[-1][0])
    second = client.events(body["threadId"], body["runId"], 1)
    wait_for(lambda: readers(adapter, body) == 3, 5)
    own.close()
    first.close()
    wait_for(lambda: readers(adapter, body) == 1, 5)
    clock.advance(60)  # far longer than the grace period, with one reader left
    clock.looked_at_twice()  # the detached run looked since
    assert task_id not in cancelled_tasks(scripted_kernel)
    second.close()
    wait_for(lambda: readers(adapter, body) == 0, 5)
    clock.looked_at_twice()  # it saw nobody: the grace period starts now
    clock.advance(0.9)
    clock.looked_at_twice()
    assert task_id not in cancelled_tasks(scripted_kernel)  # the grace period, counted from the last reader leaving
    clock.advance(0.2)
    wait_for(lambda: task_id in cancelled_tasks(scripted_kernel), 10)
    rest = client.events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"


def test_two_event_sources_reconnecting_never_take_the_run_from_each_other(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(disconnect_grace_seconds=5, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 20] [SLOW] go", cwd=str(workspace))
    own = LiveStream(client, body)
    seen = own.read_events(1)
    own.close()
    # two EventSources, each reconnecting with its Last-Event-ID whenever its response ends
    # before a terminal event: each response must run on to the end, so neither reconnects
    tabs = [client.events(body["threadId"], body["runId"], seen[-1][0]) for _ in range(2)]
    pieces = [tab.rest() for tab in tabs]
    for piece in pieces:
        assert piece[-1][1]["type"] == "RUN_FINISHED"
        assert joined(seen, piece)[-1]["outcome"] == {"type": "success"}


def test_an_ended_run_replays_whole_then_answers_204_so_event_source_stops(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    client = adapter.client()
    body = run_body("[TOOL] hi", cwd=str(workspace))
    whole = LiveStream(client, body).rest()
    terminal = whole[-1][0]
    url = f"{adapter.url}threads/{body['threadId']}/runs/{body['runId']}/events"
    # a first GET without Last-Event-ID, within the retention time: the whole run, 200
    replay = client.events(body["threadId"], body["runId"])
    assert replay.status == 200 and joined(replay.rest()) == joined(whole)
    # the EventSource reconnects with the id of the last event it got, the terminal one: 204
    for last in (terminal, terminal + 5):
        done = requests.get(url, headers={"Accept": "text/event-stream", "Last-Event-ID": str(last)}, timeout=5)
        assert done.status_code == 204 and done.content == b""
        assert "Content-Type" not in done.headers or not done.headers["Content-Type"].startswith("text/event-stream")
    head = requests.head(url, headers={"Last-Event-ID": str(terminal)}, timeout=5)
    assert head.status_code == 204
    # an event before the end still gets the rest
    tail = client.events(body["threadId"], body["runId"], terminal - 1).rest()
    assert tail == whole[-1:]
    # unknown runs stay 404
    unknown = requests.get(url.replace(body["runId"], "run-never"), headers={"Last-Event-ID": "3"}, timeout=5)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "RUN_NOT_FOUND"


def test_a_run_whose_journal_expired_stays_404(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(replay_retention_seconds=0)
    client = adapter.client()
    body = run_body("hi", cwd=str(workspace))
    result = client.run(body)
    terminal = len(result.events)

    def expired() -> bool:
        return client.events(body["threadId"], body["runId"], terminal).status == 404

    wait_for(expired, 5)
    gone = client.events(body["threadId"], body["runId"], terminal)
    assert gone.error()["code"] == "RUN_NOT_FOUND"


def test_a_live_run_reader_at_its_last_event_waits_for_more(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SILENT 20] [SLOW] go", cwd=str(workspace))
    own = LiveStream(client, body)
    seen = own.read_events(2)
    at_the_edge = client.events(body["threadId"], body["runId"], seen[-1][0])  # nothing new yet, not 204
    assert at_the_edge.status == 200
    events = joined(seen, at_the_edge.rest())
    assert events[-1]["type"] == "RUN_FINISHED"
    own.close()
