"""The console keeps conversations: a reload, another tab or a link rebuilds the thread.

These tests need the thread resource (``GET /threads/{id}``, ``GET /threads/{id}/messages``):
on reload the page rebuilds every turn from the adapter, shows the questions still waiting
(answerable), follows a live run, and turns ``THREAD_BUSY`` / ``RESUME_REQUIRED`` into the live
run or the pending question. Every thread-bound request carries ``X-AGUI-Thread-Id``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.browser.console import (
    TOKEN,
    open_console,
    raw_log,
    requests_sent,
    run_cards,
    send,
    transcript,
    visible_buttons,
    wait_for,
    wait_for_card,
    wait_ready,
    wait_until,
)
from tests.support.agui_client import run_body
from tests.support.browser import console_errors, require_selenium, save_screenshot

require_selenium()  # without it: skipped, or failed under CI=true

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = pytest.mark.browser


def turns(drawn: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(user text, the assistant's text of that turn without whitespace): a run's text may be drawn
    in several pieces around its tool calls, and comes back from /messages as one message."""
    out: list[tuple[str, str]] = []
    for role, text in drawn:
        if role == "user":
            out.append((text, ""))
        elif out:
            out[-1] = (out[-1][0], out[-1][1] + re.sub(r"\s+", "", text))
    return out


