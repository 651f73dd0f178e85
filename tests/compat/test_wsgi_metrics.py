"""``/metrics`` under gunicorn with two worker processes: one scrape gives the totals.

gunicorn serves ``agui_adapter.wsgi:application`` with ``PROMETHEUS_MULTIPROC_DIR`` set
(prometheus_client's multiprocess mode) and the ``child_exit`` hook the README gives.
Each worker takes one connection at a time (``--threads 1 --worker-connections 1``), so
a run started while another is held lands on the other worker; which worker ran what is
read from the JSON per-run log lines (their ``pid``). Then every scrape, whichever worker
answers it, counts all the runs, all their events and all their requests.

Run with ``pytest -m wsgi_servers tests/compat/test_wsgi_metrics.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter import __version__
from tests.support.agui_client import run_body
from tests.support.agui_stream import check_stream, parse_sse
from tests.support.flow import KERNEL_TOKEN, kernel_calls, wait_for
from tests.support.ports import free_port
from tests.support.servers import ROOT

pytestmark = pytest.mark.wsgi_servers

GUNICORN_CONF = """
from prometheus_client import multiprocess


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)
"""


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e .[test])"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.headers["Connection"] = "close"  # a new connection per request: any worker may take it
    return session


def _run(url: str, body: dict[str, Any], results: list[list[dict[str, Any]]]) -> None:
    response = _session().post(url, json=body, headers={"Accept": "text/event-stream"}, timeout=30)
    assert response.status_code == 200, response.text
    events = parse_sse(response.content)
    check_stream(events)
    results.append(events)


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    response = _session().get(url + "metrics", timeout=10)
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_one_scrape_gives_the_totals_of_all_gunicorn_workers(tmp_path: Path, scripted_kernel: Any) -> None:
    _require("gunicorn")
    _require("prometheus_client")
    for name in ("state", "ws", "prometheus"):
        (tmp_path / name).mkdir()
    conf = tmp_path / "gunicorn_conf.py"
    conf.write_text(GUNICORN_CONF)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    env.update(
        {
            "IAC_CODE_AGUI_A2A_URL": scripted_kernel.url,
            "IAC_CODE_AGUI_A2A_TOKEN": KERNEL_TOKEN,
            "IAC_CODE_AGUI_STATE_DIR": str(tmp_path / "state"),
            "IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path),
            "IAC_CODE_AGUI_LOG_FORMAT": "json",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = tmp_path / "gunicorn.log"
    command = [
        sys.executable, "-m", "gunicorn", "-c", str(conf), "-k", "gthread", "-w", "2", "--threads", "1",
        "--worker-connections", "1", "--graceful-timeout", "5", "-b", f"127.0.0.1:{port}",
        "agui_adapter.wsgi:application",
    ]  # fmt: skip
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                if _session().get(url + "health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)

        workspace = str(tmp_path / "ws")
        results: list[list[dict[str, Any]]] = []
        for _ in range(3):
            # a run held by one worker (1 s of kernel silence), and one started meanwhile
            mark = len(kernel_calls(scripted_kernel, "SendStreamingMessage"))
            held = threading.Thread(target=_run, args=(url, run_body("[SILENT 20] hi", cwd=workspace), results))
            held.start()
            wait_for(lambda mark=mark: len(kernel_calls(scripted_kernel, "SendStreamingMessage")) > mark, 30)  # held
            _run(url, run_body("hello", cwd=workspace), results)
            held.join(30)
        assert len(results) == 6
        events = sum(len(r) for r in results)

        # every run's summary line (written once its body is closed: it has left the live runs),
        # and its access line (the app's, under gunicorn too: written just after, once it ended)
        deadline = time.monotonic() + 10
        summaries: list[dict[str, Any]] = []
        streams: list[dict[str, Any]] = []
        while (len(summaries) < 6 or len(streams) < 6) and time.monotonic() < deadline:
            lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.startswith("{")]
            entries = [json.loads(x) for x in lines]
            summaries = [e for e in entries if e.get("outcome") == "success"]
            streams = [e for e in entries if e["logger"] == "agui_adapter.access" and e.get("route") == "run"]
            time.sleep(0.1)
        assert len(summaries) == 6, log_path.read_text()[-3000:]
        pids = {e["pid"] for e in summaries}
        assert len(pids) == 2, f"the runs did not spread over both workers\n{log_path.read_text()[-3000:]}"
        assert len(streams) == 6 and all(e["status"] == 200 and e["bytes_sent"] > 0 for e in streams), streams
        assert {(e["thread_id"], e["run_id"]) for e in streams} == {(e["thread_id"], e["run_id"]) for e in summaries}

        for _ in range(4):  # whichever worker answers
            samples = _scrape(url)
            assert samples[("agui_runs_total", (("outcome", "success"),))] == 6.0
            assert samples[("agui_events_sent_total", ())] == events
            assert samples[("agui_http_requests_total", (("route", "run"), ("status", "200")))] == 6.0
            turns = (("mode", "turn"), ("outcome", "success"))
            assert samples[("agui_run_duration_seconds_count", turns)] == 6.0
            assert samples[("agui_run_first_event_seconds_count", turns)] == 6.0
            assert samples[("agui_runs_max", ())] == 2 * 256.0  # both live workers' share
            assert samples[("agui_runs_detached", ())] == 0.0
            assert samples[("agui_build_info", (("kernel", "external"), ("version", __version__)))] == 1.0
            assert samples[("agui_interrupts_pending", ())] == 0.0
            assert samples[("agui_journal_bytes", ())] > 0  # the six runs' journals, kept for replay
            assert sum(v for k, v in samples.items() if k[0] == "agui_state_write_seconds_count") >= 6
            methods = {dict(k[1])["method"] for k in samples if k[0] == "agui_kernel_call_seconds_count"}
            assert "SendStreamingMessage" in methods, methods
            # under gunicorn the connections are not known, and per-process collectors do not apply
            assert not [k for k in samples if k[0].startswith(("agui_connections_", "process_"))]
            assert samples[("agui_runs_active", ())] == 0.0
            assert samples[("agui_kernel_up", ())] == 1.0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
