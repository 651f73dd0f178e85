"""What the flow tests against the scripted kernel share.

``KERNEL_TOKEN`` is the bearer token of the session's scripted kernel (the ``scripted_kernel``
fixture); ``kernel_calls`` reads that kernel's request log (``cancelled_tasks``: the tasks it
was asked to cancel); ``interrupted`` runs a turn that the scripted kernel ends with a
permission interrupt (its ``[WRITE]`` script); ``detached_runs`` reads ``agui_runs_detached``
(a run that went on without its client); ``wait_for`` polls a condition, ``holds_for``
that one stays true; ``FakeClock`` is a wall clock a test moves forward (interrupt expiry
without waiting), ``FakeMonotonic`` the runs' monotonic clock (their grace period).
"""

from __future__ import annotations

import threading
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


class FakeMonotonic:
    """A monotonic clock (``time.monotonic`` stand-in, the runs' grace period) that moves
    only when told to, and counts its reads, so that a test waits until the code looked."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def looked_at_twice(self, timeout: float = 10.0) -> None:
        """Wait until the clock was read twice more: a look that began before this call
        ended, and one more began after it."""
        start = self.reads
        wait_for(lambda: self.reads >= start + 2, timeout)


def holds_for(predicate: Callable[[], object], seconds: float) -> bool:
    """Whether ``predicate`` stays true for ``seconds`` (polled; False as soon as it is not)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.05)
    return bool(predicate())
