"""A restart or crash of the adapter never costs a run (issue 22): adoption, hand-over.

``python run.py --a2a-url <scripted kernel>`` processes on one state directory, the kernel
started separately (it outlives them, as in ``deploy/``). A process is killed (``kill -9``)
or stopped (SIGTERM with ``--on-shutdown handover``) in the middle of a run; a new process
on the same state directory takes the run over (``agui_adapter/run/adoption.py``) when a client
reattaches (either route), when a request for the thread arrives, or at start-up. The client's
pieces, joined on their ids, must be one valid run (``joined``: no id twice, none missing,
every span closed, one terminal event) whose text is the kernel's whole answer.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel import ScriptedKernel
from agui_adapter.scripted_kernel.turn_scripts import SLOW_PIECES
from tests.support.agui_client import Client, LiveStream, joined, resume, run_body
from tests.support.flow import KERNEL_TOKEN, cancelled_tasks, wait_for

SLOW_TEXT = "".join(SLOW_PIECES)


@pytest.fixture(scope="module")
def kernel() -> Iterator[ScriptedKernel]:
    """A kernel of its own, outliving the adapters: ``[SLOW]`` is ten deltas 0.3 s apart."""
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.3)
    kernel.start()
    yield kernel
    kernel.stop()


def start(adapter_process: Any, kernel: ScriptedKernel, *extra: str) -> Any:
    return adapter_process("--heartbeat-seconds", "0.5", *extra, kernel_url=kernel.url)


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def reattach(client: Client, body: dict[str, Any], after: int, route: str) -> LiveStream:
    stream = client.reattach(body, after) if route == "post" else client.events(body["threadId"], body["runId"], after)
    assert stream.status == 200, stream.response.text
    return stream


@pytest.mark.parametrize("route", ["get", "post"])
def test_kill_9_mid_message_then_a_new_process_adopts_the_run_on_reattach(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path, route: str
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b" one,")
    seen = first.read_events(1)
    a.kill()  # mid-message: a text message is open; the kernel goes on producing deltas meanwhile
    time.sleep(1.0)
    b = start(adapter_process, kernel)
    ready = time.monotonic()
    again = reattach(Client(b.url), body, seen[-1][0], route)
    first_new = again.read_events(1)
    latency = time.monotonic() - ready
    rest = first_new + again.rest()[len(first_new) :]
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert text_of(events) == SLOW_TEXT  # the kernel's whole answer, each piece once
    assert [e["type"] for e in events].count("TEXT_MESSAGE_START") == 1
    assert task_id not in cancelled_tasks(kernel)
    assert b"adopted after event" in b.log, b.log.decode()
    assert "agui_runs_adopted_total 1" in requests.get(b.url + "metrics", timeout=10).text
    assert latency < 5, latency
    print(f"adoption: first event {latency:.3f} s after the new process was ready")


def test_a_reader_on_another_process_takes_over_when_the_running_process_dies(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a, b = start(adapter_process, kernel), start(adapter_process, kernel)
    body = run_body("[TOOL] [SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    first.session()
    first.read_until(b"TOOL_CALL_START")
    seen = first.read_events(1)
    reader = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0])
    b_seen = reader.read_events(0)
    a.kill()
    rest = reader.rest()
    events = joined(seen, b_seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED"
    assert text_of(events).endswith(SLOW_TEXT)
    assert [e["type"] for e in events].count("TOOL_CALL_END") == 1
    assert [e["type"] for e in events].count("TOOL_CALL_RESULT") == 1
    # the client that was on A comes back to B with what it had: the same run
    assert joined(seen, Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest()) == events


def gap_tool_result_kept(kernel: ScriptedKernel, task_id: str) -> bool:
    """Whether the kernel's conversation of the task's context holds a tool result."""
    with kernel.state.lock:
        task = kernel.state.tasks.get(task_id)
        ctx = kernel.state.contexts.get(task.context_id) if task is not None else None
        conversation = list(ctx.conversation) if ctx is not None else []
    return any(
        isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
        for m in conversation
    )


def tool_events(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The run's tool events without their ids: (type, name / args / result content)."""
    shown = {"TOOL_CALL_START": "toolCallName", "TOOL_CALL_ARGS": "delta", "TOOL_CALL_RESULT": "content"}
    return [(e["type"], str(e.get(shown.get(e["type"], "type")))) for e in events if e["type"].startswith("TOOL_CALL")]


