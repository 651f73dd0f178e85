#!/usr/bin/env python3
"""Readers benchmark: what clients following runs on the events route cost, and how late they are.

Not collected by pytest (prints figures, asserts nothing). Starts the scripted kernel
(``--delay-scale`` seconds per script second) and ``python run.py`` in front of it, as
separate processes on loopback, then:

- **idle readers**: ten runs whose kernel is silent (``[SILENT 1200]``), each followed by its
  own client and by ``--readers`` / 10 readers on ``GET /threads/{t}/runs/{r}/events``; the
  adapter's CPU (user and system, from /proc) per second over ``--window`` seconds, once all
  readers have their first events. With the journal's bell (``state/journal_bell.py``), a
  reader in the process that runs the run waits for its run's next append or its heartbeat
  (15 s by default), and its client's hang-up is told by the server: nothing to do.
- **reader lag**: ``--lag-runs`` runs of ten deltas (``[SLOW]``, ``--delay-scale`` seconds
  apart), each read by its own client and one reader at once; for each event after the session
  event, how long after the run's own client the reader got it (median and worst).

Run: ``python tests/bench_readers.py [--readers N] [--window S] [--lag-runs K] [--delay-scale S]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_edge import adapter_environ, bench_environ, cpu_split, run_body, start_kernel, start_server


def post_run(port: int, body: bytes) -> tuple[socket.socket, bytes]:
    """A run started on a raw socket, read up to its session event."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        "POST / HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock, read_until(sock, b"iac-code.session.v1")


def follow_run(port: int, thread_id: str, run_id: str) -> socket.socket:
    """A reader of the run on the events route, from its first event."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"GET /threads/{thread_id}/runs/{run_id}/events HTTP/1.1\r\nHost: bench\r\n"
        "Accept: text/event-stream\r\nLast-Event-ID: 0\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        data = sock.recv(65536)
        if not data:
            raise SystemExit("the adapter closed a stream")
        seen += data
    return seen


def arrivals(sock: socket.socket, out: dict[int, float]) -> None:
    """When each event id arrived on ``sock``, up to the run's end."""
    buffer = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return
        now = time.monotonic()
        buffer += data
        *frames, buffer = buffer.split(b"\n\n")
        for frame in frames:
            at = frame.find(b"id: ")
            if at >= 0:
                out[int(frame[at + 4 : frame.index(b"\n", at)])] = now
            if b"RUN_FINISHED" in frame or b"RUN_ERROR" in frame:
                return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--lag-runs", type=int, default=5)
    parser.add_argument("--delay-scale", type=float, default=0.033)
    args = parser.parse_args()
    env = bench_environ()
    tmp = Path(tempfile.mkdtemp(prefix="agui-bench-readers-"))
    (tmp / "ws").mkdir()
    kernel, kernel_url = start_kernel(env, "--delay-scale", str(args.delay_scale))
    adapter, port = start_server([sys.executable, "run.py", "--port", "{port}"], adapter_environ(env, tmp, kernel_url))
    sockets: list[socket.socket] = []
    try:
        runs = []
        for index in range(10):
            body = run_body(tmp, "[SILENT 1200] think", index)
            sock, _ = post_run(port, body)
            sockets.append(sock)
            runs.append((json.loads(body)["threadId"], f"run-{index}"))
        for index in range(args.readers):
            reader = follow_run(port, *runs[index % len(runs)])
            read_until(reader, b"iac-code.session.v1")
            sockets.append(reader)
        time.sleep(1.0)  # the readers' first looks are over
        user0, system0 = cpu_split(adapter.pid)
        started = time.monotonic()
        time.sleep(args.window)
        user1, system1 = cpu_split(adapter.pid)
        elapsed = time.monotonic() - started
        print(
            f"{args.readers} idle readers of 10 silent runs: adapter CPU {1e3 * (user1 - user0) / elapsed:.1f} ms/s"
            f" user, {1e3 * (system1 - system0) / elapsed:.1f} ms/s system"
        )
        lags: list[float] = []
        for index in range(args.lag_runs):
            body = run_body(tmp, "[SLOW] count", 100 + index)
            own, _ = post_run(port, body)
            reader = follow_run(port, json.loads(body)["threadId"], f"run-{100 + index}")
            own_at: dict[int, float] = {}
            reader_at: dict[int, float] = {}
            pair = [threading.Thread(target=arrivals, args=(s, d)) for s, d in ((own, own_at), (reader, reader_at))]
            for thread in pair:
                thread.start()
            for thread in pair:
                thread.join(120)
            lags += [1e3 * (reader_at[i] - own_at[i]) for i in own_at if i in reader_at]
            own.close()
            reader.close()
        if lags:
            print(
                f"reader lag behind the run's own client ({len(lags)} events, deltas {args.delay_scale:g} s apart):"
                f" median {statistics.median(lags):.2f} ms, worst {max(lags):.2f} ms"
            )
    finally:
        for sock in sockets:
            sock.close()
        adapter.terminate()
        adapter.wait(15)
        kernel.terminate()
        kernel.wait(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
