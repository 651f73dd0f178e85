"""A restart or crash of the adapter never costs a run (issue 22), in front of the real kernel.

``python run.py`` processes on one state directory in front of the real iac-code 0.16.0 kernel
(it outlives them). A process is killed (``kill -9``) or stopped (SIGTERM, ``--on-shutdown
handover``, the default with ``--a2a-url``) in the middle of a run: a slow streaming turn, a
tool call, a ``selling`` pipeline in the middle of a step, a turn that reaches a permission
while no adapter process is alive. A new process on the same state directory adopts the run
(``agui_adapter/run/adoption.py``); the client comes back with ``Last-Event-ID`` by either route and
its pieces, joined on their ids, are one valid run (``joined``; the official client's verdict
too), whose text is the kernel's final message. The time from the new process being ready to
the client's next event is printed (``-s``).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES
from tests.support.agui_client import Client, LiveStream, joined, run_body
from tests.support.fake_llm import FakeLLM

from .harness import (
    Adapters,
    RealKernel,
    get_task,
    journal,
    require_kernel_venv,
    select_candidate,
    thread_id,
    wait_task_state,
)

SLOW_INTERVAL = 0.25
SLOW_CHUNKS = 20
SLOW_TEXT = "".join(f"Chunk {i + 1}. " for i in range(SLOW_CHUNKS))
PIPELINE = "iac-code.pipeline.v1"


@pytest.fixture(scope="module")
def real_kernel() -> Iterator[RealKernel]:
    """This module's kernel: a fake LLM whose ``[SLOW]`` lasts five seconds."""
    kernel = RealKernel(require_kernel_venv(), slow_interval=SLOW_INTERVAL)
    kernel.llm = FakeLLM(kernel.llm_log_path, slow_interval=SLOW_INTERVAL, slow_chunks=SLOW_CHUNKS)
    with kernel:
        yield kernel


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def come_back(route: str, url: str, body: dict[str, Any], after: int) -> LiveStream:
    client = Client(url)
    stream = client.reattach(body, after) if route == "post" else client.events(body["threadId"], body["runId"], after)
    assert stream.status == 200, stream.response.text
    return stream


def timed_rest(stream: LiveStream, ready: float) -> tuple[list[tuple[int, dict[str, Any]]], float]:
    first = stream.read_events(1)
    latency = time.monotonic() - ready
    return first + stream.rest()[len(first) :], latency


@pytest.mark.parametrize("route", ["get", "post"])
def test_kill_9_in_a_slow_streaming_turn_then_a_new_process_adopts_it(
    adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str, route: str
) -> None:
    a = adapters.start()
    body = run_body(f"[SLOW] count {tag}", thread_id=thread_id("adopt-slow"), cwd=str(ws))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b"Chunk 3. ")
    seen = first.read_events(1)
    a.kill()  # mid-message; the kernel goes on meanwhile
    time.sleep(1.0)
    b = adapters.start()
    ready = time.monotonic()
    rest, latency = timed_rest(come_back(route, b.url, body, seen[-1][0]), ready)
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert text_of(events) == SLOW_TEXT  # the kernel's final message
    final = get_task(real_kernel, task_id)["history"][-1]["parts"][0]["text"]
    assert final == SLOW_TEXT
    assert get_task(real_kernel, task_id)["status"]["state"] != "TASK_STATE_CANCELED"
    print(f"\nreal kernel, {route}: first event {latency:.3f} s after the new process was ready")
    official(events)


def official(events: list[dict[str, Any]]) -> None:
    """The official @ag-ui/client's verdict on the joined run: 0 errors."""
    from agui_adapter.protocol.events import encode_many
    from tests.support.agui_check.official import check_streams, require_official_client

    require_official_client()
    verdict = check_streams([encode_many(events, 1)])
    assert verdict.ok, verdict.output


