"""Fixtures and hooks only; the helpers they use live in ``tests/support``.

``adapter`` starts the real WSGI app under the built-in server (``agui_adapter.http.server``,
what ``python run.py`` uses) on a free port
(in this process, so tests can swap settings cheaply); ``adapter_process`` starts
``python run.py`` as a separate process for restart and kill scenarios. Every SSE
stream read through ``Client`` is checked against the AG-UI 1.0 models and lifecycle
rules, and recorded for the official client when ``AGUI_STREAM_DIR`` is set. At the end
of the session, for every suite, no secret a test sent may be written down, and the
envelope validator's fast path must have agreed with jsonschema on every envelope any test
sent (``validation.cross_check``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.config import Settings
from agui_adapter.kernel_client.launch import KernelProcess
from agui_adapter.protocol import validation
from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.agui_client import Client
from tests.support.flow import KERNEL_TOKEN
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS, leaked_secrets
from tests.support.servers import AdapterProcess, InProcessAdapter


@pytest.fixture(scope="session", autouse=True)
def no_secret_is_ever_written_down() -> Iterator[None]:
    yield
    leaks = leaked_secrets()
    assert not leaks, f"secrets written down: {leaks}"


@pytest.fixture(scope="session", autouse=True)
def fast_validation_agrees_with_jsonschema() -> Iterator[None]:
    disagreements: list[str] = []
    validation.cross_check(disagreements)
    yield
    validation.cross_check(None)
    assert not disagreements, f"the validation fast path disagrees with jsonschema: {disagreements[:5]}"


@pytest.fixture(scope="session")
def scripted_kernel() -> Iterator[ScriptedKernel]:
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.05)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def full_scale_kernel() -> Iterator[ScriptedKernel]:
    """A scripted kernel whose [SLOW]/[SILENT n] take real seconds: for runs that must stay
    live while a test acts on them."""
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=1.0)
    kernel.start()
    yield kernel
    kernel.stop()


def _adapters(tmp_path: Path, kernel: ScriptedKernel) -> Iterator[Any]:
    """A factory of in-process adapters on ``kernel``, settings overridable (and the runs' wall
    clock, ``clock=``, and the monotonic clock of their grace period, ``monotonic=``); stopped
    at the end."""
    started: list[InProcessAdapter] = []

    def factory(
        clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic, **overrides: Any
    ) -> InProcessAdapter:
        base = Settings(
            state_dir=str(tmp_path / "state"),
            heartbeat_seconds=15.0,
            allowed_cwds=str(tmp_path),
        )
        settings = replace(base, **overrides)
        STATE_DIRS.append(Path(settings.state_dir))
        adapter = InProcessAdapter(settings, KernelProcess(kernel.url, KERNEL_TOKEN, "scripted"), clock, monotonic)
        started.append(adapter)
        return adapter

    yield factory
    for adapter in started:
        adapter.stop()


@pytest.fixture
def make_adapter(tmp_path: Path, scripted_kernel: ScriptedKernel) -> Iterator[Any]:
    yield from _adapters(tmp_path, scripted_kernel)


@pytest.fixture
def make_full_scale_adapter(tmp_path: Path, full_scale_kernel: ScriptedKernel) -> Iterator[Any]:
    yield from _adapters(tmp_path, full_scale_kernel)


@pytest.fixture
def adapter(make_adapter: Any) -> InProcessAdapter:
    return make_adapter()


@pytest.fixture
def client(adapter: InProcessAdapter) -> Client:
    return adapter.client()


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
