"""Choosing and launching the execution kernel.

``--kernel auto`` (the default) uses a configured ``--a2a-url`` when there is one;
else it spawns ``iac-code a2a`` like upstream does (free loopback port, random bearer
token, readiness wait, ``--thinking-exposure all``) when iac-code is installed, and
the embedded scripted kernel otherwise. Both children are real processes reached over
HTTP; ``KernelProcess.stop()`` ends them (terminate, then kill).

Every kernel child is started through the lifeline supervisor (``lifeline.py``, see its
docstring): the kernel and everything it starts live in one process group of their own, the
whole group is stopped on ``stop()``, and the group is stopped too when the adapter dies
without running any code (``kill -9``, an OOM kill, a gunicorn worker killed on timeout),
because the supervisor watches a pipe only the adapter holds open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import check_kernel_url

log = logging.getLogger("agui_adapter.kernel_client.launch")

LIFELINE = Path(__file__).with_name("lifeline.py")
#: Seconds the lifeline gives the kernel's group between SIGTERM and SIGKILL.
LIFELINE_GRACE = 3.0


class KernelStartError(RuntimeError):
    """The kernel could not be started or did not become ready."""


@dataclass
class KernelProcess:
    """A kernel the adapter talks to; ``process`` is set when the adapter started it."""

    url: str
    token: str = field(repr=False)
    kind: str
    process: subprocess.Popen[bytes] | None = None
    owner_pid: int = field(default_factory=os.getpid, repr=False)

    @property
    def health_kind(self) -> str:
        """What ``/health`` calls this kernel: ``scripted``, ``iac-code`` (spawned) or ``external`` (configured)."""
        return self.kind if self.kind in ("scripted", "iac-code") else "external"

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the kernel's process group, then kill it; a no-op in a forked child."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if os.getpid() != self.owner_pid:
            return  # a forked worker (gunicorn --preload) must not stop its parent's kernel
        try:
            if proc.poll() is not None:
                return
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait(timeout)
        finally:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's whole group when it leads one of its own, else the process."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
            return
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()


def spawn_kernel(command: list[str], env: dict[str, str], *, stdout: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``command`` under the lifeline supervisor (see ``lifeline.py``).

    The returned process is the supervisor: it leads the kernel's process group (so its pid
    is the group id), exits with the kernel's status, and its stdin is the lifeline, which
    the adapter keeps open and never writes to.
    """
    lifeline = [sys.executable, "-I", str(LIFELINE), "--grace", str(LIFELINE_GRACE), "--"]
    return subprocess.Popen(
        [*lifeline, *command], env=env, stdin=subprocess.PIPE, stdout=stdout, start_new_session=True
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def iac_code_executable() -> str | None:
    return shutil.which("iac-code")


def _healthy(url: str, token: str, timeout: float) -> bool:
    """``GET <url>health`` with the token answers 200 (``http.client``: the kernels it starts
    are ``http://`` on loopback, and ``requests`` is not imported for it, ``a2a._requests``)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        connection.request("GET", (parts.path or "/") + "health", headers={"Authorization": f"Bearer {token}"})
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, token: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise KernelStartError(f"the kernel exited during start-up (exit code {code}).")
        if _healthy(url, token, 0.5):
            return
        time.sleep(0.1)
    raise KernelStartError("the kernel did not become ready in time.")


def start_iac_code(settings: Settings, executable: str) -> KernelProcess:
    port, token = free_port(), secrets.token_urlsafe(32)
    url = f"http://127.0.0.1:{port}/"
    env = dict(os.environ)
    env["IACCODE_A2A_HTTP_TOKEN"] = token
    roots = settings.allowed_cwds or env.get("IAC_CODE_AGUI_ALLOWED_CWDS", "")
    if roots and not env.get("IACCODE_A2A_ALLOWED_CWDS"):
        env["IACCODE_A2A_ALLOWED_CWDS"] = roots
    command = [executable, "a2a", "--host", "127.0.0.1", "--port", str(port), "--thinking-exposure", "all"]
    proc = spawn_kernel(command, env)
    kernel = KernelProcess(url, token, "iac-code", proc)
    try:
        _wait_ready(proc, url, token, time.monotonic() + settings.kernel_ready_timeout)
    except BaseException:
        kernel.stop()
        raise
    return kernel


def start_scripted(settings: Settings, *, delay_scale: float = 1.0) -> KernelProcess:
    token = secrets.token_urlsafe(32)
    env = dict(os.environ)
    env["AGUI_SCRIPTED_KERNEL_TOKEN"] = token  # not on the command line: ps would show it
    command = [
        sys.executable,
        "-m",
        "agui_adapter.scripted_kernel",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--token-env",
        "AGUI_SCRIPTED_KERNEL_TOKEN",
        "--delay-scale",
        str(delay_scale),
        "--state-dir",  # sessions survive a restart of the adapter (and of this kernel)
        str(settings.resolved_state_dir() / "scripted-kernel"),
    ]
    proc = spawn_kernel(command, env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    result: dict[str, str] = {}

    def read_ready() -> None:
        line = proc.stdout.readline().decode("utf-8", "replace").strip() if proc.stdout else ""
        result["line"] = line

    reader = threading.Thread(target=read_ready, daemon=True)
    reader.start()
    reader.join(settings.kernel_ready_timeout)
    line = result.get("line", "")
    if not line.startswith("READY "):
        KernelProcess("", token, "scripted", proc).stop()
        raise KernelStartError("the scripted kernel did not start.")
    kernel = KernelProcess(line.split(" ", 1)[1].strip(), token, "scripted", proc)
    _wait_ready(proc, kernel.url, token, time.monotonic() + settings.kernel_ready_timeout)
    return kernel


def start_kernel(settings: Settings) -> KernelProcess:
    """The kernel for these settings: configured, spawned iac-code, or scripted."""
    if settings.a2a_url:
        url = check_kernel_url(settings.a2a_url, allow_remote=settings.allow_remote_kernel)
        return KernelProcess(url, settings.a2a_token, "configured")
    if settings.kernel in ("auto", "iac-code"):
        executable = iac_code_executable()
        if executable:
            return start_iac_code(settings, executable)
        if settings.kernel == "iac-code":
            raise KernelStartError("--kernel iac-code was asked for, but iac-code is not installed.")
    return start_scripted(settings)
