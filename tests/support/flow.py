"""What the flow tests against the scripted kernel share.

``KERNEL_TOKEN`` is the bearer token of the session's scripted kernel (the ``scripted_kernel``
fixture); ``kernel_calls`` reads that kernel's request log (``cancelled_tasks``: the tasks it
was asked to cancel); ``interrupted`` runs a turn that the scripted kernel ends with a
permission interrupt (its ``[WRITE]`` script); ``detached_runs`` reads ``agui_runs_detached``
(a run that went on without its client); ``wait_for`` polls a condition; ``FakeClock``
is a wall clock a test moves forward (interrupt expiry without waiting).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tests.support.agui_client import Client, run_body

KERNEL_TOKEN = "scripted-kernel-token"


def kernel_calls(kernel: Any, method: str, context_id: str | None = None) -> list[dict]:
    calls = [r for r in list(kernel.requests) if r["method"] == method]
    if context_id is not None:
        calls = [c for c in calls if c["params"].get("message", {}).get("contextId") == context_id]
    return calls


def interrupted(client: Client, workspace: Path, text: str = "[WRITE] make a file", **kw: Any) -> tuple[dict, Any]:
    body = run_body(text, cwd=str(workspace), **kw)
    result = client.run(body)
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.terminal["outcome"]["type"] == "interrupt"
    return body, result


def cancelled_tasks(kernel: Any) -> set[str]:
    """The task ids the adapter asked the kernel to cancel."""
    return {c["params"]["id"] for c in kernel_calls(kernel, "CancelTask")}


def detached_runs(url: str, token: str | None = None) -> float:
    """The ``agui_runs_detached`` gauge of the adapter at ``url``: runs going on without their
    own client."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = requests.get(url + "metrics", headers=headers, timeout=10).text
    [line] = [line for line in text.splitlines() if line.startswith("agui_runs_detached ")]
    return float(line.split()[1])


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``predicate`` until it gives something true (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class FakeClock:
    """A wall clock (``time.time`` stand-in) that starts now and moves only when told to."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