def test_a_reload_mid_conversation_restores_every_turn(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[THINK] [TOOL] hello")
    wait_for_card(browser, 0, "finished")
    send(browser, "[ECHO] second **turn**")
    wait_for_card(browser, 1, "finished")
    send(browser, "[RECALL] third")
    wait_for_card(browser, 2, "finished")
    before = transcript(browser)
    assert [role for role, _ in before].count("user") == 3
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")

    browser.refresh()
    wait_ready(browser)
    wait_for(browser, '#status[data-restore="done"]')
    after = transcript(browser)
    assert [t for r, t in after if r == "user"] == ["[THINK] [TOOL] hello", "[ECHO] second **turn**", "[RECALL] third"]
    assert turns(after) == turns(before)  # every turn, in order, the assistant's text as it streamed
    assert run_cards(browser) == []  # restored turns are not runs of this page
    tool = browser.find_element(By.CSS_SELECTOR, "#transcript .turn details.tool")
    assert "read_file" in tool.find_element(By.TAG_NAME, "summary").get_attribute("textContent")
    assert "Read 3 lines" in tool.find_element(By.CSS_SELECTOR, "pre.result-text").get_attribute("textContent")
    # the thread list keeps it, titled by its first message
    listed = browser.find_element(By.CSS_SELECTOR, f'#threadList button[data-thread-id="{thread_id}"]')
    assert listed.get_attribute("aria-current") == "page" and "[THINK] [TOOL] hello" in listed.text
    save_screenshot(browser, "restored")

    # the conversation goes on after the restore
    send(browser, "[RECALL] fourth")
    card = wait_for_card(browser, 0, "finished")
    assert "4 user turns" in card.text
    # "New thread" starts clean; the old one stays in the list and comes back from it
    browser.find_element(By.ID, "newThread").click()
    wait_until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#transcript > *") == [])
    assert browser.find_element(By.ID, "threadId").get_attribute("value") != thread_id
    browser.find_element(By.CSS_SELECTOR, f'#threadList button[data-thread-id="{thread_id}"]').click()
    wait_until(browser, lambda: len([r for r, _ in transcript(browser) if r == "user"]) == 4)
    assert browser.current_url.endswith("#thread=" + thread_id)
    # a thread id typed (or pasted) opens that thread too
    browser.find_element(By.ID, "newThread").click()
    wait_until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#transcript > *") == [])
    field = browser.find_element(By.ID, "threadId")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(thread_id + Keys.TAB)  # typed over the selection; "change" on leaving the field
    wait_until(browser, lambda: len([r for r, _ in transcript(browser) if r == "user"]) == 4)
    assert browser.current_url.endswith("#thread=" + thread_id)
    assert console_errors(browser) == []


def test_a_reload_with_a_permission_pending_shows_the_form_and_answering_works(
    adapter: Any, workspace: Path, browser: Any
) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[WRITE] make a file")
    form = wait_for(browser, 'form.interrupt[data-kind="permission"]')
    interrupt_id = form.get_attribute("data-interrupt-id")
    browser.refresh()
    wait_ready(browser)
    form = wait_for(browser, f'form.interrupt[data-interrupt-id="{interrupt_id}"]')
    assert "hello.txt" in form.text and "Changes files in the workspace" in form.text
    assert visible_buttons(form) == {"allow_once": "Allow once", "deny": "Deny"}
    assert [t for r, t in transcript(browser) if r == "user"] == ["[WRITE] make a file"]
    save_screenshot(browser, "restored-permission")
    form.find_element(By.CSS_SELECTOR, 'button[data-value="allow_once"]').click()
    resumed = wait_for_card(browser, 1, "finished")
    assert "hello.txt" in resumed.find_element(By.CSS_SELECTOR, "pre.result-text").text
    assert (workspace / "hello.txt").read_text() == "hello from scripted kernel\n"
    [post] = [json.loads(text) for kind, text in raw_log(browser) if kind == "→ POST /"]
    assert post["resume"] == [
        {"interruptId": interrupt_id, "status": "resolved", "payload": {"decision": "allow_once"}}
    ]
    assert console_errors(browser) == []


def test_resume_required_shows_the_question_instead_of_a_dead_end(adapter: Any, workspace: Path, browser: Any) -> None:
    """Another tab left a question waiting; this tab's new message gets 409 RESUME_REQUIRED:
    the page shows the question (answerable) and keeps the message in the box."""
    open_console(browser, adapter, workspace)
    send(browser, "[ASK] where?")
    wait_for(browser, 'form.interrupt[data-kind="ask_user_question"]')
    # the form is gone from this view (as if another tab had asked): the thread still waits
    browser.execute_script("document.getElementById('transcript').textContent = ''")
    send(browser, "something else")
    form = wait_for(browser, 'form.interrupt[data-kind="ask_user_question"]')
    assert "waits for your answer" in browser.find_element(By.CSS_SELECTOR, "#transcript .notice").text
    assert browser.find_element(By.ID, "message").get_attribute("value") == "something else"
    assert "RESUME_REQUIRED" in [json.loads(t).get("code") for k, t in raw_log(browser) if k == "error"]
    form.find_element(By.CSS_SELECTOR, "input[value=sh]").click()
    form.find_element(By.CSS_SELECTOR, "button.primary").click()
    wait_until(browser, lambda: any(c.get_attribute("data-state") == "finished" for c in run_cards(browser)))
    assert [e for e in console_errors(browser) if "409" not in e] == []  # Chromium logs the refused POST


def test_every_thread_bound_request_names_its_thread(make_adapter: Any, workspace: Path, browser: Any) -> None:
    """X-AGUI-Thread-Id on POST /, GET /threads/..., the events route and cancel (sticky routing).
    (A grace period keeps the run going across the reload: without one, the adapter notices the
    reload's hang-up at once and cancels the run before the page can press "Cancel run".)"""
    adapter = make_adapter(disconnect_grace_seconds=30)
    seen: list[tuple[str, str, str | None]] = []
    app = adapter.server.app

    def recording(environ: dict[str, Any], start_response: Any) -> Any:
        seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("HTTP_X_AGUI_THREAD_ID")))
        return app(environ, start_response)

    adapter.server.app = recording
    open_console(browser, adapter, workspace)
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")
    send(browser, "[SILENT 10] [SLOW] count")  # live for about 20 s: well past the reload
    card = wait_for(browser, '.run[data-state="streaming"]')
    browser.refresh()
    wait_ready(browser)
    card = wait_for(browser, ".run")
    wait_until(browser, lambda: browser.find_element(By.ID, "cancel").is_enabled())
    browser.find_element(By.ID, "cancel").click()
    wait_until(browser, lambda: card.get_attribute("data-state") == "cancelled")
    bound = [(m, p, h) for m, p, h in seen if p == "/" and m == "POST" or p.startswith(("/threads/", "/extensions/"))]
    paths = {p.split("/")[-1] if p.startswith("/extensions/") else p for _, p, _ in bound}
    assert "cancel" in paths and f"/threads/{thread_id}" in paths and "/" in paths
    assert any(p.endswith("/events") for p in paths)
    assert all(h == thread_id for _, _, h in bound), bound
    assert f"→ GET /threads/{thread_id}" in requests_sent(browser)


