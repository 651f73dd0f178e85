"""A limit on concurrent runs, over a real socket: beyond ``max_runs`` a run is refused with
503 SERVER_BUSY and Retry-After, in its language, having touched neither the state directory
nor the kernel; resumes and guidance count; the slot comes back when a run's body closes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from agui_adapter.protocol.i18n import translate
from agui_adapter.run.engine import context_id_for
from agui_adapter.state.store import ThreadStore
from tests.support.agui_client import Client, run_body
from tests.support.flow import kernel_calls


class HeldStream:
    """A run whose SSE body is held open: RUN_STARTED read, the rest left unread.

    The chunk iterator is kept: dropping it would close the connection (and end the run).
    """

    def __init__(self, adapter: Any, body: dict) -> None:
        self.response = requests.post(
            adapter.url,
            data=json.dumps(body),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            stream=True,
            timeout=30,
        )
        assert self.response.status_code == 200
        self.chunks = self.response.iter_content(chunk_size=None)
        assert b"RUN_STARTED" in next(self.chunks)

    def close(self) -> None:
        self.response.close()


def open_stream(adapter: Any, body: dict) -> HeldStream:
    return HeldStream(adapter, body)


def busy(result: Any) -> bool:
    return result.status == 503 and result.error["code"] == "SERVER_BUSY"


def test_a_run_beyond_the_limit_is_refused_and_touches_nothing(
    make_adapter: Any, scripted_kernel: Any, workspace: Path, tmp_path: Path
) -> None:
    adapter = make_adapter(max_runs=1, heartbeat_seconds=0.2)
    client = adapter.client()
    holder = run_body("[SILENT 400] hold the slot", cwd=str(workspace))
    stream = open_stream(adapter, holder)
    try:
        fresh = tmp_path / "never-created"
        refused_body = run_body(cwd=str(fresh), thread_id="thread-busy-1")
        result = client.run(refused_body, headers={"Accept-Language": "de"})
        assert busy(result)
        assert int(result.headers["Retry-After"]) >= 1
        assert result.error["message"] == translate(
            "de",
            "The AG-UI adapter is running as many runs as it allows; retry in {seconds} seconds.",
            seconds=result.headers["Retry-After"],
        )
        assert not fresh.exists()
        store = ThreadStore(adapter.settings.resolved_state_dir())
        assert not store.path_for("thread-busy-1").exists()
        assert not list(store.threads_dir.glob("*thread-busy-1*"))
        assert not kernel_calls(scripted_kernel, "SendStreamingMessage", context_id_for("thread-busy-1"))
        # guidance and resumes are runs too
        guidance = run_body(
            "steer", cwd=str(workspace), thread_id=holder["threadId"], runMode="pipeline", activeGuidance=True
        )
        assert busy(client.run(guidance))
        resume = run_body(None, cwd=str(workspace), thread_id=holder["threadId"], resume=[])
        assert busy(client.run(resume))
    finally:
        stream.close()
    deadline = time.monotonic() + 15
    while True:  # the slot comes back once the server notices the client left
        result = client.run(run_body(cwd=str(workspace)))
        if result.status == 200 or time.monotonic() > deadline:
            break
        assert busy(result)
        time.sleep(0.2)
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"


def run_when_free(client: Client, body: dict, within: float = 10.0) -> Any:
    """Run ``body``, retrying while SERVER_BUSY: a finished run's slot comes back when the
    server closes its body, a moment after the client has read the end of the stream."""
    deadline = time.monotonic() + within
    while True:
        result = client.run(body)
        if not busy(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def test_refused_and_finished_runs_give_their_slot_back(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(max_runs=1)
    client = adapter.client()
    body = run_body(cwd=str(workspace))
    assert client.run(body).status == 200
    for _ in range(3):
        assert run_when_free(client, body).error["code"] == "DUPLICATE_RUN_ID"
        assert run_when_free(client, run_body(cwd="/not/allowed")).status == 400
        assert run_when_free(client, run_body(None, cwd=str(workspace), resume=[])).status == 409  # EXECUTION_LOST
    for _ in range(3):
        result = run_when_free(client, run_body(cwd=str(workspace)))
        assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"


def test_the_limit_is_a_setting(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(max_runs=2, heartbeat_seconds=0.2)
    streams = [open_stream(adapter, run_body("[SILENT 400] hold", cwd=str(workspace))) for _ in range(2)]
    try:
        result = Client(adapter.url).run(run_body(cwd=str(workspace)))
        if not busy(result):  # say what the held runs did
            raise AssertionError(f"not busy: {result.status} {result.raw[-300:]!r}")
    finally:
        for stream in streams:
            stream.close()
