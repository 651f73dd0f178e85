"""Runs the real iac-code 0.16.0 A2A kernel on loopback against the project's fake LLM.

``RealKernel`` is a context manager: it starts :class:`FakeLLM` (in-process, on a free port)
and ``<venv>/bin/iac-code a2a`` (a subprocess, on another free port) with

* bearer auth (``IACCODE_A2A_HTTP_TOKEN``),
* ``HOME`` and ``IAC_CODE_CONFIG_DIR`` inside a private temp dir,
* the offline environment: provider "OpenAI Compatible" on loopback, a model name that makes
  the kernel use its heuristic token counter (no tiktoken download), telemetry and
  non-essential traffic off,
* raw thinking and tool traces exposed (``--thinking-exposure raw-thinking tool-trace``),
* cwd = ``workdir``, which is also the only entry of ``IACCODE_A2A_ALLOWED_CWDS``,

waits for ``GET /health`` and stops both on exit. ``restart()`` stops and starts only the
kernel, on the same port and config dir (persisted tasks/contexts survive).

The venv comes from :func:`find_kernel_venv` (env ``AGUI_IAC_CODE_VENV``, default
``~/.cache/agui-adapter/iac-code-0.16.0``); ``.ci/setup-peers.sh`` creates it.

Small JSON-RPC helpers (:meth:`RealKernel.rpc`, :meth:`RealKernel.stream`) use only the
standard library so the tests do not depend on the adapter under test.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest
import requests

from tests.support.agui_client import RunResult, run_body, session_value
from tests.support.fake_llm import FakeLLM, message_text, read_log
from tests.support.ports import free_port
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS
from tests.support.servers import AdapterProcess

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_VENV = Path("~/.cache/agui-adapter/iac-code-0.16.0")
VENV_ENV = "AGUI_IAC_CODE_VENV"
INSTALL_COMMAND = (
    "python3 -m venv ~/.cache/agui-adapter/iac-code-0.16.0 && "
    "~/.cache/agui-adapter/iac-code-0.16.0/bin/pip install "
    "'iac-code[a2a]==0.16.0' 'a2a-sdk[http-server,signing]==1.2.0'   (or run .ci/setup-peers.sh)"
)
# Must not start with gpt-/claude/o3/o4, or the kernel fetches tiktoken encodings.
MODEL_NAME = "fake-model"
_SCRUBBED_PREFIXES = (
    "IAC_CODE_",
    "IACCODE_",
    "OPENAI_",
    "ANTHROPIC_",
    "DASHSCOPE_",
)


def find_kernel_venv() -> Path | None:
    """The kernel venv (env ``AGUI_IAC_CODE_VENV`` or the default), if ``bin/iac-code`` exists."""
    raw = os.environ.get(VENV_ENV) or str(DEFAULT_VENV)
    venv = Path(raw).expanduser()
    return venv if (venv / "bin" / "iac-code").exists() else None


def require_kernel_venv() -> Path:
    """The kernel venv; ``pytest.fail`` under ``CI=true`` and ``pytest.skip`` otherwise when missing."""
    venv = find_kernel_venv()
    if venv is not None:
        return venv
    message = f"iac-code 0.16.0 kernel venv not found (AGUI_IAC_CODE_VENV); install it with: {INSTALL_COMMAND}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' if missing)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class KernelStartError(RuntimeError):
    """The kernel process died or did not become healthy in time."""


class A2AStreamError(RuntimeError):
    """An A2A request failed at the HTTP level."""


class RealKernel:
    """The real ``iac-code a2a`` kernel plus the fake LLM, on loopback (a context manager)."""

    def __init__(
        self,
        venv: Path | None = None,
        *,
        token: str = "test-token",
        thinking_exposure: Iterable[str] = ("raw-thinking", "tool-trace"),
        extra_args: Iterable[str] = (),
        extra_env: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        startup_timeout: float = 60.0,
        slow_interval: float | None = None,
        keep_tmp: bool | None = None,
    ) -> None:
        found = venv or find_kernel_venv()
        if found is None:
            raise KernelStartError(f"iac-code kernel venv not found; install it with: {INSTALL_COMMAND}")
        self.venv = Path(found)
        self.token = token
        self.thinking_exposure = list(thinking_exposure)
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        self.startup_timeout = startup_timeout
        self.keep_tmp = bool(os.environ.get("AGUI_KEEP_KERNEL_TMP")) if keep_tmp is None else keep_tmp
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="agui-realkernel-", dir=base_dir)).resolve()
        self.home = self.tmp_dir / "home"
        self.config_dir = self.home / ".iac-code"
        self.workdir = self.tmp_dir / "work"
        self.log_path = self.tmp_dir / "kernel.log"
        self.llm_log_path = self.tmp_dir / "llm-requests.jsonl"
        for directory in (self.home, self.config_dir, self.workdir):
            directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.llm = FakeLLM(self.llm_log_path, slow_interval=slow_interval)
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._ids = itertools.count(1)
        self.boot_seconds = 0.0

    # ----------------------------------------------------------------- properties

    @property
    def url(self) -> str:
        """Base URL of the kernel, without a trailing slash (JSON-RPC is ``POST {url}/``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def llm_url(self) -> str:
        """Base URL of the fake LLM (``.../v1``)."""
        return self.llm.base_url

    @property
    def kernel_server_log(self) -> Path:
        """The kernel's own log file inside its config dir."""
        return self.config_dir / "logs" / "a2a-server.log"

    def llm_requests(self) -> list[dict[str, Any]]:
        """Every chat-completions request the fake LLM has seen, oldest first."""
        return list(read_log(self.llm_log_path))

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Headers for a JSON-RPC request: bearer auth, ``A2A-Version: 1.0``, JSON body."""
        result = {
            "Authorization": f"Bearer {self.token}",
            "A2A-Version": "1.0",
            "Content-Type": "application/json",
        }
        result.update(extra or {})
        return result

    # ------------------------------------------------------------------ lifecycle

    def environment(self) -> dict[str, str]:
        """The kernel's process environment (inherited env minus provider settings, plus ours)."""
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_SCRUBBED_PREFIXES)}
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
        env.update(
            {
                "HOME": str(self.home),
                "IAC_CODE_CONFIG_DIR": str(self.config_dir),
                "IAC_CODE_PROVIDER": "OpenAI Compatible",
                "IAC_CODE_BASE_URL": self.llm.base_url,
                "IAC_CODE_API_KEY": "fake-key",
                "IAC_CODE_MODEL": MODEL_NAME,
                "DISABLE_TELEMETRY": "1",
                "IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "IACCODE_A2A_HTTP_TOKEN": self.token,
                "IACCODE_A2A_ALLOWED_CWDS": str(self.workdir),
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def command(self) -> list[str]:
        """The kernel command line."""
        args = [
            str(self.venv / "bin" / "iac-code"),
            "a2a",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for kind in self.thinking_exposure:
            args += ["--thinking-exposure", kind]
        return args + self.extra_args

    def start(self) -> Self:
        """Start the fake LLM (if not running) and the kernel; wait until healthy."""
        self.llm.start()
        self._start_kernel()
        return self

    def _start_kernel(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"\n===== starting kernel on port {self.port} at {time.ctime()} =====\n".encode())
        self._log_file.flush()
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_healthy()
        except BaseException:
            self._stop_kernel()
            raise
        self.boot_seconds = time.monotonic() - started

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise KernelStartError(
                    f"iac-code a2a exited with code {code} during start-up; log {self.log_path}:\n{tail(self.log_path)}"
                )
            request = urllib.request.Request(f"{self.url}/health", headers=self.headers())
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return
                    last_error = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                last_error = f"HTTP {exc.code}"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.1)
        raise KernelStartError(
            f"iac-code a2a not healthy after {self.startup_timeout:.0f}s ({last_error}); log {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def _stop_kernel(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self) -> None:
        """Stop the kernel process and start it again on the same port and config dir."""
        self._stop_kernel()
        self._start_kernel()

    def stop(self) -> None:
        """Stop the kernel and the fake LLM; remove the temp dir unless asked to keep it."""
        try:
            self._stop_kernel()
        finally:
            self.llm.stop()
            if not self.keep_tmp:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def is_running(self) -> bool:
        """Whether the kernel process is alive."""
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.keep_tmp = True  # keep the logs named in the error for inspection
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------- A2A helpers

    def message(
        self,
        text: str | None,
        context_id: str,
        *,
        task_id: str | None = None,
        parts: list[dict[str, Any]] | None = None,
        iac_code: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A ``ROLE_USER`` A2A message with ``metadata.iac_code.cwd`` = ``workdir``."""
        metadata: dict[str, Any] = {"cwd": str(self.workdir), "preferredLanguage": "en"}
        metadata.update(iac_code or {})
        message: dict[str, Any] = {
            "messageId": f"msg-{uuid.uuid4().hex[:12]}",
            "role": "ROLE_USER",
            "contextId": context_id,
            "parts": list(parts) if parts is not None else [{"text": text or ""}],
            "metadata": {"iac_code": metadata},
        }
        if task_id is not None:
            message["taskId"] = task_id
        return message

    def _request(self, method: str, params: Mapping[str, Any], timeout: float) -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": f"req-{next(self._ids)}",
            "method": method,
            "params": dict(params),
        }
        request = urllib.request.Request(
            f"{self.url}/",
            data=json.dumps(body).encode(),
            headers=self.headers(),
            method="POST",
        )
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise A2AStreamError(f"{method}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc

    def rpc(self, method: str, params: Mapping[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
        """One non-streaming JSON-RPC call; returns the whole response object."""
        with self._request(method, params, timeout) as response:
            return dict(json.loads(response.read()))

    def iter_stream(self, method: str, params: Mapping[str, Any], *, timeout: float = 30.0) -> Iterator[dict[str, Any]]:
        """Yield each JSON-RPC response object of a streaming call as it arrives.

        A rejected request (``application/json`` instead of SSE) yields its single error object.
        ``timeout`` is the socket read timeout (the kernel pings every ~15 s).
        """
        with self._request(method, params, timeout) as response:
            if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                yield dict(json.loads(response.read()))
                return
            data: list[str] = []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    yield dict(json.loads("\n".join(data)))
                    data = []
            if data:
                yield dict(json.loads("\n".join(data)))

    def stream(self, method: str, params: Mapping[str, Any], *, timeout: float = 30.0) -> list[dict[str, Any]]:
        """All JSON-RPC response objects of a streaming call (until the server closes it)."""
        return list(self.iter_stream(method, params, timeout=timeout))

    def send(self, message: Mapping[str, Any], *, timeout: float = 30.0) -> list[dict[str, Any]]:
        """``SendStreamingMessage`` with ``message``; returns every response object."""
        return self.stream("SendStreamingMessage", {"message": dict(message)}, timeout=timeout)


def results(responses: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``result`` objects of JSON-RPC responses; raises on the first error response."""
    out: list[dict[str, Any]] = []
    for response in responses:
        if "error" in response:
            raise A2AStreamError(f"JSON-RPC error: {json.dumps(response['error'])}")
        out.append(dict(response["result"]))
    return out


def status_updates(responses: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``statusUpdate`` payloads of a stream, in order."""
    return [r["statusUpdate"] for r in results(responses) if "statusUpdate" in r]


def iac_meta(update: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata.iac_code`` of a status update (``{}`` when absent)."""
    return dict((update.get("metadata") or {}).get("iac_code") or {})


def states(responses: Iterable[Mapping[str, Any]]) -> list[str]:
    """The task states of a stream, in order (initial task snapshot included)."""
    out: list[str] = []
    for result in results(responses):
        if "task" in result:
            out.append(result["task"]["status"]["state"])
        elif "statusUpdate" in result:
            out.append(result["statusUpdate"]["status"]["state"])
    return out


def message_texts(update: Mapping[str, Any]) -> str:
    """The concatenated text parts of a status update's message ('' if none)."""
    message = (update.get("status") or {}).get("message") or {}
    return "".join(str(p.get("text", "")) for p in message.get("parts") or [] if "text" in p)


# --- facts of a test, from the kernel and the fake LLM ---------------------------------------
def thread_id(name: str) -> str:
    return f"rk-{name}-{uuid.uuid4().hex[:10]}"


def llm_log(kernel: RealKernel, tag: str) -> list[dict[str, Any]]:
    """The fake LLM's requests whose conversation contains ``tag``."""
    return [r for r in kernel.llm_requests() if any(tag in message_text(m) for m in r["messages"])]


def behaviours(kernel: RealKernel, tag: str) -> list[str]:
    return [r["behaviour"] for r in llm_log(kernel, tag)]


def get_task(kernel: RealKernel, task_id: str) -> dict[str, Any]:
    response = kernel.rpc("GetTask", {"id": task_id})
    assert "result" in response, response
    return dict(response["result"])


def task_state(kernel: RealKernel, task_id: str) -> str:
    return str(get_task(kernel, task_id)["status"]["state"])


def wait_task_state(kernel: RealKernel, task_id: str, wanted: str, timeout: float = 40.0) -> str:
    deadline = time.monotonic() + timeout
    state = task_state(kernel, task_id)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        state = task_state(kernel, task_id)
    return state


# --- adapters in front of the real kernel ------------------------------------------------------
#: The heartbeat of the adapters started here, short so that idle streams show heartbeats.
HEARTBEAT = "0.5"


class Adapters:
    """Starts ``python run.py`` processes in front of the real kernel, all on one state dir."""

    def __init__(self, kernel: RealKernel, root: Path, outside: Path) -> None:
        self.kernel = kernel
        self.state_dir = root / "state"
        self.outside = outside
        self.started: list[AdapterProcess] = []

    def start(self, *extra: str) -> AdapterProcess:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("IAC_CODE_AGUI_", "IACCODE_"))}
        environ.update(
            {
                # the kernel's workdir (also the kernel's only root) plus one root the kernel refuses
                "IAC_CODE_AGUI_ALLOWED_CWDS": os.pathsep.join([str(self.kernel.workdir), str(self.outside)]),
                "PYTHONUNBUFFERED": "1",
            }
        )
        args = [
            "--port",
            "0",
            "--a2a-url",
            self.kernel.url,
            "--a2a-token",
            self.kernel.token,
            "--state-dir",
            str(self.state_dir),
            "--heartbeat-seconds",
            HEARTBEAT,
            *extra,
        ]
        process = AdapterProcess(args, environ).start()
        STATE_DIRS.append(self.state_dir)
        ADAPTER_LOGS.append(process)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


# --- pipeline runs through the adapter ----------------------------------------------------------
PIPELINE = "iac-code.pipeline.v1"


def pipeline_events(*runs: RunResult) -> list[dict[str, Any]]:
    return [c["value"] for r in runs for c in r.of("CUSTOM") if c["name"] == PIPELINE]


def pipeline_answer(body: Mapping[str, Any], interrupt: Mapping[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The Resume run of ``body``'s ``selling`` pipeline answering ``interrupt`` with ``payload``."""
    props = body["forwardedProps"]["iacCode"]
    return run_body(
        None,
        thread_id=body["threadId"],
        cwd=props["cwd"],
        ros=props["rosInvocationId"],
        runMode="pipeline",
        pipelineName="selling",
        candidatePresentation="rich",
        resume=[{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}],
    )


def select_candidate(body: Mapping[str, Any], selection: Mapping[str, Any], selected: str = "1") -> dict[str, Any]:
    """The Resume of a ``selling`` pipeline run (``body``) that picks candidate ``selected`` at
    its ``candidate_selection`` interrupt."""
    return pipeline_answer(body, selection, {"selectedId": selected})


def only_interrupt(result: RunResult) -> dict[str, Any]:
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.terminal["outcome"]["type"] == "interrupt", result.terminal
    [interrupt] = result.terminal["outcome"]["interrupts"]
    return dict(interrupt)


def journal(kernel: RealKernel, task_id: str) -> list[dict[str, Any]]:
    """Every event of the kernel's pipeline journal for ``task_id``."""
    state = requests.get(
        kernel.url + "/iac-code/pipeline/state",
        params={"taskId": task_id, "afterSequence": 0, "includeSnapshot": "false"},
        headers=kernel.headers(),
        timeout=10,
    ).json()
    return list(state["events"])


def step_names(result: RunResult, kind: str) -> list[str]:
    return [e["stepName"] for e in result.of(kind)]


def official_check(runs: list[RunResult], payloads: list[dict[str, Any]]) -> None:
    from tests.support.agui_check.official import check_streams, require_official_client

    require_official_client()
    verdict = check_streams([r.raw for r in runs], resume_payload=payloads[0] if payloads else None)
    assert verdict.ok, verdict.output


def assert_journal_delivered_once(kernel: RealKernel, runs: list[RunResult]) -> None:
    """Every allowlisted event of the real journal reached the client, and exactly once, except
    the publications pending the kernel's backup (never: their committed twins are); each
    business event once by eventId and by (type, sequence) (``tests/support/pipeline_checks``)."""
    # the adapter's allowlist and pending rule (the harness needs no adapter)
    from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES, is_pending_publication
    from tests.support.pipeline_checks import assert_business_events_once

    ids = [e["eventId"] for e in pipeline_events(*runs)]
    assert len(ids) == len(set(ids)), "a pipeline event was delivered twice"
    events = journal(kernel, session_value(runs[0])["taskId"])
    wanted = {e["eventId"] for e in events if e["eventType"] in CUSTOM_EVENT_TYPES and not is_pending_publication(e)}
    assert set(ids) == wanted
    assert_business_events_once(runs, events)
