#!/usr/bin/env python3
"""Throughput benchmark: 20,000 text deltas from the scripted kernel through the adapter.

Not collected by pytest (prints figures, asserts nothing). Starts the scripted kernel and
the adapter (``python run.py``) as separate processes on loopback, posts one run whose
kernel side streams N deltas as fast as it can, reads the AG-UI stream to its end, and
prints the events/s delivered to the client and the adapter's CPU time per event
(user + system, from /proc). Run: ``python tests/bench_throughput.py [--deltas N] [--runs K]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(cmd: list[str], pattern: bytes, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        match = re.search(pattern, line)
        if match:
            return proc, match.group(1).decode()
    proc.kill()
    raise SystemExit(f"could not start {cmd}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_health(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deltas", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--upstream",
        metavar="VENV",
        help="measure upstream's `iac-code agui` from this venv instead (pip install 'iac-code[agui,a2a]==0.16.0')",
    )
    args = parser.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    tmp = Path(tempfile.mkdtemp(prefix="agui-bench-"))
    kernel, kernel_url = start(
        [sys.executable, "-m", "agui_adapter.scripted_kernel", "--port", "0", "--token", TOKEN], rb"READY (\S+)", env
    )
    if args.upstream:
        port = free_port()
        adapter = subprocess.Popen(
            [
                str(Path(args.upstream) / "bin" / "iac-code"),
                "agui",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--a2a-url",
                kernel_url,
                "--state-dir",
                str(tmp / "state"),
            ],
            cwd=tmp,
            env=dict(env, IAC_CODE_AGUI_A2A_TOKEN=TOKEN, IAC_CODE_CONFIG_DIR=str(tmp / "cfg")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/"
        wait_for_health(url)
    else:
        adapter, url = start(
            [
                sys.executable,
                "run.py",
                "--port",
                "0",
                "--a2a-url",
                kernel_url,
                "--a2a-token",
                TOKEN,
                "--state-dir",
                str(tmp / "state"),
            ],
            rb"listening on (http://\S+/)",
            dict(env, IAC_CODE_AGUI_ALLOWED_CWDS=str(tmp), IAC_CODE_AGUI_LOG_LEVEL="info"),
        )
    try:
        session = requests.Session()
        session.trust_env = False
        print(f"{args.deltas} deltas per run, {args.runs} runs (adapter pid {adapter.pid})")
        rates, cpus = [], []
        for i in range(args.runs):
            body = {
                "threadId": f"bench-{i}",
                "runId": f"run-{i}",
                "state": {},
                "tools": [],
                "context": [],
                "messages": [{"id": "m", "role": "user", "content": f"[FAST {args.deltas}]"}],
                "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "b", "cwd": str(tmp / "ws")}},
            }
            cpu_before = cpu_seconds(adapter.pid)
            started = time.perf_counter()
            events = reads = 0
            tail = b""
            with session.post(
                url,
                data=json.dumps(body),
                stream=True,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            ) as r:
                for chunk in r.iter_content(None):
                    reads += 1
                    # frames are "data: ..." or, numbered (reattach), "id: N\ndata: ..."
                    events += chunk.count(b"\ndata: ") + (1 if chunk.startswith(b"data: ") else 0)
                    tail = (tail + chunk)[-4096:]
            elapsed = time.perf_counter() - started
            cpu = cpu_seconds(adapter.pid) - cpu_before
            assert b'"RUN_FINISHED"' in tail, tail[-500:]
            rates.append(events / elapsed)
            cpus.append(cpu / events * 1e6)
            print(
                f"run {i}: {events} events in {elapsed:.3f} s = {events / elapsed:,.0f} events/s; "
                f"adapter CPU {cpu:.3f} s = {cpu / events * 1e6:.1f} us/event; {reads} reads"
            )
        print(
            f"median: {statistics.median(rates):,.0f} events/s, {statistics.median(cpus):.1f} us CPU/event; "
            f"best: {max(rates):,.0f} events/s, {min(cpus):.1f} us CPU/event"
        )
    finally:
        for proc in (adapter, kernel):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
