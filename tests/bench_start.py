#!/usr/bin/env python3
"""Start-up benchmark: exec to the first ``/health`` 200, idle RSS, and the import breakdown.

Not collected by pytest (prints figures, asserts nothing; never a timed test). By default
the adapter is pointed at an external scripted kernel started once beforehand
(``--a2a-url``), so that the kernel's own start is not counted; ``--spawn`` measures
``python run.py --kernel scripted`` instead (the adapter starts and waits for its kernel
child; the RSS is still the adapter process's alone). For each of ``--starts`` starts it
prints the time from ``exec`` to the first ``GET /health`` answered 200 (polled every
2 ms on a port chosen beforehand), then the adapter's resident set size after
``--settle`` seconds of idleness (``VmRSS`` from ``/proc``); then the medians; then the
median start of a bare interpreter (``python -c pass``) and the load average, for context;
then the top imports of ``python -X importtime -c "import agui_adapter.cli"`` by cumulative time,
and which optional heavy modules a bare start imports (none of jsonschema, requests, PIL,
prometheus_client should).

Every module's bytecode is compiled by one warm-up start (not counted) into a temporary
``PYTHONPYCACHEPREFIX`` and reused, as it is for a package pip installed, even where
``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it: compiling the adapter's sources
would then add about 0.2 s to every start); ``--as-is`` measures with the environment as it is.

Run: ``python tests/bench_start.py [--starts N] [--spawn] [--settle S] [--as-is]``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-start-token"
#: Where the compiled bytecode of every module goes (``PYTHONPYCACHEPREFIX``), set by ``main``.
PYCACHE: str | None = None
HEAVY = ("jsonschema", "requests", "urllib3", "PIL", "prometheus_client", "orjson", "werkzeug")


def _environ() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    environ.update({"PYTHONPATH": str(ROOT), "AGUI_BENCH_KERNEL_TOKEN": TOKEN, "IAC_CODE_AGUI_A2A_TOKEN": TOKEN})
    if PYCACHE is not None:  # bytecode compiled once and reused, as for an installed package
        environ.pop("PYTHONDONTWRITEBYTECODE", None)
        environ["PYTHONPYCACHEPREFIX"] = PYCACHE
    return environ


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_kernel(state: Path) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "agui_adapter.scripted_kernel", "--host", "127.0.0.1", "--port", "0"]
    command += ["--token-env", "AGUI_BENCH_KERNEL_TOKEN", "--state-dir", str(state)]
    proc = subprocess.Popen(command, cwd=ROOT, env=_environ(), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"the scripted kernel did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def one_start(kernel_url: str | None, state: Path, settle: float) -> tuple[float, float]:
    port = _free_port()
    args = ["--port", str(port), "--state-dir", str(state), "--log-level", "warning"]
    args += ["--a2a-url", kernel_url] if kernel_url else ["--kernel", "scripted"]
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, env=_environ())
    try:
        deadline = started + 60
        while not _health(port):
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise SystemExit("the adapter did not start")
            time.sleep(0.002)
        elapsed = time.perf_counter() - started
        time.sleep(settle)
        return elapsed, _rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def import_breakdown(top: int) -> None:
    code = f"import sys, agui_adapter.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_environ(), capture_output=True, check=True)  # warm
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=ROOT,
        env=_environ(),
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative_us), int(self_us), name.rstrip()))
    total = next((c for c, _, n in rows if n.strip() == "agui_adapter.cli"), 0)
    print(f"\nimport agui_adapter.cli: {total / 1000:.0f} ms cumulative; top imports by cumulative time:")
    for cumulative, own, name in sorted(rows, reverse=True)[:top]:
        print(f"  {cumulative / 1000:7.1f} ms  (self {own / 1000:5.1f})  {name}")
    print(f"optional heavy modules imported by a bare start: {done.stdout.strip()}")


def interpreter_baseline(starts: int) -> float:
    """Median wall time of ``python -c pass`` (the interpreter's own start, ``site`` included)."""
    times = []
    for _ in range(starts):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], cwd=ROOT, env=_environ(), check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--spawn", action="store_true", help="python run.py --kernel scripted (kernel child included)")
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds before reading the RSS")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="keep this environment's bytecode settings (e.g. PYTHONDONTWRITEBYTECODE=1: every start compiles)",
    )
    args = parser.parse_args()
    global PYCACHE
    with tempfile.TemporaryDirectory() as tmp:
        if not args.as_is:
            PYCACHE = str(Path(tmp) / "pycache")
        kernel = None if args.spawn else start_kernel(Path(tmp) / "kernel")
        try:
            if not args.as_is:
                one_start(None if kernel is None else kernel[1], Path(tmp) / "warm-up", 0.0)  # writes the bytecode
            times, rss = [], []
            for index in range(args.starts):
                elapsed, resident = one_start(
                    None if kernel is None else kernel[1], Path(tmp) / f"s{index}", args.settle
                )
                times.append(elapsed)
                rss.append(resident)
                print(f"start {index + 1}: exec -> /health 200 {elapsed * 1000:6.0f} ms, idle RSS {resident:5.1f} MiB")
        finally:
            if kernel is not None:
                kernel[0].terminate()
                kernel[0].wait(10)
        mode = "--kernel scripted (spawned)" if args.spawn else "external kernel (--a2a-url)"
        print(
            f"\n{mode}, {args.starts} starts: median exec -> /health {statistics.median(times) * 1000:.0f} ms "
            f"(min {min(times) * 1000:.0f}), median idle RSS {statistics.median(rss):.1f} MiB"
        )
        baseline = interpreter_baseline(args.starts)
        print(f"for comparison: python -c pass, median {baseline * 1000:.0f} ms; load average {os.getloadavg()[0]:.1f}")
        import_breakdown(args.top)


if __name__ == "__main__":
    main()
