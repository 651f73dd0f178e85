"""The thread resource against the real iac-code 0.16.0 kernel (issue 21).

``GET /threads/{threadId}`` after a turn, an interrupt (still listed, complete and answerable
once the run's journal expired), a live run and a pipeline waiting on a question;
``GET /threads/{threadId}/messages`` after turns with a tool call, checked against the streams
the runs produced (ids included), the kernel's conversation being read from its session
recovery view (``tests/data/history/``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from tests.support.agui_client import Client, LiveStream, RunResult, resume, run_body, session_value
from tests.support.agui_stream import streamed
from tests.support.flow import wait_for

from .harness import Adapters, thread_id

ALLOW = {"decision": "allow_once"}


def url(adapter: Any, thread: str, tail: str = "") -> str:
    return f"{adapter.url.rstrip('/')}/threads/{quote(thread, safe='')}{tail}"


def get(adapter: Any, thread: str, tail: str = "", **params: Any) -> dict[str, Any]:
    response = requests.get(url(adapter, thread, tail), params=params, timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_thread_and_its_messages_after_turns_with_a_permission(adapters: Adapters, ws: Path, tag: str) -> None:
    adapter = adapters.start("--replay-retention-seconds", "1")
    client = Client(adapter.url)
    thread = thread_id("threads")
    results: list[RunResult] = []

    def play(body: dict[str, Any]) -> RunResult:
        result = client.run(body)
        assert result.terminal["type"] == "RUN_FINISHED", result.terminal
        results.append(result)
        return result

    play(run_body(f"[THINK] hello {tag}", thread_id=thread, cwd=str(ws), ros="inv-r1"))
    after_turn = get(adapter, thread)
    assert after_turn["activeRun"] is None and after_turn["pendingInterrupts"] == []
    assert [r["outcome"] for r in after_turn["runs"]] == ["success"]

    write = run_body(f"[WRITE] write it {tag}", thread_id=thread, cwd=str(ws), ros="inv-r2")
    interrupted = play(write)
    announced = interrupted.terminal["outcome"]["interrupts"]
    events = url(adapter, thread, f"/runs/{write['runId']}/events")
    wait_for(lambda: requests.head(events, timeout=5).status_code == 404, timeout=60)  # the journal expired
    waiting = get(adapter, thread)
    assert waiting["pendingInterrupts"] == announced
    execution = {"executionId": session_value(interrupted)["executionId"], "rosInvocationId": "inv-r2"}
    assert waiting["execution"] == execution
    [interrupt] = waiting["pendingInterrupts"]
    play(resume(write, [{"interruptId": interrupt["id"], "status": "resolved", "payload": ALLOW}]))
    assert (ws / "hello.txt").exists()
    play(run_body(f"[RECALL] how many? {tag}", thread_id=thread, cwd=str(ws), ros="inv-r3"))

    thread_now = get(adapter, thread)
    assert [r["outcome"] for r in thread_now["runs"]] == ["success", "interrupt", "success", "success"]
    assert thread_now["pendingInterrupts"] == [] and thread_now["activeRun"] is None

    answer = get(adapter, thread, "/messages")
    messages = answer["messages"]
    assert answer["nextCursor"] is None
    roles = ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [m["role"] for m in messages] == roles
    assert [m["content"] for m in messages if m["role"] == "user"] == [
        f"[THINK] hello {tag}",
        f"[WRITE] write it {tag}",
        f"[RECALL] how many? {tag}",
    ]
    seen = streamed([r.events for r in results])
    texts, calls, tool_results = seen["texts"], seen["calls"], seen["results"]
    for message in messages:
        if message["role"] == "assistant":
            assert texts[message["id"]] == message["content"], message
            for call in message.get("toolCalls", []):
                assert calls[call["id"]]["name"] == call["function"]["name"]
                assert json.loads(calls[call["id"]]["args"]) == json.loads(call["function"]["arguments"])
        elif message["role"] == "tool":
            assert tool_results[message["id"]] == {"toolCallId": message["toolCallId"], "content": message["content"]}
    assert {m["id"] for m in messages if m["role"] != "user"} == set(texts) | set(tool_results)
    older = get(adapter, thread, "/messages", limit=3)
    assert older["messages"] == messages[-3:] and older["nextCursor"]
    rest = get(adapter, thread, "/messages", limit=10, before=older["nextCursor"])
    assert rest["messages"] == messages[:-3] and rest["nextCursor"] is None


def test_a_live_run_and_an_unknown_thread(adapters: Adapters, ws: Path, tag: str) -> None:
    adapter = adapters.start("--disconnect-grace-seconds", "30")
    client = Client(adapter.url)
    body = run_body(f"[SLOW] go {tag}", thread_id=thread_id("live"), cwd=str(ws))
    stream = LiveStream(client, body)
    seen = stream.read_events(3)
    active = get(adapter, body["threadId"])["activeRun"]
    assert active["runId"] == body["runId"] and active["clientAttached"] is True and active["mode"] == "turn"
    assert active["lastEventId"] >= seen[-1][0]
    stream.close()
    assert wait_for(lambda: (get(adapter, body["threadId"])["activeRun"] or {}).get("clientAttached") is False)
    last = get(adapter, body["threadId"])["activeRun"]["lastEventId"]
    pairs = client.events(body["threadId"], body["runId"], last).rest()
    assert pairs[0][0] == last + 1 and pairs[-1][1]["type"] == "RUN_FINISHED"
    assert get(adapter, body["threadId"])["runs"][-1]["outcome"] == "success"
    missing = requests.get(url(adapter, "rk-never-seen"), headers={"Accept-Language": "fr"}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "THREAD_NOT_FOUND"
    assert missing.json()["error"]["message"] == "Le fil de discussion est introuvable."
    other = requests.get(url(adapter, body["threadId"]), headers={"X-AGUI-Thread-Id": "x"}, timeout=10)
    assert other.status_code == 400 and "X-AGUI-Thread-Id" in other.json()["error"]["message"]


def test_a_pipeline_waiting_on_a_question(adapters: Adapters, ws: Path, tag: str) -> None:
    adapter = adapters.start("--replay-retention-seconds", "1")
    client = Client(adapter.url)
    props = {"runMode": "pipeline", "pipelineName": "selling", "candidatePresentation": "rich"}
    body = run_body(f"[PIPE-SELL] [PIPE-ASK] a small website {tag}", thread_id=thread_id("pipe"), cwd=str(ws), **props)
    first = client.run(body)
    [question] = first.terminal["outcome"]["interrupts"]
    assert question["metadata"]["kind"] == "ask_user_question"
    events = url(adapter, body["threadId"], f"/runs/{body['runId']}/events")
    wait_for(lambda: requests.head(events, timeout=5).status_code == 404, timeout=60)  # the journal expired
    thread = get(adapter, body["threadId"])
    assert thread["pendingInterrupts"] == [question] and thread["activeRun"] is None
    assert thread["execution"]["executionId"] == session_value(first)["executionId"]
    assert [(r["runId"], r["outcome"]) for r in thread["runs"]] == [(body["runId"], "interrupt")]
    # answered from what the thread resource gave back: the pipeline goes on to its selection
    answer = run_body(
        None,
        thread_id=body["threadId"],
        cwd=str(ws),
        resume=[{"interruptId": question["id"], "status": "resolved", "payload": {"selectedId": "sh"}}],
        **props,
    )
    second = client.run(answer)
    assert second.terminal["type"] == "RUN_FINISHED" and second.terminal["outcome"]["type"] == "interrupt"
    [selection] = second.terminal["outcome"]["interrupts"]
    assert get(adapter, body["threadId"])["pendingInterrupts"] == [selection]
