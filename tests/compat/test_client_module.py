"""The client module for web developers, in Node with the official ``@ag-ui/client`` 1.0.

``AdapterHttpAgent`` (``agui-adapter-agent.mjs``: ``withAdapter(HttpAgent)``) and ``followRun`` are
driven by ``tests/support/client_module/drive.mjs``, importing the two modules exactly as the
adapter serves them (``GET /agui-adapter-*.mjs``, saved beside the script with a
``node_modules`` holding ``@ag-ui/client``). The adapter is a real ``python run.py`` with a grace
period (a dropped client's run goes on) in front of a scripted kernel at 0.2 scale (``[SLOW]``: ten
deltas 0.2 s apart; ``[SILENT 200]``: 40 s of kernel silence); the client reaches it through
``CuttingProxy``, which closes chosen streams after a number of bytes, mid-event as it falls.

The bar: what a subscriber receives is exactly one valid run (the client's own parser, schema
checks and verifier raise nothing, and no warning is printed), the very events the run's journal
holds, with the text of an uninterrupted run; ``connectAgent()`` reattaches to a run another
client started; ``abortRun()`` leaves the thread free at once (the next turn succeeds, the kernel
task is cancelled), and nothing reconnects after it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.agui_check.official import node_binary, require_official_client
from tests.support.agui_client import Client, LiveStream, run_body
from tests.support.cutting_proxy import CuttingProxy
from tests.support.flow import KERNEL_TOKEN, cancelled_tasks, kernel_calls

pytestmark = pytest.mark.official_client

DRIVER = Path(__file__).resolve().parents[1] / "support" / "client_module" / "drive.mjs"
MODULES = ("agui-adapter-client.mjs", "agui-adapter-agent.mjs")


@pytest.fixture(scope="module")
def kernel() -> Iterator[ScriptedKernel]:
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.2)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.fixture
def adapter(adapter_process: Any, kernel: ScriptedKernel) -> Any:
    require_official_client()
    return adapter_process("--disconnect-grace-seconds", "10", "--heartbeat-seconds", "1", kernel_url=kernel.url)


@pytest.fixture
def app(adapter: Any, tmp_path: Path) -> Path:
    """A folder holding the modules as the adapter serves them, the driver and ``node_modules``."""
    modules = require_official_client()
    folder = tmp_path / "app"
    folder.mkdir()
    for name in MODULES:
        response = requests.get(adapter.url + name, timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/javascript")
        (folder / name).write_bytes(response.content)
    shutil.copy(DRIVER, folder / DRIVER.name)
    (folder / "node_modules").symlink_to(modules, target_is_directory=True)
    return folder


def drive(app: Path, spec: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    node = node_binary()
    assert node is not None
    (app / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_PATH", "NODE_OPTIONS")}
    proc = subprocess.run(
        [node, DRIVER.name, "spec.json"], cwd=app, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def proxy_to(adapter: Any, cuts: list[int], *, freeze: bool = False) -> CuttingProxy:
    host, port = adapter.url.removeprefix("http://").rstrip("/").split(":")
    return CuttingProxy((host, int(port)), cuts, freeze=freeze)


def iac(workspace: Path) -> dict[str, Any]:
    return {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": str(workspace)}


def assistant_text(events: list[dict[str, Any]]) -> str:
    """The assistant messages' texts, one a line (what the agent's ``messages`` hold)."""
    texts: dict[str, str] = {}
    for event in events:
        if event["type"] == "TEXT_MESSAGE_CONTENT":
            texts[event["messageId"]] = texts.get(event["messageId"], "") + event["delta"]
    return "\n".join(texts.values())


def journal(adapter: Any, thread_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's whole stream as the adapter replays it (from its first event)."""
    return [event for _, event in Client(adapter.url).events(thread_id, run_id).rest()]


def test_the_sse_reader_keeps_ids_and_drops_cut_events(app: Path) -> None:
    assert drive(app, {"scenario": "parser"}) == {"failures": []}


