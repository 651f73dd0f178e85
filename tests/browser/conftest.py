"""Fixtures of the browser suite (marker ``browser``, run by ``.ci/run``; see tests/support/browser.py).

The scripted kernel runs here at human speed (``delay_scale=1``: ``[SLOW]`` sends one delta a
second), so that a person-sized action such as pressing "Cancel run" lands mid-stream.
``browser`` is a fresh headless Chromium per test, with its own profile directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.browser import require_chromium, start_chromium
from tests.support.flow import KERNEL_TOKEN


@pytest.fixture(scope="session")
def scripted_kernel() -> Iterator[ScriptedKernel]:
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=1.0)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium, driver = require_chromium()
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    session = start_chromium(chromium, driver, profile)
    try:
        yield session
    finally:
        session.quit()
