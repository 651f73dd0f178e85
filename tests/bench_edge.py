#!/usr/bin/env python3
"""Edge benchmark: pre-stream rejections and time to the first events, per HTTP server.

Not collected by pytest (prints figures, asserts nothing). Starts the scripted kernel and
the adapter as separate processes on loopback, once on the built-in server
(``python run.py``, ``agui_adapter.http.server``) and once on Werkzeug's development server
(what ``python run.py`` used before), and prints side by side:

- pre-stream rejections/s with 8 keep-alive clients (``http.client``, which reconnects
  when the server closes): an envelope that fails validation, answered 400;
- the adapter's CPU time per rejected request (user + system, from /proc);
- time to ``RUN_STARTED`` and to the first text delta, p50 over short runs.

Run: ``python tests/bench_edge.py [--seconds S] [--runs K] [--clients N]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"

# the same application on Werkzeug's threaded development server, for comparison
WERKZEUG_LAUNCHER = """
import os
from werkzeug.serving import make_server
from agui_adapter.config import load_settings
from agui_adapter.kernel_client.launch import start_kernel
from agui_adapter.cli import build_app, configure_logging
settings = load_settings()
configure_logging(settings.log_level)
app = build_app(settings, start_kernel(settings))
server = make_server("127.0.0.1", int(os.environ["BENCH_PORT"]), app, threaded=True)
server.daemon_threads = True
server.serve_forever()
"""


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` so far, together."""
    return sum(cpu_split(pid))


def start_kernel(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """The scripted kernel on a free port (``extra``: more of its flags); it and its URL."""
    cmd = [sys.executable, "-m", "agui_adapter.scripted_kernel", "--port", "0", "--token", TOKEN, *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    match = re.search(rb"READY (\S+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise SystemExit("could not start the scripted kernel")
    return proc, match.group(1).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_environ() -> dict[str, str]:
    """This environment without the adapter's own settings, unbuffered, the project importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    return env


def adapter_environ(env: dict[str, str], tmp: Path, kernel_url: str, **extra: str) -> dict[str, str]:
    """``env`` with the adapter's settings: the scripted kernel at ``kernel_url``, the state and
    the workspaces under ``tmp``, and ``extra``."""
    return dict(
        env,
        IAC_CODE_AGUI_A2A_URL=kernel_url,
        IAC_CODE_AGUI_A2A_TOKEN=TOKEN,
        IAC_CODE_AGUI_STATE_DIR=str(tmp / "state"),
        IAC_CODE_AGUI_ALLOWED_CWDS=str(tmp),
        **extra,
    )


def start_server(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """``cmd`` on a free port (``{port}`` in its arguments, ``BENCH_PORT`` in its environment),
    once its ``/health`` answers 200; the process and its port."""
    port = free_port()
    argv = [part.replace("{port}", str(port)) for part in cmd]
    return start_adapter(argv, port, dict(env, BENCH_PORT=str(port))), port


def start_adapter(cmd: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"could not start {cmd}")


def run_body(tmp: Path, text: str, index: int, valid: bool = True) -> bytes:
    body = {
        "threadId": f"bench-{index}-{time.monotonic_ns()}",
        "runId": f"run-{index}",
        "state": {},
        "tools": [],
        "context": [],
        "messages": [{"id": "m", "role": "user", "content": text}] if valid else "not a list",
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "b", "cwd": str(tmp / "ws")}},
    }
    return json.dumps(body).encode()


HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def rejections(port: int, pid: int, tmp: Path, clients: int, seconds: float) -> tuple[float, float]:
    """Requests/s and adapter CPU µs per request for ``clients`` keep-alive clients."""
    body = run_body(tmp, "x", 0, valid=False)
    counts = [0] * clients
    stop = threading.Event()

    def client(slot: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not stop.is_set():
            conn.request("POST", "/", body, HEADERS)
            response = conn.getresponse()
            response.read()
            assert response.status == 400, response.status
            counts[slot] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu_before
    total = sum(counts)
    return total / elapsed, cpu / max(total, 1) * 1e6


def first_events(port: int, tmp: Path, runs: int) -> tuple[float, float]:
    """p50 ms from sending a run to RUN_STARTED, and to the first text delta."""
    started_ms, delta_ms = [], []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for i in range(runs):
        body = run_body(tmp, "hello", i)
        sent = time.perf_counter()
        conn.request("POST", "/", body, HEADERS)
        response = conn.getresponse()
        assert response.status == 200, response.status
        data = b""
        t_started = t_delta = None
        while chunk := response.read1(65536):
            data += chunk
            now = time.perf_counter()
            if t_started is None and b'"RUN_STARTED"' in data:
                t_started = now
            if t_delta is None and b'"TEXT_MESSAGE_CONTENT"' in data:
                t_delta = now
        assert t_started is not None and t_delta is not None, data[:400]
        started_ms.append((t_started - sent) * 1000)
        delta_ms.append((t_delta - sent) * 1000)
        if response.will_close:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.close()
    return statistics.median(started_ms), statistics.median(delta_ms)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the rejection phase")
    parser.add_argument("--runs", type=int, default=40, help="short runs for the latency figures")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--reps", type=int, default=1, help="repetitions (medians are printed)")
    args = parser.parse_args()
    env = bench_environ()
    tmp = Path(tempfile.mkdtemp(prefix="agui-bench-edge-"))
    kernel, kernel_url = start_kernel(env)
    adapter_env = adapter_environ(env, tmp, kernel_url, IAC_CODE_AGUI_LOG_LEVEL="warning")
    servers = {
        "werkzeug dev server": [sys.executable, "-c", WERKZEUG_LAUNCHER],
        "built-in (http/server.py)": [sys.executable, "run.py", "--port", "{port}"],
    }
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in servers}
    try:
        for _ in range(args.reps):
            for name, cmd in servers.items():  # interleaved, rep by rep
                adapter, port = start_server(cmd, adapter_env)
                try:
                    first_events(port, tmp, 5)  # warm-up
                    rate, cpu = rejections(port, adapter.pid, tmp, args.clients, args.seconds)
                    started, delta = first_events(port, tmp, args.runs)
                    results[name].append((rate, cpu, started, delta))
                finally:
                    adapter.terminate()
                    adapter.wait(15)
    finally:
        kernel.terminate()
        kernel.wait(15)
    names = list(servers)
    print(f"| figure (median of {args.reps}) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    labels = [
        (f"pre-stream rejections/s, {args.clients} keep-alive clients", "{:,.0f}"),
        ("adapter CPU per rejected request, µs", "{:,.0f}"),
        ("time to RUN_STARTED, ms p50", "{:.1f}"),
        ("time to first text delta, ms p50", "{:.1f}"),
    ]
    for column, (label, fmt) in enumerate(labels):
        cells = [fmt.format(statistics.median(r[column] for r in results[name])) for name in names]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
