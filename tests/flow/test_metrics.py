"""``GET /metrics`` over real sockets: what a scrape says after real runs.

The in-process adapter has its own built-in registry (a fresh one per adapter), so the
counts are exact: a turn, an interrupt, an error and a disconnect end as success,
interrupt, error and abandoned; every event a client read was counted once; the
histograms hold one observation per run. The bearer token guards ``/metrics`` like
``POST /``. The multiprocess path (prometheus_client, ``PROMETHEUS_MULTIPROC_DIR``) is
checked with two ``python run.py`` processes sharing the directory: a scrape of either
gives the totals of both. Every scrape is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter import __version__
from agui_adapter.kernel_client.launch import KernelProcess
from tests.support.agui_client import Client, run_body
from tests.support.flow import KERNEL_TOKEN, interrupted
from tests.support.ports import free_port
from tests.support.secrets import STATE_DIRS
from tests.support.servers import InProcessAdapter

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _parser() -> Any:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # the test extra has it
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus_client is not installed (pip install -e .[test])")
        pytest.skip("prometheus_client is not installed (pip install -e .[test])")
    return text_string_to_metric_families


def scrape(url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    session = requests.Session()
    session.trust_env = False
    response = session.get(url.rstrip("/") + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    families = {}
    for family in _parser()(response.text):
        families[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    # every series of the issue is there, with its type
    assert families["agui_runs_active"] == "gauge"
    assert families["agui_kernel_up"] == "gauge"
    assert families["agui_run_first_event_seconds"] == "histogram"
    assert families["agui_run_duration_seconds"] == "histogram"
    for counter in ("agui_runs", "agui_run_errors", "agui_http_requests", "agui_events_sent"):
        assert families[counter] == "counter", counter
    assert families["agui_sse_clients_disconnected"] == "counter"
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def histogram(samples: Samples, name: str, **labels: str) -> tuple[list[tuple[float, float]], float, float]:
    """(le, cumulative count) in order, the sum and the count of a histogram, added up over
    its label sets (those matching ``labels``)."""

    def matching(key: tuple[str, tuple[tuple[str, str], ...]], suffix: str) -> bool:
        return key[0] == name + suffix and all(dict(key[1]).get(k) == v for k, v in labels.items())

    buckets: dict[float, float] = {}
    for key, count in samples.items():
        if matching(key, "_bucket"):
            le = float(dict(key[1])["le"])
            buckets[le] = buckets.get(le, 0.0) + count
    total = sum(v for k, v in samples.items() if matching(k, "_sum"))
    observed = sum(v for k, v in samples.items() if matching(k, "_count"))
    return sorted(buckets.items()), total, observed


def check_histogram(samples: Samples, name: str, count: int) -> None:
    buckets, total, observed = histogram(samples, name)
    assert observed == count, (name, observed)
    assert buckets[-1] == (float("inf"), count)
    counts = [c for _, c in buckets]
    assert counts == sorted(counts), f"{name} buckets are not cumulative: {counts}"
    assert total > 0


def _open_silent_run(url: str, workspace: Path) -> tuple[socket.socket, bytes]:
    """A run whose kernel goes silent after its session event, read up to a heartbeat
    (so that every event encoded so far has arrived)."""
    body = run_body("[SILENT 600] [SLOW]", cwd=str(workspace))  # 30 s of kernel silence: nothing unread
    host, port = url.split("//")[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    data = b""
    sock.settimeout(10)
    while b"iac-code.session.v1" not in data or b": heartbeat" not in data.split(b"iac-code.session.v1")[1]:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return sock, data


def _wait_idle(url: str) -> None:
    """Until the runs that were read to their end have left the live runs (the server closes
    a body just after writing its last chunk, so a client can be a little ahead)."""
    deadline = time.monotonic() + 10
    while value(scrape(url), "agui_runs_active") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_for_the_abandoned_run(url: str) -> Samples:
    """A scrape once the disconnected run has ended and left the live runs (two steps of
    its ``close()``, which runs on the server's thread after the failed write)."""
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(url)
        ended = value(samples, "agui_runs_total", outcome="abandoned") == 1.0
        if (ended and value(samples, "agui_runs_active") == 0.0) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_a_scrape_counts_runs_by_outcome_events_and_latencies(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.2)
    client = adapter.client()
    before = scrape(adapter.url)
    assert value(before, "agui_kernel_up") == 1.0
    for outcome in ("success", "interrupt", "error", "abandoned"):
        assert value(before, "agui_runs_total", outcome=outcome) == 0.0  # every outcome exists at 0
    assert value(before, "agui_runs_active") == 0.0

    turn = client.run(run_body("[THINK] [TOOL] hello", cwd=str(workspace)))
    assert turn.terminal["type"] == "RUN_FINISHED"
    _, interrupt = interrupted(client, workspace)
    failed = client.run(run_body("[FAIL]", cwd=str(workspace)))
    assert failed.terminal["type"] == "RUN_ERROR"
    code = failed.terminal["code"]

    _wait_idle(adapter.url)
    sock, data = _open_silent_run(adapter.url, workspace)
    during = scrape(adapter.url)
    assert value(during, "agui_runs_active") == 1.0
    sock.close()  # the client goes away mid-run
    after = _wait_for_the_abandoned_run(adapter.url)

    assert value(after, "agui_runs_total", outcome="success") == 1.0
    assert value(after, "agui_runs_total", outcome="interrupt") == 1.0
    assert value(after, "agui_runs_total", outcome="error") == 1.0
    assert value(after, "agui_runs_total", outcome="abandoned") == 1.0
    assert value(after, "agui_run_errors_total", code=code) == 1.0
    assert sum(v for k, v in after.items() if k[0] == "agui_run_errors_total") == 1.0
    assert value(after, "agui_sse_clients_disconnected_total") == 1.0
    assert value(after, "agui_runs_active") == 0.0
    read = len(turn.events) + len(interrupt.events) + len(failed.events) + data.count(b"\ndata: ")
    assert data.startswith(b"HTTP/1.1 200") and read > len(turn.events) + len(interrupt.events) + len(failed.events)
    assert value(after, "agui_events_sent_total") == read  # every event written, counted once
    check_histogram(after, "agui_run_first_event_seconds", 4)
    check_histogram(after, "agui_run_duration_seconds", 4)
    for outcome in ("success", "interrupt", "error", "abandoned"):  # by run mode and outcome
        for name in ("agui_run_first_event_seconds", "agui_run_duration_seconds"):
            assert histogram(after, name, mode="turn", outcome=outcome)[2] == 1.0, (name, outcome)
    # the silent run lasted until its client left (at least one heartbeat), longer than the rest
    buckets, total, _ = histogram(after, "agui_run_duration_seconds")
    assert total >= 0.2
    # HTTP requests by route (the endpoint, never the path) and status
    assert value(after, "agui_http_requests_total", route="run", status="200") == 4.0
    assert value(after, "agui_http_requests_total", route="metrics", status="200") >= 3.0


def test_http_requests_are_counted_by_endpoint_and_status(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    session = requests.Session()
    session.trust_env = False
    assert session.get(adapter.url + "health", timeout=5).status_code == 200
    assert session.get(adapter.url + "no/such/path-12345", timeout=5).status_code == 404
    assert session.put(adapter.url + "health", timeout=5).status_code == 405
    bad = adapter.client().run(b"{not json")
    assert bad.status == 400
    execution = adapter.url + "extensions/iac-code/v1/executions/exec-unknown/cancel"
    gone = session.post(execution, json={"threadId": "t-none", "rosInvocationId": "inv-1"}, timeout=5)
    assert gone.status_code == 404
    samples = scrape(adapter.url)
    assert value(samples, "agui_http_requests_total", route="health", status="200") == 1.0
    assert value(samples, "agui_http_requests_total", route="unmatched", status="404") == 1.0
    assert value(samples, "agui_http_requests_total", route="unmatched", status="405") == 1.0
    assert value(samples, "agui_http_requests_total", route="run", status="400") == 1.0
    assert value(samples, "agui_http_requests_total", route="cancel", status="404") == 1.0
    routes = {dict(k[1])["route"] for k in samples if k[0] == "agui_http_requests_total"}
    assert routes <= {"health", "unmatched", "run", "cancel", "metrics"}, routes  # no raw path
    # a run refused before the stream is not a run
    assert sum(v for k, v in samples.items() if k[0] == "agui_runs_total") == 0.0


def test_metrics_need_the_bearer_token_when_one_is_set(make_adapter: Any) -> None:
    token = "metrics-bearer-token-77"
    adapter = make_adapter(auth_token=token)
    session = requests.Session()
    session.trust_env = False
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": token}):
        refused = session.get(adapter.url + "metrics", headers=headers, timeout=5)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "UNAUTHORIZED"
        assert b"agui_" not in refused.content
    samples = scrape(adapter.url, token)
    assert value(samples, "agui_http_requests_total", route="metrics", status="401") == 3.0
    # /health stays open
    assert session.get(adapter.url + "health", timeout=5).status_code == 200


def test_a_kernel_that_is_down_shows_and_its_runs_count_as_errors(tmp_path: Path, workspace: Path) -> None:
    from dataclasses import replace

    from agui_adapter.config import Settings

    settings = replace(Settings(), state_dir=str(tmp_path / "state"), allowed_cwds=str(tmp_path))
    STATE_DIRS.append(tmp_path / "state")
    dead = KernelProcess(f"http://127.0.0.1:{free_port()}/", KERNEL_TOKEN, "scripted")
    adapter = InProcessAdapter(settings, dead)
    try:
        samples = scrape(adapter.url)
        assert value(samples, "agui_kernel_up") == 0.0
        result = Client(adapter.url).run(run_body("hello", cwd=str(workspace)))
        assert result.terminal["type"] == "RUN_ERROR"
        samples = scrape(adapter.url)
        assert value(samples, "agui_runs_total", outcome="error") == 1.0
        assert value(samples, "agui_run_errors_total", code=result.terminal["code"]) == 1.0
        assert result.terminal["code"] == "A2A_UNAVAILABLE"
    finally:
        adapter.stop()


def test_one_scrape_gives_the_totals_of_every_process(adapter_process: Any, tmp_path: Path, workspace: Path) -> None:
    """prometheus_client's multiprocess mode: two adapter processes, one directory."""
    _parser()
    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
    first = adapter_process("--heartbeat-seconds", "0.2", env=env)
    second = adapter_process("--heartbeat-seconds", "0.2", env=env)
    try:
        events = 0
        for process, text in ((first, "hello"), (second, "hello"), (second, "[FAIL]")):
            result = Client(process.url).run(run_body(text, cwd=str(workspace)))
            assert result.status == 200
            events += len(result.events)
        _wait_idle(first.url)
        sock, data = _open_silent_run(second.url, workspace)
        events += data.count(b"\ndata: ")
        assert value(scrape(first.url), "agui_runs_active") == 1.0  # the other process's open run
        sock.close()
        for process in (first, second):
            samples = _wait_for_the_abandoned_run(process.url)
            assert value(samples, "agui_runs_total", outcome="success") == 2.0
            assert value(samples, "agui_runs_total", outcome="error") == 1.0
            assert value(samples, "agui_runs_total", outcome="abandoned") == 1.0
            assert value(samples, "agui_events_sent_total") == events
            assert value(samples, "agui_http_requests_total", route="run", status="200") == 4.0
            assert value(samples, "agui_sse_clients_disconnected_total") == 1.0
            assert value(samples, "agui_runs_active") == 0.0
            assert value(samples, "agui_kernel_up") == 1.0
            check_histogram(samples, "agui_run_duration_seconds", 4)
            check_histogram(samples, "agui_run_first_event_seconds", 4)
        assert len({p.name.rsplit("_", 1)[-1] for p in directory.glob("counter_*.db")}) == 2  # one file per process
    except AssertionError as exc:  # say what the two processes logged
        logs = b"\n".join(p.log[-3000:] for p in (first, second)).decode(errors="replace")
        raise AssertionError(f"{exc}\n--- adapter logs ---\n{logs}") from exc


def test_saturation_kernel_calls_state_and_build_series(make_adapter: Any, workspace: Path) -> None:
    """The operator's series beyond runs: limits and what is open, kernel calls by method,
    state writes, pending interrupts and journal bytes read from disk, the build, the process."""
    adapter = make_adapter(max_runs=7)
    client = adapter.client()
    body, result = interrupted(client, workspace)
    replay = client.events(body["threadId"], body["runId"])
    assert replay.status == 200 and replay.rest()
    replay.close()
    session = requests.Session()
    session.trust_env = False
    head = session.head(adapter.url + "metrics", timeout=5)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = scrape(adapter.url)
    assert value(samples, "agui_runs_max") == 7.0
    assert value(samples, "agui_connections_max") == 1024.0
    assert value(samples, "agui_connections_open") >= 1.0  # the scrape's own connection at least
    assert value(samples, "agui_runs_detached") == 0.0
    assert value(samples, "agui_interrupts_pending") == 1.0  # the interrupt the run ended with
    assert value(samples, "agui_journal_bytes") >= len(result.raw) * 0.5  # the run's events, kept for replay
    assert value(samples, "agui_build_info", kernel="scripted", version=__version__) == 1.0
    # kernel calls by A2A method: the turn's stream at least, and the probes of /metrics
    assert histogram(samples, "agui_kernel_call_seconds", method="SendStreamingMessage")[2] >= 1.0
    assert histogram(samples, "agui_kernel_call_seconds", method="health")[2] >= 1.0
    assert not [k for k in samples if k[0] == "agui_kernel_call_errors_total"]
    # the admission's durable write, and the run's own (the task id, the interrupts)
    assert histogram(samples, "agui_state_write_seconds", durable="true")[2] >= 2.0
    # the events route and HEAD on /metrics are counted by route
    assert value(samples, "agui_http_requests_total", route="events", status="200") == 1.0
    # the HEAD (a scrape counts itself once its answer has started, after rendering it)
    assert value(samples, "agui_http_requests_total", route="metrics", status="200") == 1.0
    # the process, from prometheus_client's collectors (or the built-in reading without it)
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds", "agui_process_threads"):
        assert value(samples, name) > 0, name
    assert [k for k in samples if k[0] == "python_info"]


def test_kernel_call_errors_are_counted_by_method_and_kind(tmp_path: Path, workspace: Path) -> None:
    from dataclasses import replace

    from agui_adapter.config import Settings

    settings = replace(Settings(), state_dir=str(tmp_path / "state"), allowed_cwds=str(tmp_path))
    STATE_DIRS.append(tmp_path / "state")
    dead = KernelProcess(f"http://127.0.0.1:{free_port()}/", KERNEL_TOKEN, "configured")
    adapter = InProcessAdapter(settings, dead)
    try:
        result = Client(adapter.url).run(run_body("hello", cwd=str(workspace)))
        assert result.terminal["code"] == "A2A_UNAVAILABLE"
        samples = scrape(adapter.url)
        kinds = {dict(k[1])["method"]: dict(k[1])["kind"] for k in samples if k[0] == "agui_kernel_call_errors_total"}
        assert kinds.get("SendStreamingMessage") == "connection", kinds
        assert kinds.get("health") == "connection", kinds  # the kernel_up probe of this scrape
        assert value(samples, "agui_build_info", kernel="external", version=__version__) == 1.0
    finally:
        adapter.stop()


def test_a_run_going_on_without_its_client_is_a_detached_run(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(heartbeat_seconds=0.2, disconnect_grace_seconds=1.0)
    sock, _ = _open_silent_run(adapter.url, workspace)
    assert value(scrape(adapter.url), "agui_runs_detached") == 0.0
    sock.close()  # the client goes away: the run goes on for the grace period
    deadline = time.monotonic() + 10
    while value(scrape(adapter.url), "agui_runs_detached") != 1.0:
        assert time.monotonic() < deadline, "the run never detached"
        time.sleep(0.05)
    samples = _wait_for_the_abandoned_run(adapter.url)  # nobody reattached within the grace period
    assert value(samples, "agui_runs_detached") == 0.0
    assert histogram(samples, "agui_run_duration_seconds", mode="turn", outcome="abandoned")[2] == 1.0


def test_a_pipeline_run_is_labelled_pipeline(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter()
    body = run_body("price the plans", cwd=str(workspace), runMode="pipeline", pipelineName="selling")
    result = adapter.client().run(body)
    assert result.status == 200 and result.terminal["type"] in ("RUN_FINISHED", "RUN_ERROR")
    _wait_idle(adapter.url)
    samples = scrape(adapter.url)
    assert histogram(samples, "agui_run_duration_seconds", mode="pipeline")[2] == 1.0
    assert histogram(samples, "agui_run_duration_seconds", mode="turn")[2] == 0.0
