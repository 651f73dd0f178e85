"""Fixtures for tests that drive the real iac-code 0.16.0 kernel (see ``harness.py``).

Everything collected under this directory is marked ``realkernel`` (deselected by the default
``addopts``; ``.ci/run`` selects it). Without the kernel venv the tests fail under ``CI=true``
and are skipped otherwise, with the install command in the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agui_client import Client
from tests.support.servers import AdapterProcess

from .harness import Adapters, RealKernel, require_kernel_venv

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``realkernel`` marker to every item collected from this directory."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if path == _HERE or _HERE in path.parents:
            item.add_marker(pytest.mark.realkernel)


@pytest.fixture(scope="module")
def real_kernel() -> Iterator[RealKernel]:
    """A started :class:`RealKernel` (fake LLM + ``iac-code a2a``), shared by one test module."""
    venv = require_kernel_venv()
    with RealKernel(venv) as kernel:
        yield kernel


@pytest.fixture(scope="module")
def adapters(real_kernel: RealKernel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adapters]:
    root = tmp_path_factory.mktemp("adapter-real")
    outside = tmp_path_factory.mktemp("outside-kernel-roots")
    factory = Adapters(real_kernel, root, outside)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def adapter(adapters: Adapters) -> AdapterProcess:
    """The module's shared adapter process."""
    return adapters.start()


@pytest.fixture
def client(adapter: AdapterProcess) -> Client:
    return Client(adapter.url)


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A unique marker for this test's prompts (to pick its requests out of the LLM log)."""
    return f"<{request.node.name[:40]}-{uuid.uuid4().hex[:6]}>"


@pytest.fixture
def ws(real_kernel: RealKernel, request: pytest.FixtureRequest) -> Path:
    """This test's workspace: a fresh directory inside the kernel's workdir (created by the adapter)."""
    return real_kernel.workdir / f"ws-{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
