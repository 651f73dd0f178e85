"""The thread as a resource (issue 21): ``GET /threads/{threadId}`` and ``.../messages``.

Real sockets, the scripted kernel (``delay_scale`` 0.05). The thread resource is checked
against what the runs streamed: the interrupts exactly as ``RUN_FINISHED`` carried them
(also after the run's journal expired), the execution of the session event, the live run
and its last event id; the messages against the text, tool calls and tool results of the
streams, ids included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.support.agui_client import Client, LiveStream, RunResult, resume, run_body, session_value
from tests.support.agui_stream import streamed
from tests.support.flow import interrupted, wait_for
from tests.support.kernel_rpc import rpc

ALLOW = {"decision": "allow_once"}


def thread_url(adapter: Any, thread_id: str, tail: str = "") -> str:
    return f"{adapter.url}threads/{quote(thread_id, safe='')}{tail}"


def get_thread(adapter: Any, thread_id: str, **headers: str) -> dict[str, Any]:
    response = requests.get(thread_url(adapter, thread_id), headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    return dict(response.json())


def live(adapter: Any, thread_id: str) -> dict[str, Any]:
    """The thread's active run ({} when none)."""
    return dict(get_thread(adapter, thread_id)["activeRun"] or {})


def get_messages(adapter: Any, thread_id: str, **params: Any) -> dict[str, Any]:
    response = requests.get(thread_url(adapter, thread_id, "/messages"), params=params, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def allow(body: dict[str, Any], result: RunResult) -> dict[str, Any]:
    [interrupt] = result.terminal["outcome"]["interrupts"]
    return resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": ALLOW}])


# ============================================================================ GET /threads/{id}
def test_a_thread_after_a_turn_with_a_tool_call(client: Client, adapter: Any, workspace: Path) -> None:
    body = run_body("[TOOL] read it", cwd=str(workspace))
    result = client.run(body)
    assert result.terminal["outcome"] == {"type": "success"}
    thread = get_thread(adapter, body["threadId"])
    assert thread["threadId"] == body["threadId"]
    assert thread["activeRun"] is None and thread["pendingInterrupts"] == [] and thread["execution"] is None
    [run] = thread["runs"]
    assert set(run) == {"runId", "outcome", "errorCode", "startedAt", "endedAt"}
    assert run["runId"] == body["runId"] and run["outcome"] == "success" and run["errorCode"] is None
    assert run["startedAt"].endswith("Z") and run["endedAt"] >= run["startedAt"]


def test_an_interrupt_stays_listed_complete_and_answerable_after_the_journal_expired(
    make_adapter: Any, workspace: Path
) -> None:
    adapter = make_adapter(replay_retention_seconds=1)
    client = adapter.client()
    body, first = interrupted(client, workspace)
    announced = first.terminal["outcome"]["interrupts"]
    events_url = thread_url(adapter, body["threadId"], f"/runs/{body['runId']}/events")
    # the run's journal is swept after its retention (HEAD looks without attaching a reader)
    wait_for(lambda: requests.head(events_url, timeout=5).status_code == 404, timeout=30)
    thread = get_thread(adapter, body["threadId"])
    assert thread["pendingInterrupts"] == announced  # exactly what RUN_FINISHED carried
    assert set(announced[0]) >= {"id", "reason", "message", "toolCallId", "responseSchema", "expiresAt", "metadata"}
    session = session_value(first)
    assert thread["execution"] == {"executionId": session["executionId"], "rosInvocationId": "inv-1"}
    assert thread["activeRun"] is None
    assert [(r["runId"], r["outcome"]) for r in thread["runs"]] == [(body["runId"], "interrupt")]
    # answered from what GET /threads gave back
    [interrupt] = thread["pendingInterrupts"]
    answer = resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": ALLOW}])
    second = client.run(answer)
    assert second.terminal["outcome"] == {"type": "success"}, second.terminal
    assert (workspace / "hello.txt").exists()
    after = get_thread(adapter, body["threadId"])
    assert after["pendingInterrupts"] == [] and after["execution"] is None
    assert [(r["runId"], r["outcome"]) for r in after["runs"]] == [
        (body["runId"], "interrupt"),
        (answer["runId"], "success"),
    ]


def test_a_failed_run_is_listed_with_its_error_code(client: Client, adapter: Any, workspace: Path) -> None:
    body = run_body("[FAIL] go", cwd=str(workspace))
    result = client.run(body)
    assert result.terminal["type"] == "RUN_ERROR"
    [run] = get_thread(adapter, body["threadId"])["runs"]
    assert run["outcome"] == "error" and run["errorCode"] == result.terminal["code"]


def test_a_live_run_with_and_without_its_client(make_full_scale_adapter: Any, workspace: Path) -> None:
    # a run of about ten seconds (one delta a second): live while the test reads the resource
    adapter = make_full_scale_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.3)
    client = adapter.client()
    body = run_body("[SLOW] [SLOW] go", cwd=str(workspace))
    stream = LiveStream(client, body)
    seen = stream.read_events(3)
    thread = get_thread(adapter, body["threadId"])
    active = thread["activeRun"]
    assert active["runId"] == body["runId"] and active["mode"] == "turn" and active["clientAttached"] is True
    assert active["lastEventId"] >= seen[-1][0] and active["startedAt"].endswith("Z")
    assert thread["runs"][-1] == {
        "runId": body["runId"],
        "outcome": None,
        "errorCode": None,
        "startedAt": active["startedAt"],
        "endedAt": None,
    }
    assert thread["execution"]["executionId"] == stream.session()["executionId"]
    stream.close()
    # the run goes on without its client
    assert wait_for(lambda: live(adapter, body["threadId"]).get("clientAttached") is False)
    assert wait_for(lambda: live(adapter, body["threadId"]).get("lastEventId", 0) > active["lastEventId"])
    # followed again from where the resource says it is
    last = live(adapter, body["threadId"])["lastEventId"]
    follower = client.events(body["threadId"], body["runId"], last)
    follower.read_events(1)
    assert wait_for(lambda: live(adapter, body["threadId"]).get("clientAttached"))
    pairs = follower.rest()
    assert pairs[0][0] == last + 1 and pairs[-1][1]["type"] == "RUN_FINISHED"
    done = get_thread(adapter, body["threadId"])
    assert done["activeRun"] is None and done["runs"][-1]["outcome"] == "success"


