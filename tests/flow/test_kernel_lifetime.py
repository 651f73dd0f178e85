"""A kernel child dies with its adapter, however the adapter dies (issue 9, case 3).

Real processes and real signals: ``python run.py --kernel scripted`` is started as a
subprocess, its kernel child is found through ``/proc``, the adapter is killed (SIGKILL,
SIGTERM) and the kernel must be gone within seconds. The lifeline supervisor is also driven
directly, with a "kernel" that has children of its own and one that ignores SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from agui_adapter.kernel_client.launch import KernelProcess, spawn_kernel
from tests.support.processes import children, cmdline, descendants, stat_fields
from tests.support.servers import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


# --- /proc helpers --------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process, or None when it no longer exists."""
    fields = stat_fields(pid)
    return None if fields is None else (fields[0].decode(), int(fields[19]))


class Watched:
    """A process identified by pid and start time, so a reused pid is not mistaken for it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        stat = _stat(pid)
        assert stat is not None, f"process {pid} is already gone"
        self.start = stat[1]
        self.cmdline = cmdline(pid)

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"

    def __repr__(self) -> str:
        return f"<{self.pid} {self.cmdline[:80]!r}>"


def wait_gone(processes: list[Watched], timeout: float) -> list[Watched]:
    """The processes still alive after ``timeout`` seconds (empty when all ended)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if p.alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.fixture
def reaper() -> Iterator[list[Watched]]:
    """Processes a test started; any still alive at the end are SIGKILLed (by pid)."""
    started: list[Watched] = []
    yield started
    for process in started:
        if process.alive():
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- the adapter as a process -------------------------------------------------------------


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    url: str
    family: list[Watched]  # every descendant of the adapter: lifeline supervisor, kernel, ...


