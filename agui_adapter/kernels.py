"""Choosing and launching the execution kernel.

``--kernel auto`` (the default) uses a configured ``--a2a-url`` when there is one;
else it spawns ``iac-code a2a`` like upstream does (free loopback port, random bearer
token, readiness wait, ``--thinking-exposure all``) when iac-code is installed, and
the embedded scripted kernel otherwise. Both children are real processes reached over
HTTP; ``KernelProcess.stop()`` ends them (terminate, then kill).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import requests

from .a2a import check_kernel_url
from .config import Settings

log = logging.getLogger("agui_adapter.kernels")


class KernelStartError(RuntimeError):
    """The kernel could not be started or did not become ready."""


@dataclass
class KernelProcess:
    """A kernel the adapter talks to; ``process`` is set when the adapter started it."""

    url: str
    token: str = field(repr=False)
    kind: str
    process: subprocess.Popen[bytes] | None = None

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def iac_code_executable() -> str | None:
    return shutil.which("iac-code")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, token: str, deadline: float) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise KernelStartError(f"the kernel exited during start-up (exit code {code}).")
        try:
            if requests.get(url + "health", headers=headers, timeout=0.5).status_code == 200:
                return
        except requests.RequestException:
            pass
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
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
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
        "agui_adapter.kernel",
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
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
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
