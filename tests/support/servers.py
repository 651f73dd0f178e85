"""The adapter under test, served on real loopback sockets.

``InProcessAdapter`` serves the WSGI app under the built-in server (``agui_adapter.http.server``,
what ``python run.py`` uses) in this process (so tests can swap settings cheaply);
``AdapterProcess`` runs ``python run.py`` as a child process, for restart, kill and
real-kernel scenarios. ``wait_until_unreachable`` proves a process stopped.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from agui_adapter.cli import build_app, server_limits
from agui_adapter.config import Settings
from agui_adapter.http.server import WSGIServer
from agui_adapter.kernel_client.launch import KernelProcess
from tests.support.agui_client import Client

ROOT = Path(__file__).resolve().parents[2]


class InProcessAdapter:
    """The adapter app served on a real loopback socket by the built-in threaded server."""

    def __init__(
        self,
        settings: Settings,
        kernel: KernelProcess,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.kernel = kernel
        self.app = build_app(settings, kernel, clock=clock, monotonic=monotonic)
        self.server = WSGIServer("127.0.0.1", 0, self.app, server_limits(settings))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token if token is not None else (self.settings.auth_token or None))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class AdapterProcess:
    """``python run.py`` as a child process on a free port."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log = b""

    def start(self, timeout: float = 30.0) -> AdapterProcess:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "run.py"), *self.args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        lines: list[bytes] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(rb"listening on (http://\S+/)", line)
            if match:
                self.url = match.group(1).decode()
                self.log = b"".join(lines)  # before the drain thread appends to it
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        self.stop()
        raise RuntimeError("adapter did not start:\n" + b"".join(lines).decode(errors="replace"))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log += line

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def wait_until_unreachable(url: str, timeout: float) -> None:
    """Fail unless nothing answers at ``url`` within ``timeout`` seconds (a stopped process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=0.5)
        except requests.ConnectionError:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} still answers")