@pytest.fixture
def start_adapter(tmp_path: Path, reaper: list[Watched]) -> Iterator[Callable[..., Started]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, env: dict[str, str] | None = None, timeout: float = 90) -> Started:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH", "")]))
        environ["PYTHONUNBUFFERED"] = "1"
        environ["IAC_CODE_AGUI_ALLOWED_CWDS"] = str(tmp_path)
        environ.update(env or {})
        command = [sys.executable, str(ROOT / "run.py"), "--port", "0", "--state-dir", str(tmp_path / "state"), *extra]
        proc = subprocess.Popen(command, cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        assert proc.stdout is not None
        lines: list[bytes] = []
        deadline = time.monotonic() + timeout
        match = None
        while match is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(rb"listening on (http://\S+/)", line)
        assert match is not None, b"".join(lines).decode(errors="replace")
        family = [Watched(pid) for pid in descendants(proc.pid)]
        reaper.extend(family)
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
        return Started(proc, match.group(1).decode(), family)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _kernel_of(family: list[Watched], marker: str) -> Watched:
    kernels = [p for p in family if marker in p.cmdline and "lifeline" not in p.cmdline]
    assert len(kernels) == 1, family
    return kernels[0]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_scripted_kernel_dies_with_the_adapter(start_adapter: Callable[..., Started], signum: int) -> None:
    adapter = start_adapter("--kernel", "scripted")
    kernel = _kernel_of(adapter.family, "agui_adapter.scripted_kernel")
    assert kernel.alive()
    assert requests.get(adapter.url + "ready", timeout=10).status_code == 200
    os.kill(adapter.proc.pid, signum)
    adapter.proc.wait(20)
    assert wait_gone(adapter.family, 10) == []


def test_adapter_killed_mid_stream_takes_its_kernel_along(
    start_adapter: Callable[..., Started], tmp_path: Path
) -> None:
    """kill -9 while a turn streams: the kernel child, busy serving it, still goes."""
    adapter = start_adapter("--kernel", "scripted")
    body = {
        "threadId": "t-lifetime",
        "runId": "r-1",
        "state": {},
        "tools": [],
        "context": [],
        "messages": [{"id": "m1", "role": "user", "content": "[SLOW] hello"}],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": str(tmp_path / "ws")}},
    }
    seen: list[bytes] = []
    streaming = threading.Event()

    def stream() -> None:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        try:
            data = json.dumps(body)
            with requests.post(adapter.url, data=data, headers=headers, stream=True, timeout=30) as response:
                for line in response.iter_lines():
                    seen.append(line)
                    if b"TEXT_MESSAGE_CONTENT" in line:
                        streaming.set()
        except requests.RequestException:
            pass

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert streaming.wait(30), seen
    os.kill(adapter.proc.pid, signal.SIGKILL)
    adapter.proc.wait(20)
    assert wait_gone(adapter.family, 10) == []
    reader.join(10)
    assert not any(b"RUN_FINISHED" in line for line in seen)  # it really was killed mid-stream


# --- the lifeline supervisor on its own ---------------------------------------------------


def _family_of(proc: subprocess.Popen[bytes], count: int, reaper: list[Watched]) -> list[Watched]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = descendants(proc.pid)
        if len(pids) >= count:
            family = [Watched(pid) for pid in pids]
            reaper.extend(family)
            return family
        time.sleep(0.05)
    pytest.fail(f"expected {count} descendants of the supervisor, found {descendants(proc.pid)}")


def test_closing_the_lifeline_stops_the_kernel_and_its_children(reaper: list[Watched]) -> None:
    proc = spawn_kernel(["sh", "-c", "sleep 300 & sleep 301 & wait"], dict(os.environ))
    reaper.append(Watched(proc.pid))
    family = _family_of(proc, 3, reaper)  # sh, two sleeps
    assert all(os.getpgid(p.pid) == proc.pid for p in family)
    assert proc.stdin is not None
    proc.stdin.close()  # what the OS does when the adapter dies
    assert proc.wait(15) == 128 + signal.SIGTERM
    assert wait_gone(family, 5) == []


def test_a_kernel_ignoring_sigterm_is_killed_after_the_grace_period(reaper: list[Watched]) -> None:
    proc = spawn_kernel(["sh", "-c", "trap '' TERM; sleep 300 & wait; wait"], dict(os.environ))
    reaper.append(Watched(proc.pid))
    family = _family_of(proc, 2, reaper)
    began = time.monotonic()
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(20) == 128 + signal.SIGKILL
    assert time.monotonic() - began >= 2.5  # the grace period was given
    assert wait_gone(family, 5) == []


def test_stop_terminates_the_whole_group_and_the_exit_status_is_the_kernels(reaper: list[Watched]) -> None:
    proc = spawn_kernel(["sh", "-c", "sleep 300 & wait"], dict(os.environ))
    supervisor = Watched(proc.pid)
    reaper.append(supervisor)
    family = _family_of(proc, 2, reaper)
    KernelProcess("http://127.0.0.1:1/", "t", "test", proc).stop()
    assert proc.returncode == 128 + signal.SIGTERM
    assert wait_gone([supervisor, *family], 5) == []

    quick = spawn_kernel([sys.executable, "-c", "raise SystemExit(7)"], dict(os.environ))
    assert quick.wait(15) == 7  # a kernel that exits by itself: the supervisor reports its status


def test_stop_falls_back_to_killing_the_group(reaper: list[Watched]) -> None:
    """When the supervisor does not end in time, stop() SIGKILLs the whole group."""
    proc = spawn_kernel(["sh", "-c", "trap '' TERM; sleep 300 & wait; wait"], dict(os.environ))
    supervisor = Watched(proc.pid)
    reaper.append(supervisor)
    family = _family_of(proc, 2, reaper)
    began = time.monotonic()
    KernelProcess("http://127.0.0.1:1/", "t", "test", proc).stop(timeout=0.5)
    assert time.monotonic() - began < 2.5  # before the supervisor's own grace period ran out
    assert proc.returncode == -signal.SIGKILL
    assert wait_gone([supervisor, *family], 5) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_kernel_whose_supervisor_is_killed_alone_gets_sigterm(reaper: list[Watched]) -> None:
    marker = "time.sleep(300)  # kernel"
    proc = spawn_kernel([sys.executable, "-c", f"import time; {marker}"], dict(os.environ))
    reaper.append(Watched(proc.pid))
    family = _family_of(proc, 1, reaper)
    kernel = Watched(family[0].pid)  # the pid is found at fork: wait until it runs the kernel
    deadline = time.monotonic() + 30
    while marker not in cmdline(kernel.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker in cmdline(kernel.pid), family
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor only, not the group
    assert proc.wait(30) == -signal.SIGKILL
    assert wait_gone(family, 30) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_stop_signal_between_fork_and_exec_still_stops_the_kernel() -> None:
    """The kernel child runs the supervisor's signal handlers until it execs; a SIGTERM in that
    window (here: the supervisor "died" before prctl, so the child signals itself) must not be
    swallowed by them."""
    script = (
        "import signal, subprocess, sys\n"
        "from agui_adapter.kernel_client.lifeline import _parent_death_signal\n"
        "for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(signum, lambda *_: None)  # what the supervisor installs\n"
        "child = subprocess.Popen(['sleep', '120'], preexec_fn=_parent_death_signal(0))\n"
        "try:\n"
        "    print(child.wait(30))\n"
        "finally:\n"
        "    child.kill()\n"
    )
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, timeout=90)
    assert result.stdout.split() == [str(-signal.SIGTERM).encode()], result.stderr.decode(errors="replace")


def test_stop_in_a_forked_child_leaves_the_parents_kernel_alone(tmp_path: Path) -> None:
    """gunicorn --preload: workers forked from the process that started the kernel must not stop it."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, sys\n"
        "from agui_adapter.kernel_client.launch import KernelProcess, spawn_kernel\n"
        "kernel = KernelProcess('u', 't', 'x', spawn_kernel(['sleep', '300'], dict(os.environ)))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    kernel.stop()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "alive_after_child = kernel.process.poll() is None\n"
        "kernel.stop()\n"
        "print(alive_after_child, kernel.process is None)\n"
    )
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, timeout=60)
    assert result.stdout.split() == [b"True", b"True"], result.stderr.decode(errors="replace")


# --- under gunicorn: one kernel per worker ----------------------------------------------------


@pytest.mark.wsgi_servers
def test_a_gunicorn_worker_killed_takes_its_kernel_along(tmp_path: Path, reaper: list[Watched]) -> None:
    pytest.importorskip("gunicorn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    environ.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH", "")])),
            "IAC_CODE_AGUI_KERNEL": "scripted",
            "IAC_CODE_AGUI_STATE_DIR": str(tmp_path / "state"),
        }
    )
    command = [
        sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "4", "-w", "1",
        "--graceful-timeout", "5", "-b", f"127.0.0.1:{port}", "agui_adapter.wsgi:application",
    ]  # fmt: skip
    log = (tmp_path / "gunicorn.log").open("wb")
    master = subprocess.Popen(command, cwd=tmp_path, env=environ, stdout=log, stderr=subprocess.STDOUT)
    reaper.append(Watched(master.pid))

    def worker_kernel(exclude: set[int]) -> tuple[Watched, list[Watched]]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a worker that answers, so its kernel is up
            try:
                if requests.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        while time.monotonic() < deadline:
            for worker in children(master.pid):
                if worker in exclude:
                    continue
                family = [Watched(pid) for pid in descendants(worker) if _stat(pid)]
                if any("agui_adapter.scripted_kernel" in p.cmdline and "lifeline" not in p.cmdline for p in family):
                    reaper.extend(family)
                    return Watched(worker), family
            time.sleep(0.1)
        pytest.fail(f"no worker with a kernel: {(tmp_path / 'gunicorn.log').read_text(errors='replace')}")

    try:
        worker, family = worker_kernel(set())
        os.kill(worker.pid, signal.SIGKILL)
        assert wait_gone(family, 10) == []
        new_worker, new_family = worker_kernel({worker.pid})  # gunicorn starts a new worker, with a kernel
        master.send_signal(signal.SIGTERM)
        master.wait(30)
        assert wait_gone([new_worker, *new_family], 10) == []
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        log.close()
