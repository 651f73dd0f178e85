"""No dead ends, against the real iac-code 0.16.0 kernel (issue 9, cases 2 and 4).

Real processes and real signals: the adapter is killed with SIGKILL at the moments that
used to leave a thread stuck, started again on the same state directory, and the next
requests on the thread must get through.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agui_client import Client, LiveStream, resume, run_body
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS
from tests.support.servers import AdapterProcess

from .harness import RealKernel


@pytest.fixture
def start_adapter(real_kernel: RealKernel, tmp_path: Path) -> Iterator[Any]:
    started: list[AdapterProcess] = []

    def start(*, spawn: bool) -> AdapterProcess:
        """``run.py`` in front of the module's kernel, or spawning a real kernel of its own."""
        env = real_kernel.environment()
        env["IAC_CODE_AGUI_ALLOWED_CWDS"] = str(real_kernel.workdir)
        env["PYTHONUNBUFFERED"] = "1"
        args = ["--port", "0", "--state-dir", str(tmp_path / "state")]
        if spawn:
            env.pop("IACCODE_A2A_HTTP_TOKEN", None)  # the adapter makes its own
            env["PATH"] = f"{real_kernel.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
            args += ["--kernel", "iac-code"]
        else:
            args += ["--a2a-url", real_kernel.url, "--a2a-token", real_kernel.token]
        process = AdapterProcess(args, env).start(timeout=90)
        STATE_DIRS.append(tmp_path / "state")
        ADAPTER_LOGS.append(process)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def task_state(kernel: RealKernel, task_id: str) -> str:
    response = kernel.rpc("GetTask", {"id": task_id})
    return str(response["result"]["status"]["state"])


def test_an_interrupt_across_a_kill_9_of_adapter_and_its_kernel(start_adapter: Any, real_kernel: RealKernel) -> None:
    ws = real_kernel.workdir / f"ws-lost-{uuid.uuid4().hex[:6]}"
    adapter = start_adapter(spawn=True)
    body = run_body("[WRITE] please write the file", cwd=str(ws), ros="inv-kill")
    interrupted = Client(adapter.url).run(body)
    [interrupt] = interrupted.terminal["outcome"]["interrupts"]
    adapter.kill()  # its kernel goes with it (the lifeline)
    adapter = start_adapter(spawn=True)
    client = Client(adapter.url)
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    answered = client.run(resume(body, answer))
    # the real kernel keeps tasks on disk, so the answer may still work; if it cannot, the
    # interrupt is retired with EXECUTION_LOST: either way the thread is not stuck
    terminal = answered.terminal
    assert terminal["type"] == "RUN_FINISHED" or terminal["code"] == "EXECUTION_LOST", terminal
    again = client.run(run_body("Say hello", thread_id=body["threadId"], cwd=str(ws), ros="inv-kill"))
    assert again.terminal["type"] == "RUN_FINISHED", again.terminal


def test_a_turn_cut_by_a_kill_9_does_not_block_the_next(start_adapter: Any, real_kernel: RealKernel) -> None:
    ws = real_kernel.workdir / f"ws-stale-{uuid.uuid4().hex[:6]}"
    adapter = start_adapter(spawn=False)  # the kernel outlives the adapter
    body = run_body("[SLOW] count slowly", cwd=str(ws))
    live = LiveStream(Client(adapter.url), body)
    session = live.session()
    adapter.kill()
    assert task_state(real_kernel, session["taskId"]) == "TASK_STATE_WORKING"
    adapter = start_adapter(spawn=False)
    client = Client(adapter.url)
    # the new process adopted the cut run (issue 22): it holds the thread until it ends or is
    # cancelled; the cancel extension frees the thread at once
    busy = client.run(run_body("Say hello", thread_id=body["threadId"], cwd=str(ws)))
    assert busy.status == 409 and busy.error is not None and busy.error["code"] == "THREAD_BUSY", busy
    started = time.monotonic()
    ids = {"threadId": body["threadId"], "rosInvocationId": "inv-1"}
    assert client.cancel(session["executionId"], ids).json()["status"] == "cancelled"
    after = client.run(run_body("Say hello", thread_id=body["threadId"], cwd=str(ws)))
    assert after.terminal["type"] == "RUN_FINISHED", after.terminal  # not "Task is already working"
    assert task_state(real_kernel, session["taskId"]) == "TASK_STATE_CANCELED"
    assert time.monotonic() - started < 30
