"""No dead ends: a thread recovers from restarts, crashes and lost kernel state (issue 9).

Real processes and real signals: ``python run.py`` is started, stopped with SIGINT or
killed with SIGKILL at each point where it writes something down, and started again on
the same state directory; the next request on the thread must succeed, or get the
documented error that the request after it gets past.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.agui_client import Client, resume, run_body, session_value
from tests.support.agui_stream import parse_sse
from tests.support.flow import KERNEL_TOKEN, kernel_calls
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS
from tests.support.servers import AdapterProcess

Event = dict[str, Any]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Callable[[], AdapterProcess]]:
    """``python run.py --kernel scripted`` on one state directory, as ``python run.py`` runs it."""
    started: list[AdapterProcess] = []

    def start() -> AdapterProcess:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
        environ.update({"IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path), "PYTHONUNBUFFERED": "1"})
        args = ["--port", "0", "--kernel", "scripted", "--state-dir", str(tmp_path / "state")]
        process = AdapterProcess(args, environ).start()
        STATE_DIRS.append(tmp_path / "state")
        ADAPTER_LOGS.append(process)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def read_until(url: str, body: dict[str, Any], stop: Callable[[list[Event]], bool]) -> list[Event]:
    """POST a run and read its events until ``stop(events)``; the response is left open."""
    response = requests.post(
        url,
        data=json.dumps(body),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        stream=True,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    events: list[Event] = []
    buffer = b""
    for chunk in response.iter_content(chunk_size=None):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n\n")
        events += parse_sse(b"".join(block + b"\n\n" for block in complete))
        if stop(events):
            return events
    raise AssertionError(f"the stream ended first: {[e['type'] for e in events]}")


def has(kind: str, name: str | None = None) -> Callable[[list[Event]], bool]:
    return lambda events: any(e["type"] == kind and (name is None or e.get("name") == name) for e in events)


def outcome(result: Any) -> str:
    terminal = result.terminal
    return terminal["type"] if terminal["type"] == "RUN_ERROR" else terminal["outcome"]["type"]


# ====================================================================== restarts
def test_a_restarted_demo_continues_its_conversation(demo: Callable[[], AdapterProcess], tmp_path: Path) -> None:
    adapter = demo()
    first = run_body("hello", cwd=str(tmp_path / "ws"))
    before = Client(adapter.url).run(first)
    assert outcome(before) == "success"
    assert adapter.stop() == 0  # Ctrl-C
    adapter = demo()
    again = run_body("[RECALL] what did I say?", thread_id=first["threadId"], cwd=str(tmp_path / "ws"))
    after = Client(adapter.url).run(again)
    assert outcome(after) == "success", after.terminal
    assert session_value(after)["sessionId"] == session_value(before)["sessionId"]
    assert "2 user turns" in after.text()


def test_a_kernel_that_forgot_the_session_costs_one_run(demo: Callable[[], AdapterProcess], tmp_path: Path) -> None:
    adapter = demo()
    first = run_body("hello", cwd=str(tmp_path / "ws"))
    assert outcome(Client(adapter.url).run(first)) == "success"
    adapter.stop()
    (tmp_path / "state" / "scripted-kernel" / "sessions.json").unlink()  # the kernel cannot keep it
    adapter = demo()
    client = Client(adapter.url)
    lost = client.run(run_body("hello again", thread_id=first["threadId"], cwd=str(tmp_path / "ws")))
    assert lost.terminal["type"] == "RUN_ERROR" and lost.terminal["code"] == "EXECUTION_LOST"
    assert "new session" in lost.terminal["message"]
    third = client.run(run_body("and again", thread_id=first["threadId"], cwd=str(tmp_path / "ws")))
    assert outcome(third) == "success", third.terminal


def test_an_interrupt_lost_with_its_kernel_is_retired(demo: Callable[[], AdapterProcess], tmp_path: Path) -> None:
    adapter = demo()
    body = run_body("[WRITE] make a file", cwd=str(tmp_path / "ws"), ros="inv-lost")
    interrupted = Client(adapter.url).run(body)
    [interrupt] = interrupted.terminal["outcome"]["interrupts"]
    adapter.kill()  # kill -9: the kernel child goes with it, and the task with the kernel
    adapter = demo()
    client = Client(adapter.url)
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    lost = client.run(resume(body, answer))
    assert lost.terminal["type"] == "RUN_ERROR" and lost.terminal["code"] == "EXECUTION_LOST"
    again = client.run(run_body("hello", thread_id=body["threadId"], cwd=str(tmp_path / "ws"), ros="inv-lost"))
    assert outcome(again) == "success", again.terminal  # not 409 RESUME_REQUIRED for 24 hours


def test_a_new_turn_on_an_interrupt_the_kernel_lost_starts_at_once(
    demo: Callable[[], AdapterProcess], tmp_path: Path
) -> None:
    adapter = demo()
    body = run_body("[WRITE] make a file", cwd=str(tmp_path / "ws"))
    assert outcome(Client(adapter.url).run(body)) == "interrupt"
    client = Client(adapter.url)
    busy = client.run(run_body("hello", thread_id=body["threadId"], cwd=str(tmp_path / "ws")))
    assert busy.status == 409 and busy.error and busy.error["code"] == "RESUME_REQUIRED"  # the kernel still has it
    adapter.kill()
    adapter = demo()
    again = Client(adapter.url).run(run_body("hello", thread_id=body["threadId"], cwd=str(tmp_path / "ws")))
    assert outcome(again) == "success", again.terminal


# ====================================================================== kill -9 at each write
def kill_after_admission(url: str, tmp_path: Path) -> tuple[dict[str, Any], list[Event]]:
    body = run_body("[SLOW] count", cwd=str(tmp_path / "ws"))
    return body, read_until(url, body, has("RUN_STARTED"))


def kill_after_task_known(url: str, tmp_path: Path) -> tuple[dict[str, Any], list[Event]]:
    body = run_body("[SLOW] count", cwd=str(tmp_path / "ws"))
    return body, read_until(url, body, has("CUSTOM", "iac-code.session.v1"))


def kill_after_interrupt(url: str, tmp_path: Path) -> tuple[dict[str, Any], list[Event]]:
    body = run_body("[WRITE] make a file", cwd=str(tmp_path / "ws"))
    return body, read_until(url, body, has("RUN_FINISHED"))


def kill_after_answer_accepted(url: str, tmp_path: Path) -> tuple[dict[str, Any], list[Event]]:
    body, events = kill_after_interrupt(url, tmp_path)
    [interrupt] = events[-1]["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    # the answer leaves the pending state on the first kernel frame, before any event of it
    return body, read_until(url, resume(body, answer), has("CUSTOM", "iac-code.session.v1"))


@pytest.mark.parametrize(
    "crash",
    [kill_after_admission, kill_after_task_known, kill_after_interrupt, kill_after_answer_accepted],
    ids=["after-admission", "after-task-id", "after-interrupt", "after-answer-accepted"],
)
def test_kill_9_at_each_write_then_the_next_turn(
    crash: Callable[[str, Path], tuple[dict[str, Any], list[Event]]],
    demo: Callable[[], AdapterProcess],
    tmp_path: Path,
) -> None:
    adapter = demo()
    body, _ = crash(adapter.url, tmp_path)
    adapter.kill()
    adapter = demo()
    client = Client(adapter.url)
    props = body["forwardedProps"]["iacCode"]
    after = client.run(run_body("[RECALL] hello", thread_id=body["threadId"], cwd=props["cwd"]))
    assert outcome(after) == "success", after.terminal
    following = client.run(run_body("hello", thread_id=body["threadId"], cwd=props["cwd"]))
    assert outcome(following) == "success", following.terminal


def test_an_interrupt_a_power_cut_took_from_the_records_comes_back_from_the_record_log(
    demo: Callable[[], AdapterProcess], tmp_path: Path
) -> None:
    adapter = demo()
    body = run_body("[WRITE] make a file", cwd=str(tmp_path / "ws"))
    events = read_until(adapter.url, body, has("RUN_FINISHED"))
    [interrupt] = events[-1]["outcome"]["interrupts"]
    assert adapter.proc is not None
    dead = str(adapter.proc.pid)
    adapter.kill()
    # The interrupt was announced once on disk: in the record log, synced in place, while the
    # record file was renamed into place unsynced. A power cut may lose that file; say it did.
    [record_file] = (tmp_path / "state" / "threads").glob("*.json")
    record_file.unlink()
    assert list((tmp_path / "state" / "record-log").glob("*.log"))
    adapter = demo()
    shown = requests.get(f"{adapter.url}threads/{body['threadId']}", timeout=10)
    assert shown.status_code == 200, shown.text
    thread = shown.json()
    assert [run["runId"] for run in thread["runs"]] == [body["runId"]]
    assert [p["id"] for p in thread["pendingInterrupts"]] == [interrupt["id"]]
    owners = {path.name.split("-")[0] for path in (tmp_path / "state" / "record-log").glob("*.log")}
    assert dead not in owners  # the dead process's log was read, then deleted


# ====================================================================== a kernel that outlives the adapter
def test_a_task_left_running_by_a_dead_adapter_is_adopted_and_the_cancel_extension_frees_the_thread(
    adapter_process: Any, scripted_kernel: Any, tmp_path: Path
) -> None:
    adapter = adapter_process()
    body = run_body("[SILENT 600] think for a long time", cwd=str(tmp_path / "ws"))
    events = read_until(adapter.url, body, has("CUSTOM", "iac-code.session.v1"))
    session = session_value_of(events)
    task_id = session["taskId"]
    adapter.kill()  # the kernel (not ours) keeps the task working
    assert kernel_task_state(scripted_kernel, task_id) == "TASK_STATE_WORKING"
    adapter = adapter_process()
    client = Client(adapter.url)
    # the new process adopted the run (issue 22): it holds the thread again
    busy = client.run(run_body("hello", thread_id=body["threadId"], cwd=str(tmp_path / "ws")))
    assert busy.status == 409 and busy.error is not None and busy.error["code"] == "THREAD_BUSY"
    started = time.monotonic()
    cancelled = client.cancel(session["executionId"], {"threadId": body["threadId"], "rosInvocationId": "inv-1"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    after = client.run(run_body("hello", thread_id=body["threadId"], cwd=str(tmp_path / "ws")))
    assert outcome(after) == "success", after.terminal  # not "Task is already working"
    assert task_id in [c["params"]["id"] for c in kernel_calls(scripted_kernel, "CancelTask")]
    assert kernel_task_state(scripted_kernel, task_id) == "TASK_STATE_CANCELED"
    assert time.monotonic() - started < 600 * 0.05  # it did not wait for the old task to end by itself


def session_value_of(events: list[Event]) -> dict[str, Any]:
    [event] = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.session.v1"]
    return dict(event["value"])


def kernel_task_state(kernel: Any, task_id: str) -> str:
    response = requests.post(
        kernel.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}},
        headers={"Authorization": f"Bearer {KERNEL_TOKEN}", "A2A-Version": "1.0"},
        timeout=10,
    )
    return str(response.json()["result"]["status"]["state"])
