"""The scripted kernel keeps its sessions across restarts, and leaves no temporary folder behind.

Real processes and real signals: ``python -m agui_adapter.scripted_kernel --state-dir DIR``
is started, driven over its HTTP JSON-RPC, stopped with SIGTERM or SIGINT, and
started again on the same directory (issue 9: a restarted ``python run.py`` must
continue the conversations of its embedded kernel).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "persistence-test-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
SECRETS = {
    "llmApiKey": "sk-llm-secret-4f1c",
    "accessKeyId": "LTAI-id-secret-77aa",
    "accessKeySecret": "access-key-secret-9b2e",
    "securityToken": "security-token-secret-c3d0",
}


class KernelProcess:
    """One ``python -m agui_adapter.scripted_kernel`` child with its own TMPDIR."""

    def __init__(self, state_dir: Path | None, tmpdir: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["TMPDIR"] = str(tmpdir)
        env["PERSISTENCE_TEST_TOKEN"] = TOKEN
        command = [sys.executable, "-m", "agui_adapter.scripted_kernel", "--port", "0"]
        command += ["--token-env", "PERSISTENCE_TEST_TOKEN"]
        if state_dir is not None:
            command += ["--state-dir", str(state_dir)]
        command += ["--delay-scale", "0"]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO_ROOT)
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready, "no READY line"
        match = re.fullmatch(r"READY (http://127\.0\.0\.1:\d+/)\n", self.proc.stdout.readline())
        assert match, "bad READY line"
        self.url = match.group(1)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)
        assert self.proc.wait(timeout=15) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def frames(self, text: str, context_id: str, iac: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The results of one SendStreamingMessage turn, in order."""
        message = {
            "messageId": f"m-{os.urandom(4).hex()}",
            "role": "ROLE_USER",
            "contextId": context_id,
            "parts": [{"text": text}],
            "metadata": {"iac_code": iac or {}},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": message}}
        response = requests.post(self.url, json=body, headers=HEADERS, timeout=30)
        assert response.status_code == 200
        results = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        assert results and all("result" in r for r in results), response.text[:500]
        return [r["result"] for r in results]

    def get(self, path: str, **params: str) -> requests.Response:
        return requests.get(self.url + path, params=params, headers=HEADERS, timeout=10)

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(self.url + path, json=body, headers=HEADERS, timeout=10)


def session_of(frames: list[dict[str, Any]]) -> str:
    ids = {
        f["statusUpdate"]["metadata"]["iac_code"]["iacCodeSessionId"]
        for f in frames
        if "iacCodeSessionId" in f.get("statusUpdate", {}).get("metadata", {}).get("iac_code", {})
    }
    assert len(ids) == 1, ids
    return ids.pop()


def final_text(frames: list[dict[str, Any]]) -> str:
    finals = [
        f["statusUpdate"]["status"]["message"]["parts"][0]["text"]
        for f in frames
        if "assistantFinal" in f.get("statusUpdate", {}).get("metadata", {}).get("iac_code", {})
    ]
    assert len(finals) == 1
    return finals[0]


def pipeline_sequences(frames: list[dict[str, Any]]) -> list[int]:
    sequences: list[int] = []
    for frame in frames:
        iac = frame.get("statusUpdate", {}).get("metadata", {}).get("iac_code", {})
        envelopes = [iac["pipeline"]] if "pipeline" in iac else iac.get("pipelineBatch", {}).get("events", [])
        sequences += [int(e["sequence"]) for e in envelopes]
    return sequences


def leftover_temp_folders(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.iterdir() if p.name.startswith("scripted-kernel-"))


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    state, tmpdir, workspace = tmp_path / "state" / "scripted-kernel", tmp_path / "tmp", tmp_path / "ws"
    tmpdir.mkdir()
    workspace.mkdir()
    yield state, tmpdir, workspace


@pytest.fixture
def started() -> Iterator[list[KernelProcess]]:
    """Every kernel process a test starts; killed if the test left it running."""
    processes: list[KernelProcess] = []
    yield processes
    for process in processes:
        process.kill()


def test_a_restarted_kernel_continues_the_session_and_recalls_earlier_turns(
    dirs: tuple[Path, Path, Path], started: list[KernelProcess]
) -> None:
    state, tmpdir, workspace = dirs
    iac = {"cwd": str(workspace), "alibabaCloud": {k: v for k, v in SECRETS.items() if k != "llmApiKey"}}
    iac["llmApiKey"] = SECRETS["llmApiKey"]

    first = KernelProcess(state, tmpdir)
    started.append(first)
    one = first.frames("[RECALL] remember the marker text-9d1e", "ctx-persist", iac)
    two = first.frames("[RECALL]", "ctx-persist", iac)
    session_id = session_of(one)
    assert session_of(two) == session_id
    assert final_text(two) == "This context has seen 2 user turns."
    assert leftover_temp_folders(tmpdir)  # the default workspace of this kernel exists while it runs
    first.stop(signal.SIGTERM)
    assert leftover_temp_folders(tmpdir) == []

    second = KernelProcess(state, tmpdir)
    started.append(second)
    again = second.frames("[RECALL]", "ctx-persist", {"cwd": str(workspace)})
    assert session_of(again) == session_id
    assert final_text(again) == "This context has seen 3 user turns."
    restored = second.post("iac-code/session/ensure-restored", {"cwd": str(workspace), "sessionId": session_id})
    assert (restored.status_code, restored.json()) == (200, {"status": "current"})
    other = second.frames("[RECALL]", "ctx-new", {"cwd": str(workspace)})
    assert session_of(other) != session_id
    assert final_text(other) == "This context has seen 1 user turns."
    # The workspace binding survives too: after the restart, another cwd for the old context fails.
    moved = second.frames("hello", "ctx-persist", {"cwd": str(tmpdir)})
    assert moved[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_FAILED"
    second.stop(signal.SIGINT)
    assert leftover_temp_folders(tmpdir) == []


def test_the_state_directory_is_private_and_holds_no_secret_and_no_message_text(
    dirs: tuple[Path, Path, Path], started: list[KernelProcess]
) -> None:
    state, tmpdir, workspace = dirs
    kernel = KernelProcess(state, tmpdir)
    started.append(kernel)
    iac = {"cwd": str(workspace), "llmApiKey": SECRETS["llmApiKey"], "alibabaCloud": dict(SECRETS)}
    kernel.frames("[ECHO] the marker text-5a7c", "ctx-secret", iac)
    kernel.stop()

    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["sessions.json"]  # no temporary file left from the atomic writes
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        content = path.read_text(encoding="utf-8")
        for secret in (*SECRETS.values(), TOKEN, "text-5a7c"):
            assert secret not in content
    assert "ctx-secret" in json.loads(files[0].read_text(encoding="utf-8"))["contexts"]


def test_pipeline_sequences_go_on_across_a_restart(dirs: tuple[Path, Path, Path], started: list[KernelProcess]) -> None:
    state, tmpdir, workspace = dirs
    iac = {"cwd": str(workspace), "run_mode": "pipeline"}
    first = KernelProcess(state, tmpdir)
    started.append(first)
    before = pipeline_sequences(first.frames("build a site", "ctx-pipe", iac))
    assert before
    first.stop()

    second = KernelProcess(state, tmpdir)
    started.append(second)
    after = pipeline_sequences(second.frames("build another", "ctx-pipe", iac))
    assert after and min(after) == max(before) + 1
    second.stop()


def test_without_a_state_directory_a_restart_forgets_the_session(tmp_path: Path, started: list[KernelProcess]) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    first = KernelProcess(None, tmpdir)
    started.append(first)
    session_id = session_of(first.frames("[RECALL]", "ctx-forget"))
    first.stop()
    assert leftover_temp_folders(tmpdir) == []
    second = KernelProcess(None, tmpdir)
    started.append(second)
    again = second.frames("[RECALL]", "ctx-forget")
    assert session_of(again) != session_id
    assert final_text(again) == "This context has seen 1 user turns."
    second.stop()


def test_the_adapter_starts_its_scripted_kernel_on_a_state_directory(tmp_path: Path) -> None:
    from agui_adapter.config import Settings
    from agui_adapter.kernel_client.launch import start_scripted

    settings = Settings(state_dir=str(tmp_path / "adapter-state"), kernel="scripted")
    kernel = start_scripted(settings, delay_scale=0.0)
    try:
        message = {"messageId": "m-1", "role": "ROLE_USER", "contextId": "ctx-wired", "parts": [{"text": "hi"}]}
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": message}}
        headers = {"Authorization": f"Bearer {kernel.token}", "A2A-Version": "1.0"}
        assert requests.post(kernel.url, json=body, headers=headers, timeout=30).status_code == 200
    finally:
        kernel.stop()
    sessions = tmp_path / "adapter-state" / "scripted-kernel" / "sessions.json"
    assert "ctx-wired" in json.loads(sessions.read_text(encoding="utf-8"))["contexts"]