@pytest.mark.parametrize("route", ["get", "post"])
def test_a_tool_call_made_while_no_adapter_was_alive_is_sent_by_the_adopter(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path, route: str
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SILENT 5] [TOOL] [SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    a.kill()  # before the tool call: the kernel makes it (and gets its result) with no adapter alive
    assert not any(e["type"].startswith("TOOL_CALL") for _, e in seen)
    wait_for(lambda: gap_tool_result_kept(kernel, task_id), 20)
    b = start(adapter_process, kernel)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], route).rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    # the call as an uninterrupted run streams it: START, ARGS, END, RESULT, once each
    whole = Client(b.url).run(run_body("[TOOL] go", cwd=str(workspace)))
    assert tool_events(events) == tool_events(whole.events), b.log.decode()
    [start_event] = [e for e in events if e["type"] == "TOOL_CALL_START"]
    [result] = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == start_event["toolCallId"] and result["messageId"] == (
        f"tool-result-{start_event['toolCallId']}"
    )
    assert text_of(events) == "I will read the file." + SLOW_TEXT
    # the thread's messages name the call and its result with the ids the stream used
    messages = requests.get(f"{b.url}threads/{body['threadId']}/messages", timeout=10).json()["messages"]
    assert start_event["toolCallId"] in [c["id"] for m in messages for c in m.get("toolCalls", [])]
    assert result["messageId"] in [m["id"] for m in messages]


def gap_artifacts_made(kernel: ScriptedKernel, task_id: str) -> list[dict[str, Any]]:
    """The artifacts the kernel's task holds (what its snapshots carry)."""
    with kernel.state.lock:
        task = kernel.state.tasks.get(task_id)
        return list(task.artifacts) if task is not None else []


@pytest.mark.parametrize("ended", [False, True], ids=["subscribed", "ended"])
def test_an_artifact_made_while_no_adapter_was_alive_reaches_the_reattached_client_once(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path, ended: bool
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SILENT 3] [WRITE] [AUTO] [SLOW] write it", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    a.kill()  # before the write: the kernel writes the file (an artifact) with no adapter alive
    [made] = wait_for(lambda: gap_artifacts_made(kernel, task_id), 20)
    if ended:  # the task ended too: the adopter reads it with GetTask; else SubscribeToTask's snapshot
        wait_for(lambda: kernel.state.tasks[task_id].status["state"] == "TASK_STATE_INPUT_REQUIRED", 20)
    b = start(adapter_process, kernel)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, events[-1]
    artifacts = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.artifact.v1"]
    assert [a["value"]["artifactId"] for a in artifacts] == [made["artifactId"]]  # once
    # as an uninterrupted run sends it: the same keys, in the same place (after the tool's result)
    whole = Client(b.url).run(run_body("[WRITE] [AUTO] write it", cwd=str(workspace)))
    [live] = [e for e in whole.events if e["type"] == "CUSTOM" and e["name"] == "iac-code.artifact.v1"]
    assert set(artifacts[0]["value"]) == set(live["value"]) and artifacts[0]["value"]["name"] == "hello.txt"
    [result] = [i for i, e in enumerate(events) if e["type"] == "TOOL_CALL_RESULT"]
    assert events.index(artifacts[0]) > result
    assert text_of(events).endswith("Tool finished. Result: " + text_of(whole.events).split("Result: ")[1])
    assert (workspace / "hello.txt").exists()


def test_sigterm_with_handover_closes_streams_without_a_terminal_event_and_the_next_process_adopts(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel, "--shutdown-grace-seconds", "0.3")
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b" two,")
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    seen = first.rest()  # the stream ends without a terminal event
    assert seen[-1][1]["type"] not in ("RUN_FINISHED", "RUN_ERROR")
    assert a.proc.wait(15) == 0
    assert b"handed over" in a.log
    assert task_id not in cancelled_tasks(kernel)
    b = start(adapter_process, kernel)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
    assert events[-1]["type"] == "RUN_FINISHED"
    assert text_of(events) == SLOW_TEXT


