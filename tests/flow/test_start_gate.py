"""The start gate over a real socket: a run's turn to start is given back with its
``RUN_STARTED`` or its refusal, whatever comes after, and starts beyond the gate's slots
wait their turn and all complete."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agui_adapter.ops.start_gate import STARTS
from tests.flow.test_max_runs import open_stream
from tests.support.agui_client import run_body
from tests.support.flow import wait_for


def gate_free() -> bool:
    return STARTS.taken() == 0


def test_a_start_gives_its_turn_back_however_it_ends(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.2)
    client = adapter.client()
    body = run_body(cwd=str(workspace))
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    wait_for(gate_free)
    assert client.run(body).error["code"] == "DUPLICATE_RUN_ID"  # refused in its admission
    wait_for(gate_free)
    assert client.run(run_body(None, cwd=str(workspace), resume=[])).status == 409  # EXECUTION_LOST
    wait_for(gate_free)
    holding = run_body("[SILENT 400] hold", cwd=str(workspace))
    held = open_stream(adapter, holding)
    try:
        wait_for(gate_free)  # the run goes on; its start is made
        busy = client.run(run_body(cwd=str(workspace), thread_id=holding["threadId"]))
        assert busy.error["code"] == "THREAD_BUSY"
        wait_for(gate_free)
    finally:
        held.close()
    wait_for(gate_free)


def test_more_starts_than_slots_at_once_all_complete(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    count = 4 * STARTS.slots + 1
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def start(i: int) -> None:
        body = run_body(f"start {i}", cwd=str(workspace))
        barrier.wait(30)
        results[i] = adapter.client().run(body)  # a connection of its own

    threads = [threading.Thread(target=start, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r.terminal["type"] for r in results] == ["RUN_FINISHED"] * count
    wait_for(gate_free)
