"""Graceful shutdown of ``python run.py`` (issue 10): real processes, real SIGTERM.

Open runs get the grace period to end on their own; the others end with a final
``RUN_ERROR CANCELLED`` (every span closed) and their kernel tasks are cancelled; the
process exits within the grace period plus 5 s, with no kernel child left behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import requests

from tests.support.agui_client import Client, LiveStream, run_body
from tests.support.flow import kernel_calls
from tests.support.processes import alive, descendants
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS
from tests.support.servers import AdapterProcess


def sigterm_and_wait(adapter: AdapterProcess, limit: float) -> float:
    assert adapter.proc is not None
    started = time.monotonic()
    adapter.proc.send_signal(signal.SIGTERM)
    adapter.proc.wait(limit)
    return time.monotonic() - started


def test_sigterm_ends_open_runs_with_a_final_event_and_cancels_their_tasks(
    adapter_process: Any, scripted_kernel: Any, tmp_path: Path
) -> None:
    adapter = adapter_process("--shutdown-grace-seconds", "1", "--on-shutdown", "cancel")  # handover: test_adoption
    silent = LiveStream(Client(adapter.url), run_body("[SILENT 600] think", cwd=str(tmp_path / "a")))
    talking = LiveStream(Client(adapter.url), run_body("[THINK] [SILENT 300] ponder", cwd=str(tmp_path / "b")))
    tasks = [silent.session()["taskId"], talking.session()["taskId"]]
    elapsed = sigterm_and_wait(adapter, 1 + 5)
    assert adapter.proc is not None and adapter.proc.returncode == 0
    assert elapsed < 1 + 5
    for run in (silent, talking):
        events = run.finish()
        assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED", events[-1]
        assert "shutting down" in events[-1]["message"]
    cancelled = {c["params"]["id"] for c in kernel_calls(scripted_kernel, "CancelTask")}
    assert set(tasks) <= cancelled
    assert b"ended 2 open run(s) at shutdown" in adapter.log


def test_a_run_that_ends_within_the_grace_period_finishes_normally(adapter_process: Any, tmp_path: Path) -> None:
    adapter = adapter_process("--shutdown-grace-seconds", "5")
    run = LiveStream(Client(adapter.url), run_body("[SLOW] count", cwd=str(tmp_path / "a")))
    run.session()
    sigterm_and_wait(adapter, 5 + 5)
    events = run.finish()
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    try:  # no new connection is accepted once the signal arrived
        requests.get(adapter.url + "health", timeout=2)
        raise AssertionError("the adapter still accepts connections")
    except requests.ConnectionError:
        pass


def test_sigterm_with_its_own_kernel_leaves_no_process(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    environ.update({"IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path), "PYTHONUNBUFFERED": "1"})
    state = tmp_path / "state"
    args = ["--port", "0", "--kernel", "scripted", "--state-dir", str(state), "--shutdown-grace-seconds", "1"]
    adapter = AdapterProcess(args, environ).start()
    STATE_DIRS.append(state)
    ADAPTER_LOGS.append(adapter)
    assert adapter.proc is not None
    children = descendants(adapter.proc.pid)
    assert children, "no kernel child found"
    run = LiveStream(Client(adapter.url), run_body("[SILENT 600] think", cwd=str(tmp_path / "ws")))
    run.session()
    sigterm_and_wait(adapter, 1 + 5)
    events = run.finish()
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)]
