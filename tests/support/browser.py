"""Headless Chromium for the console tests (tests/browser/), driven through Selenium.

Why here: the browser suite needs one way to find Debian's ``chromium`` and ``chromium-driver``
(installed by ``.ci/setup-peers.sh``), to start them with no network of their own and a fresh
profile, to read the page's console log, to keep screenshots as test artifacts, and to find
axe-core (npm, installed into the node prefix by ``.ci/setup-peers.sh``) for the accessibility
check. Under ``CI=true`` a missing browser, driver, Selenium or axe-core fails the test;
elsewhere it skips with the install command in the reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

INSTALL_COMMAND = "apt-get install -y chromium chromium-driver && pip install selenium (or: bash .ci/setup-peers.sh)"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1100",
)


def _find(env: str, default: str, name: str) -> str | None:
    candidate = os.environ.get(env) or default
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    return shutil.which(name)


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_selenium() -> None:
    """Selenium (the ``test`` extra) or, at a test module's top, a skip (a failure under ``CI=true``)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        _missing(f"selenium not installed; install with: {INSTALL_COMMAND}")


def require_chromium() -> tuple[str, str]:
    """(chromium, chromedriver); ``pytest.fail`` under ``CI=true`` and ``pytest.skip`` otherwise."""
    chromium = _find("AGUI_CHROMIUM", "/usr/bin/chromium", "chromium")
    driver = _find("AGUI_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver")
    require_selenium()
    if chromium and driver:
        return chromium, driver
    missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
    _missing(f"{missing} not found; install with: {INSTALL_COMMAND}")
    raise AssertionError("unreachable")


def start_chromium(chromium: str, driver: str, profile_dir: Path) -> Any:
    """A Selenium session on a new headless Chromium with a fresh profile; its console log is kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


AXE_INSTALL = "bash .ci/setup-peers.sh (npm install axe-core into ~/.cache/agui-adapter/node)"


def axe_source() -> str:
    """axe-core's ``axe.min.js`` from ``$AGUI_NODE_MODULES`` (default ~/.cache/agui-adapter/node/node_modules)."""
    modules = os.environ.get("AGUI_NODE_MODULES") or str(Path.home() / ".cache/agui-adapter/node/node_modules")
    path = Path(modules) / "axe-core" / "axe.min.js"
    if not path.is_file():
        _missing(f"axe-core not found at {path}; install with: {AXE_INSTALL}")
    return path.read_text(encoding="utf-8")


def dark_mode(driver: Any, dark: bool = True) -> None:
    """Emulates ``prefers-color-scheme: dark`` (or light) for the page, through the DevTools protocol."""
    value = "dark" if dark else "light"
    features = [{"name": "prefers-color-scheme", "value": value}]
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": features})


def console_errors(driver: Any) -> list[str]:
    """The page's console entries at level SEVERE since the last call (JS errors, console.error)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def artifact_dir() -> Path:
    """Where screenshots go: ``$AGUI_ARTIFACT_DIR``, else a new temporary directory."""
    configured = os.environ.get("AGUI_ARTIFACT_DIR")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / "agui-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_screenshot(driver: Any, name: str) -> Path:
    path = artifact_dir() / f"console-{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    return path
