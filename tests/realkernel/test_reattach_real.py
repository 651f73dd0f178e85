"""Reattach (issue 13) in front of the real iac-code 0.16.0 kernel.

Two ``python run.py`` adapters on one state directory in front of one real kernel: ``steady``
(``--disconnect-grace-seconds 30``) and ``other`` (the same, a second process), plus
``impatient`` (grace 1 s) for the expiry. The fake LLM streams ``[SLOW]`` as twenty chunks
0.25 s apart (five seconds of text) and ``[WRITE] [SLOW]`` as a ``write_file`` call whose
chunks come 0.25 s apart, so a client can leave at a chosen point of a real run.

A client leaves a run at a point (before the first text delta, inside a tool call, just
before the terminal event, after the end) and comes back by ``GET .../events`` (on the same
process) or ``POST /`` with ``Last-Event-ID`` (on the other process): the pieces joined on
their ids are exactly one valid run (``joined``, which also records it for the official
client), and the kernel task was never cancelled. Nobody back within the grace period: the
real kernel's task is ``TASK_STATE_CANCELED`` (``GetTask``). A real ``selling`` pipeline left
in the middle of a step goes on detached and is reattached to its candidate-selection
interrupt, every pipeline event of the kernel's journal delivered once, and the interrupt
answers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES, is_pending_publication
from tests.support.agui_client import Client, LiveStream, joined, run_body
from tests.support.fake_llm import FakeLLM
from tests.support.flow import wait_for
from tests.support.servers import AdapterProcess

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
PIPELINE = "iac-code.pipeline.v1"


# ============================================================================ fixtures
@pytest.fixture(scope="module")
def real_kernel() -> Iterator[RealKernel]:
    """This module's kernel: a fake LLM whose ``[SLOW]`` lasts five seconds."""
    kernel = RealKernel(require_kernel_venv(), slow_interval=SLOW_INTERVAL)
    kernel.llm = FakeLLM(kernel.llm_log_path, slow_interval=SLOW_INTERVAL, slow_chunks=SLOW_CHUNKS)
    with kernel:
        yield kernel


@pytest.fixture(scope="module")
def steady(adapters: Adapters) -> AdapterProcess:
    return adapters.start("--disconnect-grace-seconds", "30")


@pytest.fixture(scope="module")
def other(adapters: Adapters, steady: AdapterProcess) -> AdapterProcess:
    """A second process on the same state directory."""
    return adapters.start("--disconnect-grace-seconds", "30")


@pytest.fixture(scope="module")
def impatient(adapters: Adapters) -> AdapterProcess:
    return adapters.start("--disconnect-grace-seconds", "1")


# ============================================================================ helpers
def ids_of(kind: str, pairs: list[tuple[int, dict[str, Any]]]) -> list[int]:
    return [i for i, e in pairs if e["type"] == kind]


def reattach(route: str, steady: AdapterProcess, other: AdapterProcess, body: dict[str, Any], after: int) -> Any:
    """``get``: GET .../events on the run's own process; ``post``: POST / on the other one."""
    if route == "get":
        return Client(steady.url).events(body["threadId"], body["runId"], after)
    return Client(other.url).reattach(body, after)


