"""The real ``iac-code a2a`` kernel, started by ``run.py --kernel iac-code``, dies with its adapter.

Real processes and real signals (issue 9, case 3, with the real kernel): the adapter is killed
with SIGKILL or SIGTERM and no process of the kernel's process group may survive it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.processes import children, cmdline, stat_fields
from tests.support.servers import ROOT

from .harness import require_kernel_venv

pytestmark = [
    pytest.mark.realkernel,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc"),
]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and fields[0] != b"Z" and int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


@pytest.fixture
def adapter_with_real_kernel(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    venv = require_kernel_venv()
    home = tmp_path / "home"
    (home / ".iac-code").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("IAC_CODE_", "IACCODE_"))}
    env.update(
        {
            "PATH": os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
            "HOME": str(home),
            "IAC_CODE_CONFIG_DIR": str(home / ".iac-code"),
            "IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path),
            "DISABLE_TELEMETRY": "1",
            "IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        "--port",
        "0",
        "--kernel",
        "iac-code",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[bytes] = []
    match = None
    deadline = time.monotonic() + 120
    while match is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(rb"listening on (http://\S+/)", line)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the kernel's log pipe drained
    try:
        assert match is not None, b"".join(lines).decode(errors="replace")
        yield proc, match.group(1).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_no_process_of_the_kernel_group_survives_the_adapter(
    adapter_with_real_kernel: tuple[subprocess.Popen[bytes], str], signum: int
) -> None:
    proc, url = adapter_with_real_kernel
    assert requests.get(url + "ready", timeout=30).status_code == 200
    [supervisor] = children(proc.pid)
    pgid = supervisor  # the lifeline leads the kernel's group
    members = group_members(pgid)
    assert any("iac-code" in cmdline(pid) and " a2a" in cmdline(pid) for pid in members), members
    assert proc.pid not in members  # the adapter is not in the kernel's group
    os.kill(proc.pid, signum)
    proc.wait(30)
    deadline = time.monotonic() + 15
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = group_members(pgid)
    for pid in survivors:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert survivors == []
