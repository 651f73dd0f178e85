"""Fixtures for tests that drive the real iac-code 0.16.0 kernel (see ``harness.py``).

Everything collected under this directory is marked ``realkernel`` (deselected by the default
``addopts``; ``.ci/run`` selects it). Without the kernel venv the tests fail under ``CI=true``
and are skipped otherwise, with the install command in the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import INSTALL_COMMAND, RealKernel, find_kernel_venv

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``realkernel`` marker to every item collected from this directory."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if path == _HERE or _HERE in path.parents:
            item.add_marker(pytest.mark.realkernel)


def require_kernel_venv() -> Path:
    """The kernel venv; ``pytest.fail`` under ``CI=true`` and ``pytest.skip`` otherwise when missing."""
    venv = find_kernel_venv()
    if venv is not None:
        return venv
    message = f"iac-code 0.16.0 kernel venv not found (AGUI_IAC_CODE_VENV); install it with: {INSTALL_COMMAND}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def real_kernel() -> Iterator[RealKernel]:
    """A started :class:`RealKernel` (fake LLM + ``iac-code a2a``), shared by one test module."""
    venv = require_kernel_venv()
    with RealKernel(venv) as kernel:
        yield kernel
