"""`--kernel iac-code`: the adapter spawns the real `iac-code a2a` itself, and stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.support.agui_client import Client, run_body
from tests.support.servers import ROOT, wait_until_unreachable

from .harness import RealKernel


def test_adapter_spawns_and_stops_the_real_kernel(real_kernel: RealKernel, tmp_path: Path) -> None:
    env = real_kernel.environment()
    env.pop("IACCODE_A2A_HTTP_TOKEN", None)  # the adapter makes its own random token
    env["PATH"] = f"{real_kernel.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["IAC_CODE_AGUI_ALLOWED_CWDS"] = str(real_kernel.workdir)
    env["IAC_CODE_AGUI_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "--port", "0", "--kernel", "iac-code"],
        cwd=real_kernel.workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    kernel_url = ""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        line = b""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or b"listening on" in line:
                break
        match = re.search(rb"listening on (http://\S+/) \(kernel: iac-code at (http://\S+/)", line)
        assert match, line
        url, kernel_url = (m.decode() for m in match.groups())
        assert requests.get(url + "ready", timeout=10).status_code == 200
        # the spawned kernel has a random bearer token of its own
        assert requests.get(kernel_url + "health", timeout=5).status_code == 401
        workspace = real_kernel.workdir / "spawned-ws"
        result = Client(url).run(run_body("hello from the spawn test", cwd=str(workspace)), check=True)
        assert result.terminal["type"] == "RUN_FINISHED" and "fake LLM" in result.text()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    wait_until_unreachable(kernel_url + "health", 10)  # the spawned kernel does not outlive the adapter