def test_a_run_abandoned_by_its_client_ends_cancelled(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)
    body = run_body("[SLOW] go", cwd=str(workspace))
    stream = LiveStream(adapter.client(), body)
    stream.read_events(3)
    stream.close()
    wait_for(lambda: get_thread(adapter, body["threadId"])["runs"][-1]["endedAt"])
    run = get_thread(adapter, body["threadId"])["runs"][-1]
    assert run["outcome"] == "error" and run["errorCode"] == "CANCELLED"
    assert get_thread(adapter, body["threadId"])["activeRun"] is None


def test_a_pipeline_waiting_on_a_question(client: Client, adapter: Any, workspace: Path) -> None:
    body = run_body("[PIPE-ASK] a small website", cwd=str(workspace), runMode="pipeline", pipelineName="selling")
    first = client.run(body)
    assert first.terminal["outcome"]["type"] == "interrupt", first.terminal
    thread = get_thread(adapter, body["threadId"])
    assert thread["pendingInterrupts"] == first.terminal["outcome"]["interrupts"]
    assert thread["pendingInterrupts"][0]["metadata"]["kind"] == "ask_user_question"
    assert thread["activeRun"] is None
    assert thread["execution"]["executionId"] == session_value(first)["executionId"]
    assert [(r["runId"], r["outcome"]) for r in thread["runs"]] == [(body["runId"], "interrupt")]


def test_a_live_pipeline_is_shown_as_one(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.3)
    body = run_body("[PIPE-SLOW] go", cwd=str(workspace), runMode="pipeline", pipelineName="selling")
    stream = LiveStream(adapter.client(), body)
    stream.read_events(2)
    active = get_thread(adapter, body["threadId"])["activeRun"]
    assert active["runId"] == body["runId"] and active["mode"] == "pipeline"
    stream.finish()


