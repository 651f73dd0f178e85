"""CopilotKit's runtime in front of the adapter, for ``tests/compat/test_copilotkit.py``.

``RuntimeServer`` runs the recipe's ``examples/copilotkit/server.mjs`` as written (a
byte-identical copy beside a ``node_modules`` link, since Node's ES modules resolve packages
from the importing file's directory and ignore ``NODE_PATH``); ``Frontend`` is
``frontend.mjs``, which drives the runtime with the React front end's own agent class
(@copilotkit/core's ``ProxiedCopilotRuntimeAgent``), one JSON command per line.

The peers (``@copilotkit/runtime`` 1.75.0, ``@copilotkit/core`` 1.74.0 as the latest
``@copilotkit/react-core`` uses it, and the ``@ag-ui/client`` 0.0.59 both depend on, pinned in
``.ci/setup-peers.sh``) live in their own prefix, env ``AGUI_COPILOTKIT_MODULES``,
default ``~/.cache/agui-adapter/copilotkit/node_modules``. ``require_copilotkit()`` fails
under ``CI=true`` and skips otherwise when node or the modules are missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "examples" / "copilotkit"
FRONTEND = Path(__file__).resolve().with_name("frontend.mjs")
DEFAULT_MODULES = Path("~/.cache/agui-adapter/copilotkit/node_modules")
MODULES_ENV = "AGUI_COPILOTKIT_MODULES"
#: What .ci/setup-peers.sh pins (the runtime's v2 single route is what its React front end speaks).
RUNTIME_VERSION = "1.75.0"
#: The environment every Node process of the suite gets: no telemetry leaves the machine.
QUIET = {"COPILOTKIT_TELEMETRY_DISABLED": "true", "DO_NOT_TRACK": "1", "SCARF_ANALYTICS": "false"}


def modules_dir() -> Path | None:
    path = Path(os.environ.get(MODULES_ENV) or str(DEFAULT_MODULES)).expanduser()
    runtime = path / "@copilotkit" / "runtime" / "package.json"
    core = path / "@copilotkit" / "core" / "package.json"
    if not (runtime.is_file() and core.is_file()):
        return None
    if json.loads(runtime.read_text()).get("version") != RUNTIME_VERSION:
        return None
    return path


def require_copilotkit() -> Path:
    """The ``node_modules`` holding the pinned runtime; fail under CI, skip otherwise."""
    reason = None
    if shutil.which("node") is None:
        reason = "node is not installed (CopilotKit's runtime needs Node.js >= 18)"
    elif modules_dir() is None:
        reason = (
            f"@copilotkit/runtime@{RUNTIME_VERSION} not found in ${MODULES_ENV} "
            f"(default {DEFAULT_MODULES}); run .ci/setup-peers.sh"
        )
    if reason is None:
        modules = modules_dir()
        assert modules is not None
        return modules
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def app_dir(tmp: Path, modules: Path) -> Path:
    """A directory holding copies of the recipe's server and the front-end driver beside a
    ``node_modules`` link, so that both import the pinned packages."""
    app = tmp / "copilotkit-app"
    app.mkdir(exist_ok=True)
    link = app / "node_modules"
    if not link.exists():
        link.symlink_to(modules, target_is_directory=True)
    shutil.copyfile(RECIPE / "server.mjs", app / "server.mjs")
    shutil.copyfile(FRONTEND, app / "frontend.mjs")
    return app


class RuntimeServer:
    """``node server.mjs`` (the recipe) on a free port, in front of ``adapter_url``."""

    def __init__(self, app: Path, adapter_url: str, env: dict[str, str] | None = None) -> None:
        self.app = app
        self.env = {**os.environ, **QUIET, "PORT": "0", "AGUI_ADAPTER_URL": adapter_url, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log = b""

    def start(self, timeout: float = 60.0) -> RuntimeServer:
        self.proc = subprocess.Popen(
            ["node", "server.mjs"], cwd=self.app, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log += line
            match = re.search(rb"CopilotKit runtime on (http://\S+)", line)
            if match:
                self.url = match.group(1).decode()
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        self.stop()
        raise RuntimeError("the CopilotKit runtime did not start:\n" + self.log.decode(errors="replace"))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log += line

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Frontend:
    """``node frontend.mjs``: the React front end's agent, one command at a time."""

    def __init__(self, app: Path, runtime_url: str) -> None:
        env = {**os.environ, **QUIET, "COPILOTKIT_RUNTIME_URL": runtime_url}
        self.proc = subprocess.Popen(
            ["node", "frontend.mjs"],
            cwd=app,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.stderr = b""
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._next = 0

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr += line

    def call(self, op: str, timeout: float = 120.0, **command: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (the driver answers in order)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._next += 1
        self.proc.stdin.write((json.dumps({"id": self._next, "op": op, **command}) + "\n").encode())
        self.proc.stdin.flush()
        timer = threading.Timer(timeout, self.proc.kill)  # a hung driver fails the test, not the suite
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        assert line, f"the front-end driver died:\n{self.stderr.decode(errors='replace')[-4000:]}"
        answer: dict[str, Any] = json.loads(line)
        assert answer["id"] == self._next
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def types(answer: dict[str, Any]) -> list[str]:
    return [event["type"] for event in answer["events"]]


def terminal(answer: dict[str, Any]) -> dict[str, Any]:
    ends = [e for e in answer["events"] if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert ends, f"no terminal event: {types(answer)} {answer.get('error')}"
    return ends[-1]  # type: ignore[no-any-return]