def test_thread_busy_follows_the_run_another_client_started(make_adapter: Any, workspace: Path, browser: Any) -> None:
    """A script starts a slow run on the page's thread and leaves (grace period: the run goes
    on); the page's Send gets 409 THREAD_BUSY and follows that run instead of a dead message."""
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.5)
    open_console(browser, adapter, workspace)
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")
    body = run_body("[SLOW] count", thread_id=thread_id, cwd=str(workspace), ros="inv-script")
    with requests.post(adapter.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines(decode_unicode=True):
            if "one," in line:
                break  # the script leaves mid-run
    send(browser, "are you there?")
    followed = wait_for(browser, f'.run[data-run-id="{body["runId"]}"]')
    assert "still live" in browser.find_element(By.CSS_SELECTOR, "#transcript .notice").text
    wait_until(browser, lambda: followed.get_attribute("data-state") == "finished", timeout=30)
    assert "eight." in followed.text
    assert browser.find_element(By.ID, "message").get_attribute("value") == "are you there?"  # not lost
    assert "THREAD_BUSY" in [json.loads(t).get("code") for k, t in raw_log(browser) if k == "error"]
    # once the run ended, the message goes through
    browser.find_element(By.ID, "send").click()
    wait_until(browser, lambda: any(c.get_attribute("data-state") == "finished" for c in run_cards(browser)[1:]))
    assert [e for e in console_errors(browser) if "409" not in e] == []  # Chromium logs the refused POST


def test_a_token_kept_for_the_tab_lets_a_reload_follow_the_run(
    make_adapter: Any, workspace: Path, browser: Any
) -> None:
    adapter = make_adapter(auth_token=TOKEN, disconnect_grace_seconds=30, heartbeat_seconds=0.5)
    open_console(browser, adapter, workspace, token=TOKEN)
    browser.find_element(By.ID, "keepToken").click()
    send(browser, "[SILENT 10] [SLOW] count")  # live for about 20 s: well past the reload
    card = wait_for(browser, '.run[data-state="streaming"]')
    run_id = card.get_attribute("data-run-id")
    browser.refresh()
    wait_ready(browser)
    assert browser.find_element(By.ID, "token").get_attribute("value") == TOKEN
    assert browser.find_element(By.ID, "keepToken").is_selected()
    followed = wait_for(browser, f'.run[data-run-id="{run_id}"]')
    wait_until(browser, lambda: followed.get_attribute("data-state") == "finished", timeout=30)
    assert "eight." in followed.text
    local = browser.execute_script("return JSON.stringify(Object.assign({}, localStorage))")
    assert TOKEN not in local  # the tab's sessionStorage only
    assert browser.execute_script("return sessionStorage.getItem('agui-console.token')") == TOKEN
    # unticked, it is gone from the tab too
    browser.find_element(By.ID, "keepToken").click()
    assert browser.execute_script("return sessionStorage.getItem('agui-console.token')") is None
    assert console_errors(browser) == []


def test_a_pending_permission_is_answerable_after_the_journal_expired(
    make_adapter: Any, workspace: Path, browser: Any
) -> None:
    adapter = make_adapter(replay_retention_seconds=1)
    open_console(browser, adapter, workspace)
    send(browser, "[WRITE] make a file")
    form = wait_for(browser, 'form.interrupt[data-kind="permission"]')
    interrupt_id = form.get_attribute("data-interrupt-id")
    run_id = run_cards(browser)[0].get_attribute("data-run-id")
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")
    journal = adapter.app.engine.journals.run_dir(thread_id, run_id)
    wait_until(browser, lambda: not journal.exists(), timeout=30)  # swept (asking the route would keep it)
    events = f"{adapter.url}threads/{thread_id}/runs/{run_id}/events"
    assert requests.get(events, timeout=5).status_code == 404
    browser.refresh()
    wait_ready(browser)
    form = wait_for(browser, f'form.interrupt[data-interrupt-id="{interrupt_id}"]')
    assert "Changes files in the workspace" in form.text and "hello.txt" in form.text
    form.find_element(By.CSS_SELECTOR, 'button[data-value="allow_once"]').click()
    wait_for_card(browser, 1, "finished")
    assert (workspace / "hello.txt").read_text() == "hello from scripted kernel\n"
    assert console_errors(browser) == []