def test_sigterm_with_cancel_ends_the_runs_as_before(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel, "--shutdown-grace-seconds", "0.3", "--on-shutdown", "cancel")
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    events = joined(first.rest())
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    wait_for(lambda: task_id in cancelled_tasks(kernel))


def test_a_permission_reached_while_no_adapter_runs_is_committed_by_the_adopter_and_answerable(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SILENT 3] [WRITE] make a file", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    a.kill()
    # the kernel reaches the permission with no adapter alive
    wait_for(lambda: kernel_state(kernel, task_id) == "TASK_STATE_INPUT_REQUIRED", 20)
    b = start(adapter_process, kernel)  # adopts at start-up (no request needed)
    wait_for(lambda: b"adopted after event" in b.log, 15)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"]["type"] == "interrupt"
    [interrupt] = events[-1]["outcome"]["interrupts"]
    # committed: a new turn is told to answer it first
    refused = requests.post(b.url, json=run_body("next", thread_id=body["threadId"], cwd=str(workspace)), timeout=30)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "RESUME_REQUIRED"
    answer = resume(
        body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    )
    done = Client(b.url).run(answer)
    assert done.terminal["type"] == "RUN_FINISHED", done.terminal
    assert (workspace / "hello.txt").exists()


def test_the_grace_period_applies_in_the_adopter_when_nobody_comes_back(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel, "--disconnect-grace-seconds", "1")
    body = run_body("[SILENT 60] wait", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    a.kill()
    b = start(adapter_process, kernel, "--disconnect-grace-seconds", "1")
    wait_for(lambda: b"adopted after event" in b.log, 15)
    wait_for(lambda: task_id in cancelled_tasks(kernel), 15)
    events = joined(seen, Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"


def test_a_new_turn_on_the_thread_adopts_the_run_and_is_thread_busy(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    first.session()
    seen = first.read_events(1)
    a.kill()
    b = start(adapter_process, kernel)
    busy = requests.post(b.url, json=run_body("next", thread_id=body["threadId"], cwd=str(workspace)), timeout=30)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "THREAD_BUSY"
    events = joined(seen, Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_FINISHED" and text_of(events) == SLOW_TEXT


def test_a_kernel_that_no_longer_has_the_task_ends_the_run_execution_lost(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    first.session()
    first.read_until(b"TEXT_MESSAGE_CONTENT")
    seen = first.read_events(1)
    a.kill()
    forgetful = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.3)  # a kernel that never saw the task
    forgetful.start()
    try:
        b = start(adapter_process, forgetful)
        events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
        assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "EXECUTION_LOST"
        # the thread is free; this kernel never had its session either: the next run says so
        # (as any kernel that lost a session), and the run after it starts a new one
        nxt = Client(b.url).run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
        assert nxt.terminal["type"] == "RUN_ERROR" and nxt.terminal["code"] == "EXECUTION_LOST", nxt.terminal
        after = Client(b.url).run(run_body("again", thread_id=body["threadId"], cwd=str(workspace)))
        assert after.terminal["type"] == "RUN_FINISHED", after.terminal
    finally:
        forgetful.stop()


def test_kill_9_in_the_middle_of_a_pipeline_step(adapter_process: Any, kernel: ScriptedKernel, workspace: Path) -> None:
    from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES
    from tests.support.kernel_rpc import journal

    a = start(adapter_process, kernel)
    body = run_body(
        "[PIPE-SLOW] [PIPE-CANDIDATES] a small website", cwd=str(workspace), runMode="pipeline", pipelineName="selling"
    )
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b'"stepName":"architecture_planning"')
    seen = first.read_events(1)
    a.kill()
    time.sleep(0.5)  # the pipeline goes on with no adapter alive
    b = start(adapter_process, kernel)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
    terminal = events[-1]
    assert terminal["type"] == "RUN_FINISHED" and terminal["outcome"]["type"] == "interrupt", terminal
    [selection] = terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection"
    delivered = [e["value"]["eventId"] for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.pipeline.v1"]
    assert len(delivered) == len(set(delivered)), "a pipeline event was delivered twice"
    wanted = {e["eventId"] for e in journal(kernel, task_id) if e["eventType"] in CUSTOM_EVENT_TYPES}
    assert set(delivered) == wanted
    text = text_of(events)
    for step in ("intent_parsing", "architecture_planning", "evaluate_candidates"):
        assert text.count(f"Working on {step}.") <= 1, text
    picked = {"interruptId": selection["id"], "status": "resolved", "payload": {"selectedId": "1"}}
    done = Client(b.url).run(resume(body, [picked], runMode="pipeline", pipelineName="selling"))
    assert done.terminal["type"] == "RUN_FINISHED", done.terminal


def test_a_run_that_ended_while_no_adapter_was_alive_is_concluded_from_the_kernel(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    a = start(adapter_process, kernel)
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b" one,")
    seen = first.read_events(1)
    a.kill()
    wait_for(lambda: kernel_state(kernel, task_id) == "TASK_STATE_INPUT_REQUIRED", 20)  # the turn ended meanwhile
    b = start(adapter_process, kernel)
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "post").rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert text_of(events) == SLOW_TEXT  # the rest of the message, from the kernel's history


def kernel_state(kernel: ScriptedKernel, task_id: str) -> str:
    answer = requests.post(
        kernel.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}},
        headers={"Authorization": f"Bearer {KERNEL_TOKEN}", "A2A-Version": "1.0"},
        timeout=10,
    ).json()
    return str(answer["result"]["status"]["state"])


def test_a_kernel_that_does_not_answer_is_waited_for_not_taken_for_one_that_lost_the_task(
    adapter_process: Any, workspace: Path
) -> None:
    from urllib.parse import urlsplit

    down = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.3)
    down.start()
    port = urlsplit(down.url).port
    assert port is not None
    a = start(adapter_process, down)
    body = run_body("[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    first.session()
    seen = first.read_events(1)
    a.kill()
    down.stop()  # the kernel is down while the new process meets the run
    b = start(adapter_process, down)
    again = reattach(Client(b.url), body, seen[-1][0], "get")
    wait_for(lambda: b"not adopted now: the kernel does not answer" in b.log, 15)
    back = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.3)  # back on the same port, without the task
    back.start(port=port)
    try:
        events = joined(seen, again.rest())  # the reader waited, then the adopter found the task gone
        assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "EXECUTION_LOST", events[-1]
    finally:
        back.stop()