def test_unknown_thread_auth_and_the_thread_header(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(auth_token="s3cret-token")
    client = adapter.client(token="s3cret-token")
    body = run_body("hello", cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    auth = {"Authorization": "Bearer s3cret-token"}
    for tail in ("", "/messages"):
        url = thread_url(adapter, body["threadId"], tail)
        refused = requests.get(url, timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHORIZED"
        wrong = requests.get(url, headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        assert requests.get(url, headers=auth, timeout=10).status_code == 200
        same = requests.get(url, headers={**auth, "X-AGUI-Thread-Id": body["threadId"]}, timeout=10)
        assert same.status_code == 200
        other = requests.get(url, headers={**auth, "X-AGUI-Thread-Id": "another-thread"}, timeout=10)
        assert other.status_code == 400 and other.json()["error"]["code"] == "INVALID_INPUT"
        assert "X-AGUI-Thread-Id" in other.json()["error"]["message"]
        missing = requests.get(
            thread_url(adapter, "never-seen", tail), headers={**auth, "Accept-Language": "de"}, timeout=10
        )
        assert missing.status_code == 404
        assert missing.json()["error"] == {"code": "THREAD_NOT_FOUND", "message": "Der Thread wurde nicht gefunden."}
    english = requests.get(thread_url(adapter, "never-seen"), headers=auth, timeout=10).json()["error"]
    assert english["message"] == "The thread was not found."


# ============================================================================ .../messages
def play_conversation(client: Client, workspace: Path) -> tuple[str, list[dict[str, Any]], list[RunResult]]:
    thread = f"thread-history-{workspace.parent.name[-8:]}"
    bodies: list[dict[str, Any]] = []
    results: list[RunResult] = []

    def play(body: dict[str, Any]) -> RunResult:
        result = client.run(body)
        assert result.terminal["type"] == "RUN_FINISHED", result.terminal
        bodies.append(body)
        results.append(result)
        return result

    play(run_body("[THINK] hello there", thread_id=thread, cwd=str(workspace), ros="inv-1"))
    play(run_body("[TOOL] read the notes", thread_id=thread, cwd=str(workspace), ros="inv-2"))
    write = run_body("[WRITE] write a file", thread_id=thread, cwd=str(workspace), ros="inv-3")
    play(allow(write, play(write)))
    play(run_body("[RECALL] how many turns?", thread_id=thread, cwd=str(workspace), ros="inv-4"))
    return thread, bodies, results


def test_messages_after_several_turns_with_tool_calls_match_the_streams(
    client: Client, adapter: Any, workspace: Path
) -> None:
    thread, bodies, results = play_conversation(client, workspace)
    answer = get_messages(adapter, thread)
    assert answer["threadId"] == thread and answer["nextCursor"] is None
    messages = answer["messages"]
    users = [m for m in messages if m["role"] == "user"]
    assert [m["content"] for m in users] == [b["messages"][0]["content"] for b in bodies if b["messages"]]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",  # [THINK]: the thinking is not a message
        "user",
        "assistant",
        "tool",  # [TOOL]: the run's text (before and after) + tool call, result
        "user",
        "assistant",
        "tool",
        "assistant",  # [WRITE]: text + tool call; the Resume's result, text
        "user",
        "assistant",  # [RECALL]
    ]
    seen = streamed([r.events for r in results])
    for message in messages:
        if message["role"] == "assistant":
            # the id the run streamed, with the text it streamed
            assert seen["texts"][message["id"]] == message["content"], message
            for call in message.get("toolCalls", []):
                assert call["type"] == "function"
                assert seen["calls"][call["id"]]["name"] == call["function"]["name"]
                assert json_equal(seen["calls"][call["id"]]["args"], call["function"]["arguments"])
        elif message["role"] == "tool":
            expected = {"toolCallId": message["toolCallId"], "content": message["content"]}
            assert seen["results"][message["id"]] == expected
    streamed_ids = set(seen["texts"]) | set(seen["results"])
    assert {m["id"] for m in messages if m["role"] != "user"} == streamed_ids
    assert "4 user turns" in messages[-1]["content"]
    assert len({m["id"] for m in messages}) == len(messages)


def json_equal(left: str, right: str) -> bool:
    return bool(json.loads(left) == json.loads(right))


def test_messages_are_paged_from_the_newest(client: Client, adapter: Any, workspace: Path) -> None:
    thread, _, _ = play_conversation(client, workspace)
    everything = get_messages(adapter, thread)["messages"]
    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"limit": 5}
    while True:
        answer = get_messages(adapter, thread, **params)
        pages.insert(0, answer["messages"])
        assert 1 <= len(answer["messages"]) <= 5
        if answer["nextCursor"] is None:
            break
        params = {"limit": 5, "before": answer["nextCursor"]}
    assert [m for p in pages for m in p] == everything
    assert len(pages) == -(-len(everything) // 5)
    for bad in ({"limit": "0"}, {"limit": "201"}, {"limit": "x"}, {"before": "nope!"}, {"before": ""}):
        response = requests.get(thread_url(adapter, thread, "/messages"), params=bad, timeout=10)
        assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_INPUT"
        assert next(iter(bad)) in response.json()["error"]["message"]


def test_messages_of_a_thread_the_kernel_never_answered(client: Client, adapter: Any, workspace: Path) -> None:
    outside = workspace.parent.parent / "not-allowed"
    body = run_body("hello", cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    assert get_messages(adapter, body["threadId"])["messages"][0]["content"] == "hello"
    assert requests.get(thread_url(adapter, "nobody", "/messages"), timeout=10).status_code == 404
    assert not outside.exists()


@pytest.mark.parametrize("route", ["thread", "messages"])
def test_the_routes_are_counted_by_name(client: Client, adapter: Any, workspace: Path, route: str) -> None:
    body = run_body("hello", cwd=str(workspace))
    client.run(body)
    requests.get(thread_url(adapter, body["threadId"], "" if route == "thread" else "/messages"), timeout=10)
    metrics = requests.get(adapter.url + "metrics", timeout=10).text
    assert f'agui_http_requests_total{{route="{route}",status="200"}} 1' in metrics


def test_a_run_of_another_process_is_shown_live(adapter_process: Any, workspace: Path) -> None:
    a, b = (adapter_process("--heartbeat-seconds", "0.3", "--disconnect-grace-seconds", "30") for _ in range(2))
    body = run_body("[SLOW] [SLOW] go", cwd=str(workspace))
    stream = LiveStream(Client(a.url), body)
    seen = stream.read_events(3)
    active = live(b, body["threadId"])  # B runs nothing: it reads the record and A's journal
    assert active["runId"] == body["runId"] and active["clientAttached"] is True and active["mode"] == "turn"
    assert active["lastEventId"] >= seen[-1][0]
    stream.close()
    assert wait_for(lambda: live(b, body["threadId"]).get("clientAttached") is False)
    pairs = Client(b.url).events(body["threadId"], body["runId"], live(b, body["threadId"])["lastEventId"]).rest()
    assert pairs[-1][1]["type"] == "RUN_FINISHED"
    assert wait_for(lambda: get_thread(b, body["threadId"])["activeRun"] is None)
    assert get_thread(b, body["threadId"])["runs"][-1]["outcome"] == "success"


def test_the_scripted_kernels_task_history_is_shaped_like_the_real_one(
    client: Client, scripted_kernel: Any, workspace: Path
) -> None:
    """iac-code 0.16.0 (tests/data/history): GetTask/ListTasks history holds the agent's status
    messages only (<taskId>-message, <taskId>-2), no user message, tool call or result."""
    real = json.loads((Path(__file__).resolve().parents[1] / "data" / "history" / "kernel-history.json").read_text())
    real_tasks = [v["result"] for k, v in real.items() if k.startswith("GetTask") and "historyLength" in k]
    body, first = interrupted(client, workspace)
    client.run(allow(body, first))
    task_id = session_value(first)["taskId"]
    scripted = rpc(scripted_kernel, "GetTask", {"id": task_id, "historyLength": 100}).json()["result"]
    for task in [*real_tasks, scripted]:
        history = task.get("history") or []
        assert history and all(m["role"] == "ROLE_AGENT" for m in history)
        assert {m["messageId"].removeprefix(task["id"]) for m in history} <= {"-message", "-2"}
    context_id = session_value(first)["contextId"]
    listed = rpc(scripted_kernel, "ListTasks", {"contextId": context_id, "historyLength": 100}).json()["result"]
    assert [t["id"] for t in listed["tasks"]] == [task_id] and listed["tasks"][0]["history"] == scripted["history"]


def test_a_run_whose_process_died_is_adopted_and_shown_live_to_its_end(adapter_process: Any, workspace: Path) -> None:
    # issue 22: the other process takes the run over (at the latest when the thread is asked
    # for): it is shown live, then ends as it would have
    a, b = (adapter_process("--heartbeat-seconds", "0.3") for _ in range(2))
    body = run_body("[SLOW] [SLOW] go", cwd=str(workspace))
    stream = LiveStream(Client(a.url), body)
    stream.read_events(3)
    assert live(b, body["threadId"])["runId"] == body["runId"]
    a.kill()
    assert get_thread(b, body["threadId"])["activeRun"]["runId"] == body["runId"]
    thread = wait_for(lambda: (t := get_thread(b, body["threadId"]))["activeRun"] is None and t)
    assert thread["runs"][-1]["runId"] == body["runId"]
    assert (thread["runs"][-1]["outcome"], thread["runs"][-1]["errorCode"]) == ("success", None)


def test_head_and_a_cors_preflight_on_the_thread_routes(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(cors_origins="https://ui.example")
    body = run_body("hello", cwd=str(workspace))
    adapter.client().run(body)
    for tail in ("", "/messages"):
        url = thread_url(adapter, body["threadId"], tail)
        head = requests.head(url, timeout=10)
        assert head.status_code == 200 and head.content == b""
        preflight = requests.options(
            url,
            headers={
                "Origin": "https://ui.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization, x-agui-thread-id",
            },
            timeout=10,
        )
        assert preflight.status_code == 204
        assert preflight.headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
        assert "X-AGUI-Thread-Id" in preflight.headers["Access-Control-Allow-Headers"]
        answer = requests.get(url, headers={"Origin": "https://ui.example"}, timeout=10)
        assert answer.headers["Access-Control-Allow-Origin"] == "https://ui.example"
