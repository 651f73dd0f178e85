"""What a person can trust on the console page: safe Markdown, a question's decline that says
what it does, a page usable from 360 px wide, dark mode with AA contrast, and axe-core clean.

The assistant's text is Markdown rendered by the page's own small renderer into DOM nodes: a
hostile message (HTML, an event handler, a ``javascript:`` link) must come out as text. axe-core
(npm, pinned by ``.ci/setup-peers.sh``) is injected by WebDriver from its file (the page's CSP
does not apply to WebDriver's scripts) and must report no serious or critical violation, in
light and in dark mode, with a permission form on screen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.browser.console import (
    axe_violations,
    open_console,
    raw_log,
    send,
    visible_buttons,
    wait_for,
    wait_for_card,
    wait_until,
)
from tests.support.browser import console_errors, dark_mode, require_selenium, save_screenshot

require_selenium()  # without it: skipped, or failed under CI=true

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.browser

HOSTILE = (
    '[ECHO] **bold** and *soft* `<b>code</b>` <img src=x onerror="window.__pwned=1">'
    " <script>window.__pwned=2</script> [click](javascript:window.__pwned=3) [docs](https://example.com/d)"
)


def test_assistant_markdown_is_rendered_safely_and_can_be_copied(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, HOSTILE)
    card = wait_for_card(browser, 0, "finished")
    text = card.find_element(By.CSS_SELECTOR, ".text.assistant")
    assert text.find_element(By.TAG_NAME, "strong").text == "bold"
    assert text.find_element(By.TAG_NAME, "em").text == "soft"
    assert text.find_element(By.TAG_NAME, "code").text == "<b>code</b>"  # as text, not markup
    # no element from the stream: no img, no script, no b; the markup shows as text
    assert text.find_elements(By.CSS_SELECTOR, "img, script, b, iframe") == []
    assert '<img src=x onerror="window.__pwned=1">' in text.text and "<script>" in text.text
    links = text.find_elements(By.TAG_NAME, "a")
    assert [a.get_attribute("href") for a in links] == ["https://example.com/d"]  # javascript: stays text
    assert links[0].get_attribute("rel") == "noopener noreferrer"
    assert "[click](javascript:window.__pwned=3)" in text.text
    assert browser.execute_script("return window.__pwned === undefined")
    assert browser.execute_script("return document.querySelectorAll('#transcript img, #transcript script').length") == 0
    # the copy button copies the message's Markdown source
    browser.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"origin": adapter.url.rstrip("/"), "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    card.find_element(By.CSS_SELECTOR, ".msg > button.copy").click()
    wait_until(browser, lambda: card.find_element(By.CSS_SELECTOR, ".msg > button.copy").text == "Copied")
    copied = browser.execute_async_script("navigator.clipboard.readText().then(arguments[0], () => arguments[0](null))")
    assert copied is not None and copied.startswith("**bold** and *soft*")
    assert console_errors(browser) == []


def test_declining_a_question_says_it_ends_the_execution_and_asks_first(
    adapter: Any, workspace: Path, browser: Any
) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[ASK] where?")
    form = wait_for(browser, 'form.interrupt[data-kind="ask_user_question"]')
    assert visible_buttons(form) == {"answer": "Answer", "decline": "Decline…"}
    form.find_element(By.CSS_SELECTOR, 'button[data-value="decline"]').click()
    # asked first: nothing sent yet
    assert "Declining ends the execution" in form.find_element(By.CSS_SELECTOR, ".confirm").text
    assert visible_buttons(form) == {"answer": "Answer", "cancelled": "Yes, decline and end", "keep": "Keep answering"}
    assert [k for k, _ in raw_log(browser) if k == "→ POST /"] == ["→ POST /"]
    form.find_element(By.CSS_SELECTOR, 'button[data-value="keep"]').click()
    assert visible_buttons(form) == {"answer": "Answer", "decline": "Decline…"}
    form.find_element(By.CSS_SELECTOR, 'button[data-value="decline"]').click()
    form.find_element(By.CSS_SELECTOR, 'button[data-value="cancelled"]').click()
    wait_until(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, "#transcript .run")) == 2)
    [_, resume] = [json.loads(text) for kind, text in raw_log(browser) if kind == "→ POST /"]
    assert resume["resume"] == [{"interruptId": form.get_attribute("data-interrupt-id"), "status": "cancelled"}]
    assert "answered: declined (execution ends)" in form.text
    assert console_errors(browser) == []


def _no_horizontal_scroll(browser: Any) -> None:
    width = browser.execute_script("return document.documentElement.clientWidth")
    overflow = browser.execute_script(
        "return [...document.querySelectorAll('body *')].filter(n => n.getBoundingClientRect().right > "
        "document.documentElement.clientWidth + 1 && n.offsetParent !== null && !n.closest('pre, #log'))"
        ".map(n => n.tagName + '#' + n.id + '.' + n.className).slice(0, 10)"
    )
    assert browser.execute_script("return document.documentElement.scrollWidth") <= width, overflow
    assert overflow == []


def test_small_screen_and_dark_mode_with_a_deployment_approval(adapter: Any, workspace: Path, browser: Any) -> None:
    """360 px wide, light then dark: the deployment approval (costs, region, what it changes)
    fits, screenshots go to $AGUI_ARTIFACT_DIR, and axe-core finds nothing serious or critical."""
    browser.set_window_size(360, 900)
    open_console(browser, adapter, workspace)
    assert browser.find_element(By.ID, "kernel").text == "kernel: scripted"
    Select(browser.find_element(By.ID, "runMode")).select_by_value("pipeline")
    send(browser, "[PIPE-CANDIDATES] build a small website")
    form = wait_for(browser, 'form.interrupt[data-kind="candidate_selection"]', timeout=30)
    _no_horizontal_scroll(browser)
    form.find_element(By.CSS_SELECTOR, 'button[data-value="1"]').click()
    confirm = wait_for(browser, 'form.interrupt[data-kind="permission"]', timeout=30)
    browser.execute_script("arguments[0].scrollIntoView()", confirm)
    assert "¥8.00/月" in confirm.text and "cn-hangzhou" in confirm.text
    _no_horizontal_scroll(browser)
    save_screenshot(browser, "360px")
    assert axe_violations(browser) == []
    dark_mode(browser)
    assert browser.execute_script("return matchMedia('(prefers-color-scheme: dark)').matches")
    background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 22, 27)"
    save_screenshot(browser, "360px-dark")
    assert axe_violations(browser) == []
    assert console_errors(browser) == []


def test_wide_page_is_accessible_in_light_and_dark_mode(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[THINK] [TOOL] hello")
    wait_for_card(browser, 0, "finished")
    send(browser, "[WRITE] make a file")
    wait_for(browser, 'form.interrupt[data-kind="permission"]')
    assert axe_violations(browser) == []
    dark_mode(browser)
    save_screenshot(browser, "dark")
    assert axe_violations(browser) == []
    dark_mode(browser, False)
    assert console_errors(browser) == []
