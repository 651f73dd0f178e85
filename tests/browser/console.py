"""What the console's browser tests share: driving the page as a person does, and reading it.

``open_console`` loads the page and waits until it has asked ``/health`` and rebuilt (or found
new) the thread its URL names; ``send`` types and sends; ``run_cards`` are the runs streamed in
this page (``.run``), ``restored`` what it rebuilt from ``GET /threads/{id}/messages``
(``.turn``); ``raw_log`` and ``event_ids`` read the raw event pane; ``visible_buttons`` maps a
form's shown buttons by ``data-value``; ``axe_violations`` runs axe-core in the page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.browser import axe_source, require_selenium

require_selenium()  # without it: skipped, or failed under CI=true

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TOKEN = "console-bearer-token-123"
#: The page's first state, set once /health answered and the thread was rebuilt (or is new).
READY = '#status[data-reattach="{status}"][data-restore]'


def wait_for(browser: Any, css: str, timeout: float = 20.0) -> Any:
    return WebDriverWait(browser, timeout).until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def wait_until(browser: Any, condition: Any, timeout: float = 20.0) -> Any:
    return WebDriverWait(browser, timeout, poll_frequency=0.1).until(lambda d: condition())


def wait_ready(browser: Any, status: str = "supported") -> None:
    wait_for(browser, READY.format(status=status))


def open_console(browser: Any, adapter: Any, workspace: Path, token: str = "", status: str = "supported") -> None:
    browser.get(adapter.url)
    wait_ready(browser, status)
    cwd = browser.find_element(By.ID, "cwd")
    cwd.clear()
    cwd.send_keys(str(workspace))
    if token:
        browser.find_element(By.ID, "token").send_keys(token)


def send(browser: Any, text: str) -> None:
    browser.find_element(By.ID, "message").send_keys(text)
    browser.find_element(By.ID, "send").click()


def run_cards(browser: Any) -> list[Any]:
    return browser.find_elements(By.CSS_SELECTOR, "#transcript .run")


def wait_for_card(browser: Any, index: int, state: str, timeout: float = 20.0) -> Any:
    """The ``index``-th run card (0-based) once it is in ``state``."""

    def card() -> Any:
        cards = run_cards(browser)
        return len(cards) > index and cards[index].get_attribute("data-state") == state and cards[index]

    return wait_until(browser, card, timeout)


def raw_log(browser: Any) -> list[tuple[str, str]]:
    """The raw event log as (what, text): ("→ POST /", body), ("RUN_STARTED", event), ...
    (the page writes each event's SSE id after its type, "RUN_STARTED #1": left out here)."""
    return [
        (re.sub(r" #\d+$", "", kind), text)
        for kind, text in browser.execute_script(
            "return [...document.querySelectorAll('#log li')]"
            ".map(li => [li.querySelector('.k').textContent, li.querySelector('.v').textContent])"
        )
    ]


def event_ids(browser: Any) -> list[int]:
    """The SSE ids the page logged, in order."""
    kinds = browser.execute_script("return [...document.querySelectorAll('#log li .k')].map(k => k.textContent)")
    return [int(match.group(1)) for kind in kinds if (match := re.search(r" #(\d+)$", kind))]


def requests_sent(browser: Any) -> list[str]:
    """What the page asked the adapter, in order: "→ GET /threads/t1", "→ POST /", ..."""
    return [kind for kind, _ in raw_log(browser) if kind.startswith("→")]


def visible_buttons(form: Any) -> dict[str, str]:
    """The form's displayed buttons as {data-value: label}."""
    buttons = form.find_elements(By.TAG_NAME, "button")
    return {b.get_attribute("data-value"): b.text for b in buttons if b.is_displayed()}


def transcript(browser: Any) -> list[tuple[str, str]]:
    """The conversation as drawn: ("user", text) and ("assistant", text), in page order."""
    return [
        (role, text.strip())
        for role, text in browser.execute_script(
            "return [...document.querySelectorAll('#transcript .user, #transcript .text.assistant')]"
            ".map(n => [n.classList.contains('user') ? 'user' : 'assistant', n.textContent])"
        )
    ]


def axe_violations(browser: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is (injected by WebDriver)."""
    browser.execute_script(axe_source())
    result = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' ') + ' :: ' + (n.failureSummary || ''))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));"
    )
    return [v for v in result if v["impact"] in ("serious", "critical")]
