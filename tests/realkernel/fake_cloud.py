"""The fake Alibaba Cloud setup the cloud test modules share (``test_cloud_real``,
``test_solution_first_real``): its fixtures, the request bodies carrying fake credentials, and
the checks every cloud test ends with.

The fixtures are module-scoped: a test module takes them by name
(``fake_aliyun = fake_cloud.fake_aliyun``), and its ``real_kernel`` replaces the conftest's with
a kernel whose HTTPS goes to the fake cloud.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agui_client import RunResult, run_body
from tests.support.fake_aliyun import FakeAliyun

from .harness import (
    RealKernel,
    assert_journal_delivered_once,
    official_check,
    require_kernel_venv,
    thread_id,
)

FAKE_KEY_ID = "LTAI5tFakeAguiAdapter01"


@pytest.fixture(scope="module")
def fake_aliyun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeAliyun]:
    with FakeAliyun(tmp_path_factory.mktemp("fake-aliyun")) as cloud:
        yield cloud


@pytest.fixture(scope="module")
def real_kernel(fake_aliyun: FakeAliyun) -> Iterator[RealKernel]:
    """The real kernel with its HTTPS sent to the fake cloud (overrides the conftest fixture)."""
    venv = require_kernel_venv()
    with RealKernel(venv, extra_env=fake_aliyun.environment()) as kernel:
        yield kernel


@pytest.fixture
def secret() -> str:
    """A fake access key secret, new per test (the secrets check looks for it everywhere)."""
    return f"fake-secret-{uuid.uuid4().hex}"


def cloud_body(text: str | None, ws: Path, secret: str, *, base: dict[str, Any] | None = None, **props: Any) -> dict:
    credentials = {"accessKeyId": FAKE_KEY_ID, "accessKeySecret": secret, "regionId": "cn-hangzhou"}
    if base is not None:
        old = base["forwardedProps"]["iacCode"]
        return run_body(
            text,
            thread_id=base["threadId"],
            cwd=old["cwd"],
            ros=old["rosInvocationId"],
            runMode="pipeline",
            pipelineName=old["pipelineName"],
            candidatePresentation="rich",
            alibabaCloud=credentials,
            **props,
        )
    return run_body(
        text,
        thread_id=thread_id("cloud"),
        cwd=str(ws),
        runMode="pipeline",
        pipelineName=props.pop("pipelineName", "selling"),
        candidatePresentation="rich",
        alibabaCloud=credentials,
        **props,
    )


def resume_with(base: dict, secret: str, interrupt: dict[str, Any], payload: dict[str, Any]) -> dict:
    entry = {"interruptId": interrupt["id"], "status": "resolved", "payload": payload}
    return cloud_body(None, Path(base["forwardedProps"]["iacCode"]["cwd"]), secret, base=base, resume=[entry])


def describe(result: RunResult, cloud: FakeAliyun) -> str:
    """What to show when a step of these tests fails."""
    return f"terminal={result.terminal} calls={cloud.actions()} tls={cloud.tls_failures}"


def calls_since(cloud: FakeAliyun, mark: int) -> list[dict[str, Any]]:
    return cloud.calls[mark:]


def assert_clean_delivery(kernel: RealKernel, cloud: FakeAliyun, secret: str, runs: list[RunResult]) -> None:
    """What every cloud test ends with: no secret anywhere, every journal event delivered once,
    and the official client finds no error in the runs' streams."""
    assert_no_secret(kernel, cloud, secret, runs)
    assert_journal_delivered_once(kernel, runs)
    official_check(runs, [{"selectedId": "1"}])


def assert_no_secret(kernel: RealKernel, cloud: FakeAliyun, secret: str, runs: list[RunResult]) -> None:
    """The fake secret is in no client stream and none of the logs of this setup.

    The real kernel echoes the whole first message, its ``metadata.iac_code`` with the access key
    secret included, in the ``task`` frame it opens the stream with (tests/data/a2a-selling/09):
    the adapter must not pass that on. (The adapters' logs and state are checked at session end.)
    """
    for result in runs:
        assert secret.encode() not in result.raw
    for path in (cloud.log_path, kernel.log_path, kernel.kernel_server_log, kernel.llm_log_path):
        if path.exists():
            assert secret not in path.read_text(encoding="utf-8", errors="replace"), path
