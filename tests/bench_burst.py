#!/usr/bin/env python3
"""Burst benchmark: C clients start a run at the same instant; how long the last waits.

Not collected by pytest (prints figures, asserts nothing). It measures what the shared
bench's ``concurrency`` phase reports as the worst first delta of 200 streams, with the
project's own pieces, so that a change to a run's start can be tried before and after,
interleaved, without the shared bench. Starts the scripted kernel (``[SLOW]`` turns: ten
deltas ``--delay-scale`` seconds apart, the first after one such pause) and two servers in
front of it, as separate processes on loopback:

- ``pass-through``: this file's floor, a byte pass-through on the standard library's
  threaded server (one thread per connection, keep-alive, one ``SendStreamingMessage`` per
  request, the kernel's SSE relayed chunk by chunk, nothing validated, stored or translated);
- ``adapter``: ``python run.py``.

Each burst opens C connections, waits until all are open, then sends C run requests at once
and reads each stream to its first text delta (the text of the first ``[SLOW]`` piece) and on
to its end. It prints, per burst and server, the worst and the median time from sending to
the first delta, less the kernel's own pause before it, and the server's CPU (user and
system, from /proc) per run over the whole burst; then the medians of the bursts and the
ratio of the worst first deltas. Bursts alternate between the servers (``--bursts`` each).

Run: ``python tests/bench_burst.py [--clients C] [--bursts K] [--delay-scale S]``.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_edge import (
    HEADERS,
    TOKEN,
    adapter_environ,
    bench_environ,
    cpu_split,
    run_body,
    start_kernel,
    start_server,
)

#: The text of the first ``[SLOW]`` piece: where both servers' streams show the first delta.
FIRST_PIECE = b"Slowly"

PASS_THROUGH = r"""
import http.client, json, os, sys, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KERNEL = urllib.parse.urlsplit(os.environ["BENCH_KERNEL_URL"])

class PassThrough(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._reply(200, b'{"status":"ok"}', "application/json")

    def do_POST(self):
        run = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        message = {"messageId": run["runId"], "role": "ROLE_USER", "contextId": "ctx-" + run["threadId"],
                   "parts": [{"text": run["messages"][-1]["content"]}],
                   "metadata": {"iac_code": {"cwd": run["forwardedProps"]["iacCode"]["cwd"]}}}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                           "params": {"message": message}}).encode()
        kernel = http.client.HTTPConnection(KERNEL.hostname, KERNEL.port)
        kernel.request("POST", "/", body, {"Content-Type": "application/json", "A2A-Version": "1.0",
                                           "Authorization": "Bearer " + os.environ["BENCH_KERNEL_TOKEN"]})
        answer = kernel.getresponse()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while chunk := answer.read1(65536):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        kernel.close()

    def _reply(self, status, body, media_type):
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", int(os.environ["BENCH_PORT"])), PassThrough).serve_forever()
"""


def one_stream(port: int, body: bytes, opened: threading.Barrier, out: list[float | None], slot: int) -> None:
    """Send one run once every client is connected; the seconds to its first delta."""
    request = (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n" % len(body)
        + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in HEADERS.items())
        + b"\r\n"
        + body
    )
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        opened.wait(60)
        sent = time.monotonic()
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        seen = b""
        while chunk := response.read1(65536):
            if out[slot] is None:
                seen = seen[-len(FIRST_PIECE) :] + chunk
                if FIRST_PIECE in seen:
                    out[slot] = time.monotonic() - sent
        response.close()


def burst(port: int, pid: int, tmp: Path, clients: int) -> tuple[float, float, float, float]:
    """One burst: worst and median seconds to the first delta, user and system CPU per run."""
    bodies = [run_body(tmp, "[SLOW] burst", index) for index in range(clients)]
    out: list[float | None] = [None] * clients
    opened = threading.Barrier(clients)
    threads = [
        threading.Thread(target=one_stream, args=(port, bodies[i], opened, out, i), daemon=True) for i in range(clients)
    ]
    user, system = cpu_split(pid)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    user_after, system_after = cpu_split(pid)
    firsts = [t for t in out if t is not None]
    if len(firsts) != clients:
        raise SystemExit(f"{clients - len(firsts)} of {clients} streams showed no delta")
    return max(firsts), statistics.median(firsts), (user_after - user) / clients, (system_after - system) / clients


def _figures(name: str, worst: float, median: float, user: float, system: float, pause: float) -> str:
    return (
        f"{name:13s} worst {worst - pause:6.3f} s  median {median - pause:6.3f} s"
        f"  CPU/run user {user * 1e3:5.2f} ms system {system * 1e3:5.2f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=5, help="bursts per server (alternating)")
    parser.add_argument("--delay-scale", type=float, default=0.3, help="seconds between the kernel's deltas")
    args = parser.parse_args()
    env = bench_environ()
    tmp = Path(tempfile.mkdtemp(prefix="agui-bench-burst-"))
    (tmp / "ws").mkdir()
    kernel, kernel_url = start_kernel(env, "--delay-scale", str(args.delay_scale))
    server_env = adapter_environ(env, tmp, kernel_url, BENCH_KERNEL_URL=kernel_url, BENCH_KERNEL_TOKEN=TOKEN)
    servers = {
        "pass-through": [sys.executable, "-c", PASS_THROUGH],
        "adapter": [sys.executable, "run.py", "--port", "{port}"],
    }
    started = {}
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in servers}
    try:
        for name, cmd in servers.items():
            started[name] = start_server(cmd, server_env)
        print(f"{args.clients} clients, kernel deltas {args.delay_scale:g} s apart; figures less that first pause")
        for index in range(args.bursts):
            for name, (proc, port) in started.items():  # interleaved, burst by burst
                worst, median, user, system = burst(port, proc.pid, tmp, args.clients)
                results[name].append((worst, median, user, system))
                print(f"{index} {_figures(name, worst, median, user, system, args.delay_scale)}", flush=True)
                time.sleep(10 * args.delay_scale + 1)  # the streams end before the next burst
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(15)
        kernel.terminate()
        kernel.wait(15)
    print("medians:")
    for name, rows in results.items():
        worst, median, user, system = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"  {_figures(name, worst, median, user, system, args.delay_scale)}")
    floor, ours = (statistics.median(r[0] for r in results[n]) - args.delay_scale for n in servers)
    print(f"worst first delta, adapter / pass-through: {ours / floor:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