@pytest.mark.parametrize(
    "cuts",
    [[900, 700, 1500], [0, 300, 0]],
    ids=["mid-stream", "before-any-answer"],
)
def test_a_stream_cut_mid_run_reaches_the_subscriber_as_one_valid_run(
    adapter: Any, app: Path, kernel: ScriptedKernel, workspace: Path, cuts: list[int]
) -> None:
    # what the run says when nothing is cut (the scripted kernel is deterministic)
    reference = Client(adapter.url).run(run_body("[TOOL] [SLOW] go", cwd=str(workspace)))
    assert reference.terminal["type"] == "RUN_FINISHED"
    proxy = proxy_to(adapter, cuts)
    thread_id, run_id = f"t-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    spec = {"scenario": "run", "url": proxy.url, "threadId": thread_id, "runId": run_id}
    report = drive(app, {**spec, "text": "[TOOL] [SLOW] go", "iacCode": iac(workspace)})
    assert report["errors"] == [], report["errors"]
    assert report["terminal"] == "RUN_FINISHED" and report["outcome"] == "success"
    events = report["events"]
    assert [e["type"] for e in events] == reference.types()
    assert report["text"] == assistant_text(reference.events)
    assert report["text"].startswith("I will read the file.") and report["text"].endswith("seven, eight.")
    assert events == journal(adapter, thread_id, run_id)  # the very events of the run, each once
    assert report["lastRun"] == {"runId": run_id, "lastEventId": len(events)}
    # every cut happened, and the client came back each time with what it had
    assert proxy.cut_count == len(cuts)
    streams = proxy.streams()
    assert len(streams) == len(cuts) + 1
    gets = [s for s in streams if s.method == "GET"]
    assert gets and all(s.path == f"/threads/{thread_id}/runs/{run_id}/events" for s in gets)
    if cuts[0] == 0:  # no answer at all: the same POST again, as a reattach from the start
        assert (streams[1].method, streams[1].last_event_id) == ("POST", "0")
    else:
        assert [s.last_event_id is not None and int(s.last_event_id) > 0 for s in gets] == [True] * len(gets)
    # one run on the kernel, never cancelled
    context = next(e for e in events if e["type"] == "CUSTOM")["value"]
    assert len(kernel_calls(kernel, "SendStreamingMessage", context["contextId"])) == 1
    assert context["taskId"] not in cancelled_tasks(kernel)