def test_kill_9_inside_a_tool_call_then_the_adopter_commits_its_permission(
    adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    a = adapters.start()
    body = run_body(f"[WRITE] [SLOW] write it {tag}", thread_id=thread_id("adopt-tool"), cwd=str(ws))
    first = LiveStream(Client(a.url), body)
    first.session()
    first.read_until(b"TOOL_CALL_START")
    seen = first.read_events(1)
    a.kill()
    b = adapters.start()
    events = joined(seen, come_back("get", b.url, body, seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"]["type"] == "interrupt", events[-1]
    assert [e["type"] for e in events].count("TOOL_CALL_END") == 1
    [interrupt] = events[-1]["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    done = Client(b.url).run(run_body(None, thread_id=body["threadId"], cwd=str(ws), resume=answer))
    assert done.terminal["type"] == "RUN_FINISHED", done.terminal
    assert (ws / "hello.txt").exists()


def test_a_permission_reached_while_no_adapter_is_alive_is_adopted_at_start_up(
    real_kernel: RealKernel, ws: Path, tag: str, tmp_path: Path
) -> None:
    (tmp_path / "outside").mkdir()
    adapters = Adapters(real_kernel, tmp_path, tmp_path / "outside")  # a state dir no other process scans
    a = adapters.start()
    body = run_body(f"[WRITE] [SLOW] write it {tag}", thread_id=thread_id("adopt-unattended"), cwd=str(ws))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(1)
    a.kill()
    assert wait_task_state(real_kernel, task_id, "TASK_STATE_INPUT_REQUIRED") == "TASK_STATE_INPUT_REQUIRED"
    b = adapters.start()  # nobody asks: the start-up scan adopts it and commits the permission
    deadline = time.monotonic() + 30
    while b"adopted after event" not in b.log:
        assert time.monotonic() < deadline, b.log.decode()
        time.sleep(0.1)
    events = joined(seen, come_back("post", b.url, body, seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"]["type"] == "interrupt", events[-1]
    assert text_of(events) == "I will write the file now."
    [interrupt] = events[-1]["outcome"]["interrupts"]
    assert interrupt["metadata"]["toolName"] == "write_file"
    # the tool call the kernel streamed while no adapter was alive, from its conversation
    calls = [e for e in events if e["type"].startswith("TOOL_CALL")]
    assert [e["type"] for e in calls] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"], calls
    assert {e["toolCallId"] for e in calls} == {interrupt["toolCallId"]}
    assert calls[0]["toolCallName"] == "write_file" and json.loads(calls[1]["delta"])["path"] == "hello.txt"
    official(events)
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    try:
        done = Client(b.url).run(run_body(None, thread_id=body["threadId"], cwd=str(ws), resume=answer))
        assert done.terminal["type"] == "RUN_FINISHED", done.terminal
        assert (ws / "hello.txt").exists()
    finally:
        adapters.stop_all()


def test_sigterm_hands_a_slow_turn_over_to_the_next_process(
    adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    a = adapters.start("--shutdown-grace-seconds", "0.5")
    body = run_body(f"[SLOW] count {tag}", thread_id=thread_id("adopt-handover"), cwd=str(ws))
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b"Chunk 2. ")
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    seen = first.rest()  # closed without a terminal event: the client reattaches
    assert seen[-1][1]["type"] not in ("RUN_FINISHED", "RUN_ERROR")
    assert a.proc.wait(15) == 0 and b"handed over" in a.log
    b = adapters.start()
    events = joined(seen, come_back("get", b.url, body, seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_FINISHED" and text_of(events) == SLOW_TEXT
    assert get_task(real_kernel, task_id)["status"]["state"] != "TASK_STATE_CANCELED"
    official(events)


def test_kill_9_in_the_middle_of_a_pipeline_step(
    adapters: Adapters, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    a = adapters.start()
    body = run_body(
        f"[PIPE-SELL] [PIPE-SLOW] a small website {tag}",
        thread_id=thread_id("adopt-sell"),
        cwd=str(ws),
        runMode="pipeline",
        pipelineName="selling",
        candidatePresentation="rich",
    )
    first = LiveStream(Client(a.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b'"stepName":"architecture_planning"')
    seen = first.read_events(1)
    a.kill()
    time.sleep(1.0)  # the pipeline goes on with no adapter alive
    b = adapters.start()
    events = joined(seen, come_back("get", b.url, body, seen[-1][0]).rest())
    terminal = events[-1]
    assert terminal["type"] == "RUN_FINISHED" and terminal["outcome"]["type"] == "interrupt", terminal
    [selection] = terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection"
    # every allowlisted event of the kernel's own pipeline journal reached the joined stream, once
    delivered = [e["value"]["eventId"] for e in events if e["type"] == "CUSTOM" and e["name"] == PIPELINE]
    assert len(delivered) == len(set(delivered))
    wanted = {e["eventId"] for e in journal(real_kernel, task_id) if e["eventType"] in CUSTOM_EVENT_TYPES}
    assert set(delivered) == wanted
    official(events)
    answer = select_candidate(body, selection)
    done = Client(b.url).run(answer)
    assert done.terminal["type"] == "RUN_FINISHED" and done.terminal["outcome"] == {"type": "success"}


def test_an_artifact_made_while_no_adapter_is_alive_reaches_the_reattached_client_once(
    tmp_path: Path, tag: str
) -> None:
    """A kernel that approves permissions itself (``auto_approve_permissions``, its ``--config``)
    runs ``write_file`` after the adapter was killed: the artifact is only in the task's
    snapshot (``tests/data/a2a-subscribe/`` 10-13), and the adopter sends it, once."""
    config = tmp_path / "a2a.yaml"
    config.write_text("auto_approve_permissions: true\n")
    with RealKernel(require_kernel_venv(), slow_interval=SLOW_INTERVAL, extra_args=["--config", str(config)]) as kernel:
        (tmp_path / "outside").mkdir()
        adapters = Adapters(kernel, tmp_path, tmp_path / "outside")
        try:
            ws = kernel.workdir / "ws-artifact"
            a = adapters.start()
            prompt = f"[WRITE] [SLOW] [SLOW-AFTER] write it {tag}"
            body = run_body(prompt, thread_id=thread_id("adopt-art"), cwd=str(ws))
            first = LiveStream(Client(a.url), body)
            task_id = first.session()["taskId"]
            seen = first.read_events(1)
            a.kill()  # before the tool call: the kernel writes the file with no adapter alive
            deadline = time.monotonic() + 30
            while not get_task(kernel, task_id).get("artifacts"):
                assert time.monotonic() < deadline, get_task(kernel, task_id)
                time.sleep(0.1)
            [made] = get_task(kernel, task_id)["artifacts"]
            b = adapters.start()
            events = joined(seen, come_back("get", b.url, body, seen[-1][0]).rest())
            assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, events[-1]
            artifacts = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.artifact.v1"]
            assert [e["value"]["artifactId"] for e in artifacts] == [made["artifactId"]]
            value = artifacts[0]["value"]
            assert value["name"] == "hello.txt" and value["parts"][0]["metadata"]["byteSize"] == 24
            assert [e["type"] for e in events].count("TOOL_CALL_RESULT") == 1
            assert "Tool finished. Result: " in text_of(events)
            official(events)
        finally:
            adapters.stop_all()