# ============================================================================ tests
@pytest.mark.parametrize("route", ["get", "post"])
@pytest.mark.parametrize("point", ["before-first-delta", "in-tool-call", "before-terminal", "after-end"])
def test_a_client_that_left_a_real_run_reattaches_and_gets_exactly_the_rest(
    steady: AdapterProcess, other: AdapterProcess, real_kernel: RealKernel, ws: Path, tag: str, route: str, point: str
) -> None:
    text = "[WRITE] [SLOW] please write the file" if point == "in-tool-call" else "[SLOW] count slowly"
    body = run_body(f"{text} {tag}", thread_id=thread_id("reattach"), cwd=str(ws))
    first = LiveStream(Client(steady.url), body)
    task_id = first.session()["taskId"]
    # what the client had when it left: a chunk may hold more, the client saw no more than this
    if point == "before-first-delta":
        first.read_until(b'"TEXT_MESSAGE_CONTENT"')
        pairs = first.read_events(1)
        seen = pairs[: ids_of("TEXT_MESSAGE_CONTENT", pairs)[0] - pairs[0][0]]
    elif point == "in-tool-call":
        first.read_until(b'"TOOL_CALL_START"')
        pairs = first.read_events(1)
        seen = pairs[: ids_of("TOOL_CALL_START", pairs)[0] - pairs[0][0] + 1]
    elif point == "before-terminal":
        first.read_until(b'"TEXT_MESSAGE_END"')
        seen = [p for p in first.read_events(1) if p[1]["type"] not in ("RUN_FINISHED", "RUN_ERROR")]
    else:
        seen = first.rest()
        assert seen[-1][1]["type"] == "RUN_FINISHED"
    first.close()
    last = seen[-1][0]
    again = reattach(route, steady, other, body, last)
    if point == "after-end" and route == "get":  # all of an ended run: 204, an EventSource stops
        assert again.status == 204, again.response.text
    else:
        assert again.status == 200, again.response.text
    rest = again.rest()
    if point == "after-end":
        assert rest == []
        rest = reattach(route, steady, other, body, last // 2).rest()  # the middle of an ended run
        assert rest == seen[last // 2 :]
    else:
        assert rest and rest[0][0] == last + 1
    if point == "before-first-delta":
        assert not ids_of("TEXT_MESSAGE_CONTENT", seen) and ids_of("TEXT_MESSAGE_CONTENT", rest)
    elif point == "in-tool-call":  # left with the tool call open: its end comes on the reattach
        assert ids_of("TOOL_CALL_START", seen) and ids_of("TOOL_CALL_END", rest)
    events = joined(seen, rest)
    terminal = events[-1]
    assert terminal["type"] == "RUN_FINISHED", terminal
    if point == "in-tool-call":
        assert terminal["outcome"]["type"] == "interrupt"
        [interrupt] = terminal["outcome"]["interrupts"]
        assert interrupt["metadata"]["toolName"] == "write_file"
        assert [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"] == ["write_file"]
    else:
        assert terminal["outcome"] == {"type": "success"}
        deltas = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert deltas == "".join(f"Chunk {i + 1}. " for i in range(SLOW_CHUNKS))
    # never cancelled: a turn's end state (the permission wait, or the end of a normal turn)
    assert get_task(real_kernel, task_id)["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    # from the first event, on either process: the whole run
    assert [e for _, e in Client(other.url).events(body["threadId"], body["runId"]).rest()] == events


def test_nobody_reattaching_within_the_grace_period_cancels_the_real_task(
    impatient: AdapterProcess, other: AdapterProcess, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    body = run_body(f"[SLOW] count slowly {tag}", thread_id=thread_id("grace"), cwd=str(ws))
    first = LiveStream(Client(impatient.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b'"TEXT_MESSAGE_CONTENT"')
    seen = first.read_events(1)
    first.close()
    left = time.monotonic()
    assert wait_task_state(real_kernel, task_id, "TASK_STATE_CANCELED", timeout=15) == "TASK_STATE_CANCELED"
    waited = time.monotonic() - left
    assert waited >= 0.9, waited  # not at once: the grace period first
    assert waited < SLOW_CHUNKS * SLOW_INTERVAL  # before the LLM's text was over
    assert b"nobody reattached within 1s" in impatient.log
    # the journal holds the end: replayed by the other process
    events = joined(seen, Client(other.url).events(body["threadId"], body["runId"], seen[-1][0]).rest())
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    deltas = [e for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert 0 < len(deltas) < SLOW_CHUNKS
    assert get_task(real_kernel, task_id)["status"]["state"] == "TASK_STATE_CANCELED"
    # the thread goes on
    nxt = Client(impatient.url).run(run_body(f"hello again {tag}", thread_id=body["threadId"], cwd=str(ws)))
    assert nxt.terminal["type"] == "RUN_FINISHED"


def test_a_pipeline_left_mid_step_goes_on_detached_and_is_reattached_to_its_interrupt(
    steady: AdapterProcess, other: AdapterProcess, real_kernel: RealKernel, ws: Path, tag: str
) -> None:
    body = run_body(
        f"[PIPE-SELL] [PIPE-SLOW] a small website {tag}",
        thread_id=thread_id("sell"),
        cwd=str(ws),
        runMode="pipeline",
        pipelineName="selling",
        candidatePresentation="rich",
    )
    first = LiveStream(Client(steady.url), body)
    task_id = first.session()["taskId"]
    first.read_until(b'"stepName":"architecture_planning"')
    pairs = first.read_events(1)
    seen = pairs[: ids_of("STEP_STARTED", pairs)[-1] - pairs[0][0] + 1]  # left inside the step
    assert (seen[-1][1]["type"], seen[-1][1]["stepName"]) == ("STEP_STARTED", "architecture_planning")
    first.close()

    def planned() -> bool:
        done = [e for e in journal(real_kernel, task_id) if e["eventType"] == "step_completed"]
        return any((e.get("step") or {}).get("id") == "architecture_planning" for e in done)

    wait_for(planned, 60)  # the pipeline goes on, nobody attached: the step it was left in completes
    again = Client(other.url).events(body["threadId"], body["runId"], seen[-1][0])
    rest = again.rest()
    events = joined(seen, rest)
    terminal = events[-1]
    assert terminal["type"] == "RUN_FINISHED" and terminal["outcome"]["type"] == "interrupt", terminal
    [selection] = terminal["outcome"]["interrupts"]
    assert selection["metadata"]["kind"] == "candidate_selection"
    started = [e["stepName"] for e in events if e["type"] == "STEP_STARTED"]
    assert [s for s in started if not s.startswith("candidate:")] == [
        "intent_parsing",
        "architecture_planning",
        "evaluate_candidates",
        "confirm_and_select",
    ]
    # every allowlisted event of the kernel's own pipeline journal reached the joined stream, once
    delivered = [e["value"]["eventId"] for e in events if e["type"] == "CUSTOM" and e["name"] == PIPELINE]
    assert len(delivered) == len(set(delivered))
    wanted = {
        e["eventId"]
        for e in journal(real_kernel, task_id)
        if e["eventType"] in CUSTOM_EVENT_TYPES and not is_pending_publication(e)
    }
    assert set(delivered) == wanted
    # the interrupt reached while detached is on disk: the other process answers it
    answer = select_candidate(body, selection)
    done = Client(other.url).run(answer)
    assert done.terminal["type"] == "RUN_FINISHED" and done.terminal["outcome"] == {"type": "success"}
    assert "deploying" in [e["stepName"] for e in done.of("STEP_FINISHED")]