def thread_answer(thread_id: str, run_id: str | None, session: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /threads/{threadId}`` answers (the agreed shape), with ``run_id`` live or none."""
    live = {"runId": run_id, "lastEventId": 2, "clientAttached": True, "startedAt": "2026-12-03T08:00:00Z"}
    return {
        "threadId": thread_id,
        "activeRun": {**live, "mode": "turn"} if run_id else None,
        "pendingInterrupts": [],
        "execution": {"executionId": session["executionId"], "rosInvocationId": session["rosInvocationId"]},
        "runs": [{"runId": run_id, "outcome": None, "errorCode": None, "startedAt": live["startedAt"]}],
    }


@pytest.mark.parametrize("threads", ["adapter", "agreed-shape"])
def test_connect_agent_reattaches_to_a_live_run_another_client_started(
    adapter: Any, app: Path, workspace: Path, threads: str
) -> None:
    # 5 s of kernel silence first: still live when node has started, however loaded the machine
    body = run_body("[SILENT 25] [SLOW] go", cwd=str(workspace))
    thread_id, run_id = body["threadId"], body["runId"]
    other = LiveStream(Client(adapter.url), body)  # another client, still reading
    session = other.session()
    proxy = proxy_to(adapter, [1200])
    probe = requests.get(f"{adapter.url}threads/{thread_id}", timeout=10)
    spec: dict[str, Any] = {"scenario": "connect", "url": proxy.url, "threadId": thread_id, "runId": None}
    if threads == "agreed-shape":
        # GET /threads/{id} answered as agreed (whether or not this adapter has the route yet):
        # no live run, nothing to attach to; a live run, attached
        idle = drive(app, {**spec, "threadsAnswer": thread_answer(thread_id, None, session)})
        assert idle["events"] == [] and idle["errors"] == [] and len(idle["threadLookups"]) == 1
        assert proxy.streams() == []
        spec["threadsAnswer"] = thread_answer(thread_id, run_id, session)
    elif probe.status_code == 404 and probe.json()["error"]["code"] == "NOT_FOUND":
        # an adapter without GET /threads/{id}: connect() falls back cleanly (a fresh agent
        # remembers no run: nothing to attach to, no error), and attaches to a run named to it
        empty = drive(app, spec)
        assert empty["events"] == [] and empty["errors"] == []
        spec["runId"] = run_id
    else:
        assert probe.status_code == 200 and probe.json()["activeRun"]["runId"] == run_id
    report = drive(app, spec)
    assert report["errors"] == [], report["errors"]
    assert report["terminal"] == "RUN_FINISHED" and report["outcome"] == "success"
    assert report["text"] == "Slowly counting: one, two, three, four, five, six, seven, eight."
    assert report["events"] == journal(adapter, thread_id, run_id)
    if threads == "agreed-shape":
        assert report["threadLookups"] == [f"/threads/{thread_id}"]
    assert proxy.cut_count == 1
    last = proxy.streams()[-1]
    assert last.method == "GET" and last.last_event_id is not None and int(last.last_event_id) > 0
    other.close()


@pytest.mark.parametrize("cancel_on_abort", [True, False], ids=["module", "without-cancel"])
def test_abort_run_leaves_the_thread_free_at_once(
    adapter: Any, app: Path, kernel: ScriptedKernel, workspace: Path, cancel_on_abort: bool
) -> None:
    proxy = proxy_to(adapter, [])
    thread_id, run_id = f"t-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    spec = {
        "scenario": "abort",
        "url": proxy.url,
        "threadId": thread_id,
        "runId": run_id,
        "secondRunId": run_id + "-next",
        "text": "[SILENT 200] think for 40 s",  # the kernel says nothing meanwhile
        "secondText": "hello",
        "iacCode": iac(workspace),
        "cancelOnAbort": cancel_on_abort,
    }
    report = drive(app, spec)
    first, second = report["first"], report["second"]
    session = report["session"]
    if not cancel_on_abort:
        # the control: HttpAgent's own abort only closes the connection; with a grace period the
        # run goes on and holds the thread, so the next turn is refused
        assert any("THREAD_BUSY" in error for error in second["errors"]), second
        requests.post(
            f"{adapter.url}extensions/iac-code/v1/executions/{session['executionId']}/cancel",
            json={"threadId": thread_id, "rosInvocationId": "inv-1"},
            timeout=10,
        )
        return
    assert first["errors"] == [], first["errors"]
    assert second["errors"] == [], second["errors"]
    assert second["terminal"] == "RUN_FINISHED" and second["outcome"] == "success"
    assert second["text"] == "Hello from the scripted kernel."
    # measured from abortRun() to the end of the next turn, through the proxy
    assert report["abortToSecondDoneMs"] < 5000, report
    print(f"abortRun() to the next turn's RUN_FINISHED: {report['abortToSecondDoneMs']} ms")
    assert session["taskId"] in cancelled_tasks(kernel)
    seen = [(r.method, r.path) for r in proxy.requests]
    cancel = ("POST", f"/extensions/iac-code/v1/executions/{session['executionId']}/cancel")
    assert seen == [("POST", "/"), cancel, ("POST", "/")]  # and no reconnect after the abort


def test_follow_run_resumes_after_each_cut_and_returns_the_terminal_event(
    adapter: Any, app: Path, workspace: Path
) -> None:
    body = run_body("[SLOW] go", cwd=str(workspace))
    other = LiveStream(Client(adapter.url), body)
    seen = other.read_events(2)
    proxy = proxy_to(adapter, [500, 400])
    spec = {"scenario": "follow", "url": proxy.url, "threadId": body["threadId"], "runId": body["runId"]}
    report = drive(app, {**spec, "lastEventId": seen[-1][0]})
    assert report["errors"] == []
    whole = journal(adapter, body["threadId"], body["runId"])
    assert report["ids"] == list(range(seen[-1][0] + 1, len(whole) + 1))
    assert report["events"] == whole[seen[-1][0] :]
    assert report["terminal"] == whole[-1] and whole[-1]["type"] == "RUN_FINISHED"
    assert proxy.cut_count == 2
    other.close()


def test_the_retry_budget_ends_a_stream_that_never_comes_back(adapter: Any, app: Path, workspace: Path) -> None:
    proxy = proxy_to(adapter, [900, 0, 0, 0, 0])
    thread_id, run_id = f"t-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    spec = {"scenario": "run", "url": proxy.url, "threadId": thread_id, "runId": run_id, "reconnect": {"maxRetries": 2}}
    report = drive(app, {**spec, "text": "[SLOW] go", "iacCode": iac(workspace)})
    assert report["terminal"] is None
    assert report["errors"] and all("run failed" in e or "rejected" in e or "warning" in e for e in report["errors"])
    assert len(proxy.streams()) == 3  # the POST and two retries, then it gives up


def test_a_stalled_stream_is_dropped_after_the_idle_timeout(adapter: Any, app: Path, workspace: Path) -> None:
    # the path stalls (no heartbeat gets through): after idleTimeoutMs the client reconnects
    proxy = proxy_to(adapter, [900], freeze=True)
    thread_id, run_id = f"t-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    spec = {"scenario": "run", "url": proxy.url, "threadId": thread_id, "runId": run_id}
    report = drive(app, {**spec, "text": "[SLOW] go", "iacCode": iac(workspace), "reconnect": {"idleTimeoutMs": 1500}})
    assert report["errors"] == [] and report["terminal"] == "RUN_FINISHED"
    assert report["events"] == journal(adapter, thread_id, run_id)
    assert proxy.cut_count == 1 and [s.method for s in proxy.streams()] == ["POST", "GET"]


def test_a_post_without_answer_on_a_busy_thread_ends_with_thread_busy(adapter: Any, app: Path, workspace: Path) -> None:
    # the POST reaches the adapter but its answer (409: another client's run holds the thread)
    # is lost; the same POST again is refused the same way (409 is what it also gets while the
    # first POST is still being admitted, so it is tried again), until the budget is spent
    body = run_body("[SILENT 50] [SLOW] go", cwd=str(workspace))
    other = LiveStream(Client(adapter.url), body)
    other.session()
    proxy = proxy_to(adapter, [0])
    spec = {"scenario": "run", "url": proxy.url, "threadId": body["threadId"], "runId": f"r-{uuid.uuid4().hex[:10]}"}
    report = drive(app, {**spec, "text": "hello", "iacCode": iac(workspace), "reconnect": {"maxRetries": 2}})
    assert report["terminal"] is None and report["events"] == []
    assert any("409" in e and "THREAD_BUSY" in e for e in report["errors"]), report["errors"]
    assert [(s.method, s.last_event_id) for s in proxy.streams()] == [("POST", None), ("POST", "0"), ("POST", "0")]
    other.close()
