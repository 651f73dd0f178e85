"""Reattach across adapter processes (issue 13): two ``python run.py`` on one state directory.

Deployments run several processes (gunicorn ``-w 4``, or two adapters behind one proxy) on
one ``--state-dir``, so a client's reattach may reach another process than the one running
its run. Here ``A`` and ``B`` are separate ``python run.py`` processes sharing one state
directory and the session's scripted kernel (``delay_scale`` 0.05: ``[SILENT 20]`` is one
second of kernel silence, ``[SLOW]`` ten deltas 0.05 s apart). Every run read in pieces is
joined on its ids (``joined``): exactly the events of one uninterrupted run.

What only processes can show: the journal written by A is replayed and followed by B; a
reader on B and one on A follow the run beside A's own client, each to its end; after
``kill -9`` of A, B adopts the run and its reader follows it to its end (issue 22); a reader
on B keeps A's detached run alive past the grace period, and once it leaves, A cancels the
kernel task when the grace period runs out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.agui_client import Client, LiveStream, joined, run_body
from tests.support.flow import KERNEL_TOKEN, cancelled_tasks, detached_runs, holds_for, wait_for


def pair(adapter_process: Any, *extra: str, kernel_url: str | None = None) -> tuple[Any, Any]:
    """Two adapter processes on the same state directory and kernel."""
    args = ("--heartbeat-seconds", "0.3", *extra)
    return adapter_process(*args, kernel_url=kernel_url), adapter_process(*args, kernel_url=kernel_url)


@pytest.fixture(scope="module")
def slow_kernel() -> Iterator[ScriptedKernel]:
    """A scripted kernel at full scale: ``[SLOW]`` is ten deltas one second apart."""
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=1.0)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.mark.parametrize("route", ["get", "post"])
def test_a_run_started_on_one_process_is_reattached_on_another(
    adapter_process: Any, scripted_kernel: Any, workspace: Path, route: str
) -> None:
    a, b = pair(adapter_process, "--disconnect-grace-seconds", "10")
    body = run_body("[SILENT 20] [TOOL] [SLOW] go", cwd=str(workspace), llmApiKey="sk-reattach-processes-secret")
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(2)
    first.close()
    other = Client(b.url)
    again = other.reattach(body, seen[-1][0]) if route == "post" else other.events(body["threadId"], body["runId"], 2)
    assert again.status == 200, again.response.text
    rest = again.rest()
    assert rest[0][0] == (seen[-1][0] if route == "post" else 2) + 1
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert [e["type"] for e in events].count("TOOL_CALL_START") == 1
    assert len([e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]) >= 10
    assert task_id not in cancelled_tasks(scripted_kernel)
    # the run ended on A; B replays it whole, from the first event, to the same terminal event
    assert [e for _, e in other.events(body["threadId"], body["runId"]).rest()] == events
    assert b"reattached after event" in b.log and b"reattached after event" not in a.log


def test_readers_on_both_processes_follow_a_run_beside_its_own_client(adapter_process: Any, workspace: Path) -> None:
    a, b = pair(adapter_process, "--disconnect-grace-seconds", "10")
    body = run_body("[SILENT 40] [SLOW] go", cwd=str(workspace))
    own = LiveStream(Client(a.url), body)  # the run's own client, on A, still reading
    seen = own.read_events(2)
    on_b = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0])
    b_seen = on_b.read_events(0)
    on_a = Client(a.url).reattach(body, 1)
    own_rest, b_rest, a_rest = own.rest(), on_b.rest(), on_a.rest()  # none ends another
    events = joined(own_rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert len([e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]) >= 10
    assert joined(seen, b_seen, b_rest) == events == joined(own_rest[:1], a_rest)
    assert b"took the run over" not in a.log


@pytest.mark.parametrize("moment", ["silent", "mid-message"])
def test_kill_9_of_the_running_process_and_the_other_process_reader_adopts_the_run(
    adapter_process: Any, slow_kernel: ScriptedKernel, workspace: Path, moment: str
) -> None:
    # "silent": killed while the kernel is silent, no span open; "mid-message": killed while a
    # text message is open (the slow kernel's deltas come one second apart). The kernel still
    # runs the task: B, whose reader sees A's journal lose its writer, adopts the run
    # (issue 22) and its reader follows it to its end.
    a, b = pair(adapter_process, "--disconnect-grace-seconds", "10", kernel_url=slow_kernel.url)
    body = run_body("[SILENT 3] wait" if moment == "silent" else "[SLOW] go", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    first.session()
    if moment == "mid-message":
        first.read_until(b'"TEXT_MESSAGE_CONTENT"')
    seen = first.read_events(1)
    first.close()
    reader = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0])
    b_seen = reader.read_events(0)
    a.kill()
    rest = reader.rest()  # ends: nothing hangs
    events = joined(seen, b_seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]
    assert b"adopted after event" in b.log
    # a reattach after the end: replayed, and the EventSource that has it all gets 204
    again = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest()
    assert joined(seen, again) == events
    done = Client(b.url).events(body["threadId"], body["runId"], again[-1][0])
    assert done.status == 204 and done.rest() == []
    # and the thread is free again
    nxt = Client(b.url).run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert nxt.terminal["type"] == "RUN_FINISHED"


def test_a_reader_on_another_process_keeps_the_run_alive_and_grace_runs_out_after_it_left(
    adapter_process: Any, scripted_kernel: Any, workspace: Path
) -> None:
    a, b = pair(adapter_process, "--disconnect-grace-seconds", "1")
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(2)
    first.close()
    wait_for(lambda: detached_runs(a.url) == 1, 10)  # the run goes on detached on A
    reader = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0])
    b_seen = reader.read_events(0)
    # twice the grace period, with a reader attached on B: never cancelled meanwhile
    assert holds_for(lambda: task_id not in cancelled_tasks(scripted_kernel), 2.0)
    reader.close()
    left = time.monotonic()
    wait_for(lambda: task_id in cancelled_tasks(scripted_kernel), 10)
    assert time.monotonic() - left >= 0.9  # the grace period, counted from the reader leaving
    assert b"nobody reattached within 1s" in a.log
    rest = Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, b_seen, rest)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    assert "reattached" in events[-1]["message"]


def test_grace_expiry_on_one_process_while_nobody_reattaches_cancels_the_kernel_task(
    adapter_process: Any, scripted_kernel: Any, workspace: Path
) -> None:
    a, b = pair(adapter_process, "--disconnect-grace-seconds", "1")
    body = run_body("[SILENT 400] wait", cwd=str(workspace))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(2)
    first.close()
    left = time.monotonic()
    wait_for(lambda: task_id in cancelled_tasks(scripted_kernel), 10)
    assert time.monotonic() - left >= 0.9
    # the thread is free again, from either process; B replays the cancelled run to its end
    events = joined(seen, Client(b.url).events(body["threadId"], body["runId"], seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    nxt = Client(b.url).run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert nxt.terminal["type"] == "RUN_FINISHED"
