"""The console page in headless Chromium against the adapter and the scripted kernel.

A person's path through the page: type a message and read the answer as it streams; answer a
permission prompt and see the run complete; cancel a slow run; reload and find the settings
(never the token). Each test saves a screenshot (``$AGUI_ARTIFACT_DIR``) and ends with the
page's console free of JavaScript errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.web.app import json_response
from tests.browser.console import (
    TOKEN,
    event_ids,
    open_console,
    raw_log,
    requests_sent,
    run_cards,
    send,
    visible_buttons,
    wait_for,
    wait_for_card,
    wait_ready,
    wait_until,
)
from tests.support.browser import console_errors, require_selenium, save_screenshot

require_selenium()  # without it: skipped, or failed under CI=true

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.browser


def test_type_a_message_and_read_the_answer(make_adapter: Any, workspace: Path, browser: Any) -> None:
    adapter = make_adapter(auth_token=TOKEN)
    open_console(browser, adapter, workspace, token=TOKEN)
    send(browser, "[THINK] [TOOL] hello")
    card = wait_for(browser, '.run[data-state="finished"]')
    texts = [node.text for node in card.find_elements(By.CSS_SELECTOR, ".text.assistant")]
    assert texts == ["I will read the file.", "Done."]  # the text after the tool call comes after it
    reasoning = card.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.get_attribute("open") is None  # folded
    assert "Let me think about this." in reasoning.find_element(By.TAG_NAME, "pre").get_attribute("textContent")
    tool = card.find_element(By.CSS_SELECTOR, "details.tool")
    assert tool.get_attribute("open") is None  # folded once its result is in, the summary says it all
    summary = tool.find_element(By.TAG_NAME, "summary").text
    assert summary.startswith('tool call · read_file {"path":"notes.md"} → Read 3 lines'), summary
    args = tool.find_element(By.CSS_SELECTOR, "pre.args").get_attribute("textContent")
    assert json.loads(args) == {"path": "notes.md"}
    assert "Read 3 lines" in tool.find_element(By.CSS_SELECTOR, "pre.result-text").get_attribute("textContent")
    assert "artifact notes.md" in card.find_element(By.CSS_SELECTOR, ".artifact").text
    assert "36 total" in card.find_element(By.CSS_SELECTOR, ".usage").text
    log = raw_log(browser)
    kinds = [kind for kind, _ in log]
    assert kinds[0] == "health" and kinds[1] == "→ POST /" and kinds[2] == "← 200"
    assert kinds[3] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED"
    assert json.loads(log[-1][1])["outcome"] == {"type": "success"}
    save_screenshot(browser, "message")
    assert console_errors(browser) == []

    # reloaded, the page remembers the thread and the cwd, never the token
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")
    assert browser.current_url.endswith("#thread=" + thread_id)  # the thread's URL
    browser.refresh()
    wait_ready(browser)
    assert browser.find_element(By.ID, "threadId").get_attribute("value") == thread_id
    assert browser.find_element(By.ID, "cwd").get_attribute("value") == str(workspace)
    assert browser.find_element(By.ID, "token").get_attribute("value") == ""
    stored = browser.execute_script(
        "return JSON.stringify([Object.assign({}, localStorage), Object.assign({}, sessionStorage)])"
    )
    assert TOKEN not in stored and str(workspace) in stored
    # without the token the thread cannot be rebuilt: the page says so (not as a run)
    assert "bearer token" in wait_for(browser, "#transcript .notice.error").text
    assert requests_sent(browser) == [f"→ GET /threads/{thread_id}"]
    # without the token, the adapter's JSON error shows with its status and code
    send(browser, "hello again")
    error = wait_for(browser, '.run[data-state="error"] .error')
    assert error.text.startswith("401 UNAUTHORIZED")
    assert [e for e in console_errors(browser) if "401" not in e] == []  # Chromium logs the refused fetch


def test_answer_a_permission_prompt(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[THINK] [TOOL] hello")  # a first turn on the thread, then the prompt
    wait_for_card(browser, 0, "finished")
    send(browser, "[WRITE] make a file")
    form = wait_for(browser, 'form.interrupt[data-kind="permission"]')
    assert run_cards(browser)[1].get_attribute("data-state") == "interrupted"
    assert "write_file" in form.text and "hello.txt" in form.text
    assert form.find_element(By.CSS_SELECTOR, ".effect").text == "Changes files in the workspace"
    assert "{" not in form.text  # no raw JSON: the safe summary is spelled out
    assert "content 27 characters" in form.text
    # one way to deny: the option labels, no separate "cancel this interrupt"
    assert visible_buttons(form) == {"allow_once": "Allow once", "deny": "Deny"}
    buttons = {b.get_attribute("data-value"): b for b in form.find_elements(By.TAG_NAME, "button")}
    save_screenshot(browser, "permission")  # the README's docs/console.png
    buttons["allow_once"].click()
    resumed = wait_for_card(browser, 2, "finished")
    assert "hello.txt" in resumed.find_element(By.CSS_SELECTOR, "pre.result-text").text
    assert (workspace / "hello.txt").read_text() == "hello from scripted kernel\n"
    posts = [json.loads(text) for kind, text in raw_log(browser) if kind == "→ POST /"]
    assert len(posts) == 3
    assert "answered: Allow once" in form.text
    first, second = posts[1:]
    assert second["threadId"] == first["threadId"] and second["runId"] != first["runId"]
    assert second["forwardedProps"]["iacCode"] == first["forwardedProps"]["iacCode"]
    assert second["messages"] == []
    [answer] = second["resume"]
    assert answer["status"] == "resolved" and answer["payload"] == {"decision": "allow_once"}
    assert answer["interruptId"] == form.get_attribute("data-interrupt-id")
    save_screenshot(browser, "permission-resumed")
    assert console_errors(browser) == []


def test_answer_a_question_with_free_text(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[ASK] where?")
    form = wait_for(browser, 'form.interrupt[data-kind="ask_user_question"]')
    labels = [label.text for label in form.find_elements(By.CSS_SELECTOR, ".choices label")]
    assert labels == ["cn-hangzhou", "cn-shanghai"]
    form.find_element(By.CSS_SELECTOR, "input[value=sh]").click()
    form.find_element(By.CSS_SELECTOR, "textarea[name=freeText]").send_keys("Frankfurt, please")
    form.find_element(By.CSS_SELECTOR, "button.primary").click()
    wait_for_card(browser, 1, "finished")
    body = [json.loads(text) for kind, text in raw_log(browser) if kind == "→ POST /"][1]
    assert body["resume"][0]["payload"] == {"freeText": "Frankfurt, please"}  # the field touched last wins
    save_screenshot(browser, "question")
    assert console_errors(browser) == []


def test_cancel_a_slow_run(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    send(browser, "[SLOW] count")
    card = wait_for(browser, '.run[data-state="streaming"]')
    wait_until(browser, lambda: "two," in card.text)
    cancel = browser.find_element(By.ID, "cancel")
    assert cancel.is_enabled()
    cancel.click()
    wait_for(browser, '.run[data-state="cancelled"]')
    assert "CANCELLED" in card.find_element(By.CSS_SELECTOR, ".error").text
    assert "eight." not in card.text
    log = raw_log(browser)
    [session] = [json.loads(text)["value"] for kind, text in log if kind == "CUSTOM iac-code.session.v1"]
    cancel_at = [i for i, (kind, _) in enumerate(log) if kind.endswith("/cancel")]
    cancel_path = f"/extensions/iac-code/v1/executions/{session['executionId']}/cancel"
    assert [log[i][0] for i in cancel_at] == [f"→ POST {cancel_path}"]
    sent = json.loads(log[cancel_at[0]][1])
    assert sent == {"threadId": session["threadId"], "rosInvocationId": session["rosInvocationId"]}
    assert [json.loads(text) for kind, text in log if kind == "← 200" and text.startswith("{")] == [
        {"executionId": session["executionId"], "status": "cancelled"}
    ]
    [terminal] = [json.loads(text) for kind, text in log if kind in ("RUN_FINISHED", "RUN_ERROR")]
    assert terminal["type"] == "RUN_ERROR" and terminal["code"] == "CANCELLED"
    assert not cancel.is_enabled() and browser.find_element(By.ID, "send").is_enabled()
    save_screenshot(browser, "cancelled")
    assert console_errors(browser) == []


def test_no_reattach_offer_without_server_support(adapter: Any, workspace: Path, browser: Any) -> None:
    """A server whose /health does not advertise reattach (an older adapter) gets no offer."""
    plain_health = adapter.app.health

    def silent_health(start_response: Any) -> list[bytes]:
        body = json.loads(b"".join(plain_health(lambda *a: None)))
        body.pop("reattach")
        return json_response(start_response, 200, body)

    adapter.app.health = silent_health
    open_console(browser, adapter, workspace, status="unsupported")
    send(browser, "[SLOW] count")
    card = wait_for(browser, '.run[data-state="streaming"]')
    wait_until(browser, lambda: "one," in card.text)
    assert browser.execute_script("return sessionStorage.getItem('agui-console.live')") is not None
    browser.refresh()
    wait_ready(browser, "unsupported")
    assert not browser.find_element(By.ID, "reattach").is_displayed()
    assert browser.find_elements(By.ID, "reattachButton") == []
    assert browser.execute_script("return sessionStorage.getItem('agui-console.live')") is None
    assert run_cards(browser) == []  # not followed either
    assert console_errors(browser) == []


def test_the_console_check_sees_javascript_errors(adapter: Any, browser: Any) -> None:
    browser.get(adapter.url)
    wait_ready(browser)
    browser.execute_script("setTimeout(() => { throw new Error('console-check-probe'); }, 0)")
    wait_until(browser, lambda: any("console-check-probe" in e for e in console_errors(browser)), timeout=5)


def test_a_pipeline_as_a_timeline_with_its_choices(adapter: Any, workspace: Path, browser: Any) -> None:
    open_console(browser, adapter, workspace)
    Select(browser.find_element(By.ID, "runMode")).select_by_value("pipeline")
    send(browser, "[PIPE-CANDIDATES] build a small website")
    form = wait_for(browser, 'form.interrupt[data-kind="candidate_selection"]')
    first = run_cards(browser)[0]
    steps = [row.text for row in first.find_elements(By.CSS_SELECTOR, ".timeline.step")]
    assert steps[:3] == [
        "step intent_parsing finished",
        "step architecture_planning finished",
        "step evaluate_candidates finished",
    ]
    events = [row.text for row in first.find_elements(By.CSS_SELECTOR, ".timeline:not(.step)")]
    assert events[0].endswith("pipeline_started · pipeline · working")
    assert any("candidate_completed" in e and "· Plan B" in e for e in events), events
    # the step the selection pauses is waiting, not finished
    waiting = [row.text for row in first.find_elements(By.CSS_SELECTOR, ".timeline.step.waiting")]
    assert waiting == ["step confirm_and_select waiting for your answer"]
    # option ids are the candidates' indexes, as the real kernel sends them; labels, not ids
    assert visible_buttons(form) == {"0": "Choose Plan A", "1": "Choose Plan B", "decline": "Decline…"}
    # each candidate with its summary, cost items and total (candidatePresentation rich)
    plans = [card.text for card in form.find_elements(By.CSS_SELECTOR, ".option")]
    assert "One ECS instance behind an SLB." in plans[0] and "¥42.50/月" in plans[0] and "SLB" in plans[0]
    assert "A static site on OSS behind CDN." in plans[1] and "CDN traffic ¥6.00/月" in plans[1]
    assert "total per month ¥8.00/月" in plans[1]
    form.find_element(By.CSS_SELECTOR, 'button[data-value="1"]').click()
    # selling's deploying asks for ros_deploy's permission (tests/data/a2a-selling/10): a deployment
    # approval shows what it changes, where, and what it costs
    confirm = wait_for(browser, 'form.interrupt[data-kind="permission"]')
    assert "ros_deploy" in confirm.text
    assert confirm.find_element(By.CSS_SELECTOR, ".effect").text == "Changes cloud resources"
    facts = dict(
        zip(
            [dt.text for dt in confirm.find_elements(By.TAG_NAME, "dt")],
            [dd.text for dd in confirm.find_elements(By.TAG_NAME, "dd")],
            strict=True,
        )
    )
    assert facts["API calls"] == "ROS CreateStack (change)" and facts["region"] == "cn-hangzhou"
    assert facts["plan"] == "Plan B" and facts["action"] == "create"
    rows = [
        [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        for row in confirm.find_elements(By.CSS_SELECTOR, "table.costs tr")
        if row.find_elements(By.TAG_NAME, "td")
    ]
    assert rows == [["OSS standard storage", "¥2.00/月"], ["CDN traffic", "¥6.00/月"], ["total per month", "¥8.00/月"]]
    assert visible_buttons(confirm) == {"allow_once": "Allow once", "deny": "Deny"}
    save_screenshot(browser, "pipeline-confirm")
    confirm.find_element(By.CSS_SELECTOR, 'button[data-value="allow_once"]').click()
    last = wait_for_card(browser, 2, "finished", timeout=30)
    assert "pipeline_completed" in last.text
    posts = [json.loads(text) for kind, text in raw_log(browser) if kind == "→ POST /"]
    assert [p["resume"][0]["payload"] for p in posts[1:]] == [{"selectedId": "1"}, {"decision": "allow_once"}]
    assert all(p["forwardedProps"]["iacCode"]["runMode"] == "pipeline" for p in posts)
    assert posts[0]["forwardedProps"]["iacCode"]["candidatePresentation"] == "rich"
    save_screenshot(browser, "pipeline")
    assert console_errors(browser) == []


def test_a_reload_mid_run_follows_the_run_to_its_end(make_adapter: Any, workspace: Path, browser: Any) -> None:
    """Reload the page halfway: the run goes on (grace period); the page learns from
    GET /threads/{id} that a run is live and follows it on its own through its events route,
    from its first event, to its end; nothing is cancelled. (Needs GET /threads/{id}.)"""
    adapter = make_adapter(disconnect_grace_seconds=30, heartbeat_seconds=0.5)
    open_console(browser, adapter, workspace)
    send(browser, "[SILENT 2] [SLOW] count")  # about 12 s at the browser suite's human speed
    card = wait_for(browser, '.run[data-state="streaming"]')
    run_id = card.get_attribute("data-run-id")
    thread_id = browser.find_element(By.ID, "threadId").get_attribute("value")
    browser.refresh()
    wait_ready(browser)
    followed = wait_for(browser, f'.run[data-run-id="{run_id}"]')
    assert browser.find_elements(By.ID, "reattachButton") == []  # no button to press
    wait_until(browser, lambda: followed.get_attribute("data-state") == "finished", timeout=30)
    assert "one," in followed.text and "eight." in followed.text
    assert browser.find_element(By.ID, "cancel").is_enabled() is False
    # the user's message is back (from /messages), above the run
    assert browser.find_element(By.CSS_SELECTOR, "#transcript .user").text == "[SILENT 2] [SLOW] count"
    thread = f"/threads/{thread_id}"
    assert requests_sent(browser) == [
        f"→ GET {thread}",
        f"→ GET {thread}/messages?limit=100",
        f"→ GET {thread}/runs/{run_id}/events",
    ]
    kinds = [kind for kind, _ in raw_log(browser)]
    assert kinds.count("RUN_STARTED") == 1 and kinds[-1] == "RUN_FINISHED"
    ids = event_ids(browser)
    assert ids == list(range(1, len(ids) + 1))  # the whole run from its first event, each once
    assert not browser.find_element(By.ID, "reattach").is_displayed()
    save_screenshot(browser, "reattached")
    assert console_errors(browser) == []
