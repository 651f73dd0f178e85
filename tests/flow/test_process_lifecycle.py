"""``python run.py`` as systemd and upstream's deployments run it, through real sockets.

systemd (``Type=notify``) is played by a datagram socket bound as ``$NOTIFY_SOCKET``: the
adapter says ``READY=1`` once ``/health`` answers (every ``/health`` asked from then on, by a
poller running since before the start, is answered 200), pings ``WATCHDOG=1`` again and again at
``$WATCHDOG_USEC``/2, and says ``STOPPING=1`` on SIGTERM before it exits 0. An abstract
``@name`` address works the same. ``--idle-shutdown`` ends the process when no run is
active and no interrupt waits, not while an interrupt waits for its answer. Upstream's own
documented YAML config (``tests/data/upstream/agui.yaml``) starts the adapter unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import requests

from tests.support.agui_client import Client, resume, run_body
from tests.support.ports import free_port
from tests.support.servers import ROOT, AdapterProcess

UPSTREAM_CONFIG = ROOT / "tests" / "data" / "upstream" / "agui.yaml"


def _environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("IAC_CODE_AGUI_", "NOTIFY_", "WATCHDOG_"))}
    environ.update({"IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)})
    environ.update(extra)
    return environ


class Systemd:
    """Collects the datagrams sent to the bound notify socket, with the time each arrived."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self.closed = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._changed:
                self.messages.append((time.monotonic(), data.decode()))
                self._changed.notify_all()

    def wait_for(self, field: str, count: int = 1, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [m for _, m in self.messages if field in m.split("\n")]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"no {count}x {field} within {timeout}s: {self.messages}"
                self._changed.wait(left)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def _start(args: list[str], environ: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


class HealthPoller:
    """Asks ``/health`` on ``port`` every few milliseconds from the start: (start time, answered 200)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.attempts: list[tuple[float, bool]] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                ok = requests.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
            except requests.RequestException:
                ok = False
            self.attempts.append((started, ok))
            time.sleep(0.005)


def _notify_run(tmp_path: Path, address: str | bytes, notify_socket: str) -> None:
    systemd = Systemd(address)
    environ = _environ(tmp_path, NOTIFY_SOCKET=notify_socket, WATCHDOG_USEC="400000")
    port = free_port()
    poller = HealthPoller(port)
    proc = _start(["--kernel", "scripted", "--port", str(port), "--state-dir", str(tmp_path / "state")], environ)
    try:
        [ready] = systemd.wait_for("READY=1")
        ready_time = next(t for t, m in systemd.messages if "READY=1" in m)
        assert f"STATUS=listening on 127.0.0.1:{port}, kernel scripted" in ready.split("\n"), ready
        # what READY=1 vouches for: /health answers, from then on
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        deadline = time.monotonic() + 10
        while not [ok for t, ok in poller.attempts if t > ready_time] and time.monotonic() < deadline:
            time.sleep(0.01)
        poller.stopped.set()
        after = [ok for t, ok in poller.attempts if t > ready_time]
        assert after and all(after), poller.attempts[-20:]
        assert not [m for _, m in systemd.messages if "STOPPING=1" in m]
        systemd.wait_for("WATCHDOG=1", count=3)  # pings repeat (every 0.2 s here)
        watchdog_times = [t for t, m in systemd.messages if m == "WATCHDOG=1"]
        assert all(t > ready_time for t in watchdog_times)
        proc.send_signal(signal.SIGTERM)
        systemd.wait_for("STOPPING=1")
        assert proc.wait(30) == 0
    finally:
        poller.stopped.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        systemd.close()


def test_ready_after_health_answers_then_watchdog_pings_then_stopping(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    _notify_run(tmp_path, path, path)


def test_an_abstract_notify_socket(tmp_path: Path) -> None:
    name = f"agui-notify-{uuid.uuid4().hex}"
    _notify_run(tmp_path, b"\0" + name.encode(), "@" + name)


def test_without_notify_socket_nothing_changes(tmp_path: Path) -> None:
    adapter = AdapterProcess(["--kernel", "scripted", "--port", "0", "--state-dir", str(tmp_path)], _environ(tmp_path))
    adapter.start()
    try:
        assert requests.get(adapter.url + "health", timeout=5).status_code == 200
    finally:
        assert adapter.stop() == 0


def _wait_exit(proc: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
    assert proc is not None
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def test_idle_shutdown_waits_for_a_pending_interrupt_then_exits(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    adapter = AdapterProcess(
        ["--kernel", "scripted", "--port", "0", "--state-dir", str(tmp_path / "state"), "--idle-shutdown", "3"],
        _environ(tmp_path),
    ).start()
    try:
        client = Client(adapter.url)
        body = run_body("[ASK] where?", cwd=str(workspace))
        asked = client.run(body)
        [interrupt] = asked.terminal["outcome"]["interrupts"]
        # an interrupt waits for its answer: the process stays (twice the idle time). (3 s, not
        # less: the start counts as activity, and a loaded machine may take a second or more
        # from the adapter's start to the first run.)
        assert _wait_exit(adapter.proc, 6.0) is None
        answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"selectedId": "sh"}}]
        assert client.run(resume(body, answer)).terminal["type"] == "RUN_FINISHED"
        assert _wait_exit(adapter.proc, 30.0) == 0
        deadline = time.monotonic() + 10  # the reader thread may still be taking in the last lines
        while b"idle for 3s (--idle-shutdown): stopping" not in adapter.log and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b"idle for 3s (--idle-shutdown): stopping" in adapter.log
    finally:
        adapter.stop()


def test_upstreams_documented_yaml_config_starts_the_adapter(tmp_path: Path) -> None:
    """Upstream's example, with only its port changed to a free one and its state in tmp_path."""
    config = tmp_path / "agui.yaml"
    text = UPSTREAM_CONFIG.read_text(encoding="utf-8")
    port = free_port()
    text = text.replace("port: 8000", f"port: {port}").replace('state_dir: ""', f"state_dir: {tmp_path / 'state'}")
    config.write_text(text + "idle_shutdown: 30\nlog_stdout: true\n", encoding="utf-8")
    environ = _environ(tmp_path, IAC_CODE_AGUI_KERNEL="scripted")
    adapter = AdapterProcess(["--config", str(config), "-d"], environ).start()
    try:
        assert adapter.url == f"http://127.0.0.1:{port}/"
        workspace = tmp_path / "ws"
        workspace.mkdir()
        result = Client(adapter.url).run(run_body("hello", cwd=str(workspace)))
        assert result.terminal["type"] == "RUN_FINISHED"
        assert b" DEBUG " in adapter.log  # -d: debug lines
    finally:
        assert adapter.stop() == 0


def test_a_bad_upstream_config_exits_with_the_key_named(tmp_path: Path) -> None:
    config = tmp_path / "agui.yaml"
    config.write_text("port: true\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "--config", str(config)],
        env=_environ(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "port" in done.stderr
