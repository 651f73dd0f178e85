"""Fixtures: the scripted kernel and the adapter on real loopback sockets.

``adapter`` starts the real WSGI app under the built-in server (``agui_adapter.serving``,
what ``python run.py`` uses) on a free port
(in this process, so tests can swap settings cheaply); ``adapter_process`` starts
``python run.py`` as a separate process for restart and kill scenarios. Every SSE
stream read through ``Client`` is checked against the AG-UI 1.0 models and lifecycle
rules, and recorded for the official client when ``AGUI_STREAM_DIR`` is set.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.config import Settings
from agui_adapter.kernel.scripted import ScriptedKernel
from agui_adapter.kernels import KernelProcess
from agui_adapter.server import build_app, server_limits
from agui_adapter.serving import WSGIServer

from .agui_stream import StreamRecorder, check_stream, parse_sse

ROOT = Path(__file__).resolve().parent.parent
RECORDER = StreamRecorder(os.environ.get("AGUI_STREAM_DIR"))
KERNEL_TOKEN = "scripted-kernel-token"

# Every secret any test sent, and every place the adapter could have written it down:
# checked once at the end of the session (no secret on disk, none in a log).
SENT_SECRETS: set[str] = set()
STATE_DIRS: list[Path] = []
ADAPTER_LOGS: list[Any] = []


def remember_secrets(body: Any) -> None:
    iac = body.get("forwardedProps", {}).get("iacCode", {}) if isinstance(body, dict) else {}
    if not isinstance(iac, dict):
        return
    cloud = iac.get("alibabaCloud") if isinstance(iac.get("alibabaCloud"), dict) else {}
    headers = iac.get("llmHeaders") if isinstance(iac.get("llmHeaders"), dict) else {}
    for value in [iac.get("llmApiKey"), cloud.get("accessKeySecret"), cloud.get("securityToken"), *headers.values()]:
        if isinstance(value, str) and len(value) >= 6:
            SENT_SECRETS.add(value)


@pytest.fixture(scope="session", autouse=True)
def no_secret_is_ever_written_down() -> Iterator[None]:
    yield
    leaks = []
    for directory in STATE_DIRS:
        for path in directory.rglob("*") if directory.exists() else []:
            if path.is_file():
                data = path.read_bytes()
                leaks += [f"{path}: {s[:4]}…" for s in SENT_SECRETS if s.encode() in data]
    for process in ADAPTER_LOGS:
        leaks += [f"adapter log: {s[:4]}…" for s in SENT_SECRETS if s.encode() in process.log]
    assert not leaks, f"secrets written down: {leaks}"


@pytest.fixture(scope="session")
def scripted_kernel() -> Iterator[ScriptedKernel]:
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.05)
    kernel.start()
    yield kernel
    kernel.stop()


@dataclass
class RunResult:
    status: int
    headers: dict[str, str]
    raw: bytes
    events: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def terminal(self) -> dict[str, Any]:
        return self.events[-1]

    def text(self) -> str:
        return "".join(e["delta"] for e in self.of("TEXT_MESSAGE_CONTENT"))


class Client:
    """A small AG-UI client over real HTTP."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.session = requests.Session()
        self.session.trust_env = False

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def run(
        self, body: dict[str, Any] | bytes, *, headers: dict[str, str] | None = None, check: bool = True
    ) -> RunResult:
        remember_secrets(body)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = self.session.post(self.url, data=data, headers=self.headers(headers), timeout=60)
        result = RunResult(response.status_code, dict(response.headers), response.content)
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            result.events = parse_sse(response.content)
            if check:
                check_stream(result.events)
            thread = body.get("threadId", "") if isinstance(body, dict) else ""
            RECORDER.record(str(thread), response.content)
        else:
            try:
                result.error = response.json().get("error")
            except ValueError:
                result.error = None
        return result

    def cancel(self, execution_id: str, body: dict[str, Any]) -> requests.Response:
        return self.session.post(
            f"{self.url}extensions/iac-code/v1/executions/{execution_id}/cancel",
            data=json.dumps(body),
            headers=self.headers(),
            timeout=30,
        )


def run_body(
    text: str | None = "hello",
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
    cwd: str,
    ros: str = "inv-1",
    resume: list[dict[str, Any]] | None = None,
    **props: Any,
) -> dict[str, Any]:
    iac: dict[str, Any] = {"schemaVersion": 1, "rosInvocationId": ros, "cwd": cwd}
    iac.update(props)
    body: dict[str, Any] = {
        "threadId": thread_id or f"thread-{uuid.uuid4().hex[:12]}",
        "runId": run_id or f"run-{uuid.uuid4().hex[:12]}",
        "state": {},
        "messages": [] if text is None else [{"id": f"m-{uuid.uuid4().hex[:8]}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {"iacCode": iac},
    }
    if resume is not None:
        body["resume"] = resume
    return body


class InProcessAdapter:
    """The adapter app served on a real loopback socket by the built-in threaded server."""

    def __init__(self, settings: Settings, kernel: KernelProcess) -> None:
        self.settings = settings
        self.kernel = kernel
        self.app = build_app(settings, kernel)
        self.server = WSGIServer("127.0.0.1", 0, self.app, server_limits(settings))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token if token is not None else (self.settings.auth_token or None))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def make_adapter(tmp_path: Path, scripted_kernel: ScriptedKernel) -> Iterator[Any]:
    started: list[InProcessAdapter] = []

    def factory(**overrides: Any) -> InProcessAdapter:
        base = Settings(
            state_dir=str(tmp_path / "state"),
            heartbeat_seconds=15.0,
            allowed_cwds=str(tmp_path),
        )
        settings = replace(base, **overrides)
        STATE_DIRS.append(Path(settings.state_dir))
        kernel = KernelProcess(scripted_kernel.url, KERNEL_TOKEN, "scripted")
        adapter = InProcessAdapter(settings, kernel)
        started.append(adapter)
        return adapter

    yield factory
    for adapter in started:
        adapter.stop()


@pytest.fixture
def adapter(make_adapter: Any) -> InProcessAdapter:
    return make_adapter()


@pytest.fixture
def client(adapter: InProcessAdapter) -> Client:
    return adapter.client()


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
                threading.Thread(target=self._drain, daemon=True).start()
                self.log = b"".join(lines)
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


@pytest.fixture
def adapter_process(tmp_path: Path, scripted_kernel: ScriptedKernel) -> Iterator[Any]:
    started: list[AdapterProcess] = []

    def factory(*extra: str, env: dict[str, str] | None = None, kernel_url: str | None = None) -> AdapterProcess:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
        environ.update(
            {
                "IAC_CODE_AGUI_A2A_TOKEN": KERNEL_TOKEN,
                "IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path),
                "PYTHONUNBUFFERED": "1",
            }
        )
        environ.update(env or {})
        args = [
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
            "--a2a-url",
            kernel_url or scripted_kernel.url,
            *extra,
        ]
        process = AdapterProcess(args, environ).start()
        STATE_DIRS.append(tmp_path / "state")
        ADAPTER_LOGS.append(process)
        started.append(process)
        return process

    yield factory
    for process in started:
        process.stop()