def test_a_guidance_run_whose_process_died_ends_execution_lost_and_its_pipeline_is_adopted(
    adapter_process: Any, kernel: ScriptedKernel, workspace: Path
) -> None:
    """Guidance runs are not adopted (the README says why): whether the kernel took the message
    cannot be known, so the run ends ``EXECUTION_LOST``; the pipeline's own run goes on."""
    a = start(adapter_process, kernel)
    body = run_body("[PIPE-SLOW] a small website", cwd=str(workspace), runMode="pipeline", pipelineName="selling")
    pipeline = LiveStream(Client(a.url), body)
    pipeline.session()
    seen = pipeline.read_events(1)
    guidance = run_body(
        "[SILENT 30] prefer cn-shanghai",  # the kernel acknowledges it 9 s later: the process dies first
        thread_id=body["threadId"],
        cwd=str(workspace),
        runMode="pipeline",
        pipelineName="selling",
        activeGuidance=True,
    )
    steer = LiveStream(Client(a.url), guidance)
    steered = steer.read_events(1)
    assert steered[-1][1]["type"] == "RUN_STARTED"
    a.kill()
    b = start(adapter_process, kernel)
    lost = joined(steered, reattach(Client(b.url), guidance, steered[-1][0], "get").rest())
    assert [e["type"] for e in lost] == ["RUN_STARTED", "RUN_ERROR"] and lost[-1]["code"] == "EXECUTION_LOST", lost
    events = joined(seen, reattach(Client(b.url), body, seen[-1][0], "get").rest())
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    assert b"adopted after event" in b.log
