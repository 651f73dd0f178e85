"""The console on the client module's wire: many readers, a dropped stream, a run that ended.

The page reads its streams through ``/agui-adapter-client.mjs`` (``runEvents`` for its own
``POST /``, ``followRun`` for a live run, ``getThread``, ``cancelExecution``). Here: two windows
on one thread both follow one live run to its end, and one leaving does not end the run for the
other; a ``POST /`` stream cut by a proxy mid-run is resumed through the events route with
``Last-Event-ID`` and the card is whole; a followed run that ended before the page could read
anything of it (the events route answers ``204``) makes the page draw the thread as it now is.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.browser.console import (
    event_ids,
    open_console,
    raw_log,
    requests_sent,
    run_cards,
    send,
    transcript,
    wait_for,
    wait_for_card,
    wait_ready,
    wait_until,
)
from tests.support.agui_client import Client
from tests.support.browser import console_errors, require_selenium, save_screenshot
from tests.support.cutting_proxy import CuttingProxy

require_selenium()  # without it: skipped, or failed under CI=true

from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.browser

COUNT = "one, two, three, four, five, six, seven, eight."


def card_text(card: Any) -> str:
    return "".join(node.get_attribute("textContent") for node in card.find_elements(By.CSS_SELECTOR, ".text.assistant"))


def whole_run(ids: list[int]) -> bool:
    return ids == list(range(1, len(ids) + 1)) and len(ids) > 5


def test_two_windows_on_one_thread_both_follow_the_live_run(make_adapter: Any, workspace: Path, browser: Any) -> None:
    """No grace period: a run ends when its last reader leaves, so neither window may cost the
    other its run, whether it joins (the adapter serves both at once, no takeover) or leaves."""
    adapter = make_adapter(heartbeat_seconds=0.5)
    open_console(browser, adapter, workspace)
    send(browser, "[SLOW] count")
    card = wait_for(browser, '.run[data-state="streaming"]')
    run_id = card.get_attribute("data-run-id")
    wait_until(browser, lambda: "one," in card.text)
    first = browser.current_window_handle
    url = browser.current_url

    browser.switch_to.new_window("window")
    second = browser.current_window_handle
    browser.get(url)
    wait_ready(browser)
    followed = wait_for(browser, f'.run[data-run-id="{run_id}"]')
    wait_until(browser, lambda: followed.get_attribute("data-state") == "finished", timeout=40)
    assert COUNT in " ".join(card_text(followed).split())
    assert whole_run(event_ids(browser))  # from its first event, each once
    thread = url.rsplit("#thread=", 1)[1]
    assert requests_sent(browser) == [
        f"→ GET /threads/{thread}",
        f"→ GET /threads/{thread}/messages?limit=100",
        f"→ GET /threads/{thread}/runs/{run_id}/events",
    ]
    assert console_errors(browser) == []

    browser.switch_to.window(first)
    wait_until(browser, lambda: card.get_attribute("data-state") == "finished", timeout=40)
    assert COUNT in " ".join(card_text(card).split())
    assert card_text(card) == browser.execute_script(
        "return [...document.querySelectorAll('.run .text.assistant')].map(n => n.textContent).join('')"
    )
    assert whole_run(event_ids(browser))
    assert requests_sent(browser) == ["→ POST /"]  # its own stream, never taken over or resumed
    assert console_errors(browser) == []

    # a second run: the other window joins it, then closes; the run goes on for this one
    send(browser, "[SLOW] again")
    again = wait_for_card(browser, 1, "streaming")
    second_run = again.get_attribute("data-run-id")
    browser.switch_to.window(second)
    browser.refresh()
    wait_ready(browser)
    joined = wait_for(browser, f'.run[data-run-id="{second_run}"]')
    wait_until(browser, lambda: "two," in joined.text)
    browser.close()
    browser.switch_to.window(first)
    wait_until(browser, lambda: again.get_attribute("data-state") != "streaming", timeout=40)
    assert again.get_attribute("data-state") == "finished"
    assert COUNT in " ".join(card_text(again).split())
    save_screenshot(browser, "two-windows")
    assert console_errors(browser) == []


def test_a_stream_cut_mid_run_is_resumed_with_last_event_id(make_adapter: Any, workspace: Path, browser: Any) -> None:
    """The page is loaded through a proxy that cuts its ``POST /`` stream after its first
    events: the module resumes the run through the events route from the last id it had, the
    card is drawn whole, each event once (the grace period keeps the run going meanwhile)."""
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.5)
    port = int(adapter.url.rstrip("/").rsplit(":", 1)[1])
    proxy = CuttingProxy(("127.0.0.1", port), [1600])
    try:
        browser.get(proxy.url)
        wait_ready(browser)
        cwd = browser.find_element(By.ID, "cwd")
        cwd.clear()
        cwd.send_keys(str(workspace))
        send(browser, "[SLOW] count")
        card = wait_for_card(browser, 0, "finished", timeout=40)
        assert COUNT in " ".join(card_text(card).split())
        ids = event_ids(browser)
        assert whole_run(ids)
        assert proxy.cut_count == 1
        run_id = card.get_attribute("data-run-id")
        thread = browser.find_element(By.ID, "threadId").get_attribute("value")
        assert requests_sent(browser) == ["→ POST /", f"→ GET /threads/{thread}/runs/{run_id}/events"]
        [resumed] = [text for kind, text in raw_log(browser) if kind.endswith("/events")]
        last = int(resumed.removeprefix("Last-Event-ID: "))
        assert 0 < last < ids[-1]
        [get] = [r for r in proxy.requests if r.method == "GET" and r.path.endswith("/events")]
        assert get.last_event_id == str(last)
        # the browser logs the cut as a failed load; nothing else may be in its console
        errors = console_errors(browser)
        assert all("ERR_INCOMPLETE_CHUNKED_ENCODING" in e or "Failed to load" in e for e in errors), errors
    finally:
        proxy.close()


def test_a_followed_run_that_ended_meanwhile_redraws_the_thread(
    make_adapter: Any, workspace: Path, browser: Any
) -> None:
    """Reload mid-run; the page's GET of the events route reaches the adapter only after the run
    ended, from the run's terminal event (as a reader that has it all): the adapter answers 204.
    The page does not draw an empty run or retry: it draws the thread as it now is, the run's
    text included (from /messages)."""
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.5)
    app = adapter.server.app
    held = threading.Event()

    def late(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ["PATH_INFO"]
        if environ["REQUEST_METHOD"] == "GET" and path.endswith("/events") and not held.is_set():
            held.set()
            _, _, thread_id, _, run_id, _ = path.split("/")
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                shown = requests.get(f"{adapter.url}threads/{thread_id}", timeout=5).json()
                if shown["activeRun"] is None:
                    break
                time.sleep(0.1)
            last_id = Client(adapter.url).events(thread_id, run_id).rest()[-1][0]
            environ["HTTP_LAST_EVENT_ID"] = str(last_id)  # the reader has it all: 204
        return app(environ, start_response)

    adapter.server.app = late
    open_console(browser, adapter, workspace)
    send(browser, "[SLOW] count")
    card = wait_for(browser, '.run[data-state="streaming"]')
    wait_until(browser, lambda: "one," in card.text)
    run_id = card.get_attribute("data-run-id")
    thread = browser.find_element(By.ID, "threadId").get_attribute("value")
    browser.refresh()
    wait_ready(browser)
    asked = [
        f"→ GET /threads/{thread}",
        f"→ GET /threads/{thread}/messages?limit=100",
        f"→ GET /threads/{thread}/runs/{run_id}/events",
        f"→ GET /threads/{thread}",  # drawn again, as it now is
        f"→ GET /threads/{thread}/messages?limit=100",
    ]
    wait_until(browser, lambda: requests_sent(browser) == asked, timeout=40)
    wait_for(browser, '#status[data-restore="done"]')
    assert held.is_set()
    assert ("← 204", "") in raw_log(browser)
    assert run_cards(browser) == []  # no empty card left behind, no error
    drawn = transcript(browser)
    assert [t for r, t in drawn if r == "user"] == ["[SLOW] count"]
    assert COUNT in " ".join(" ".join(t for r, t in drawn if r == "assistant").split())
    assert requests_sent(browser) == asked  # and nothing more: no retry loop
    assert console_errors(browser) == []
