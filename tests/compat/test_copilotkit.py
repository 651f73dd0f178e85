"""CopilotKit's runtime (``@copilotkit/runtime`` 1.75.0, v2 single route) in front of the adapter.

The recipe's ``examples/copilotkit/server.mjs`` runs as written, its one agent an
``@ag-ui/client`` ``HttpAgent`` pointed at the adapter (built-in server, scripted kernel);
``tests/support/copilotkit/frontend.mjs`` drives it with the React front end's own agent class
and the calls ``CopilotKitCore`` makes: text, reasoning, tool calls and custom events, a
permission interrupt answered through ``resume``, Stop, and suggestions (``toolChoice`` in
``forwardedProps``). Every stream the adapter sent is read back from its events route, checked
and recorded for the official client's replay (``AGUI_STREAM_DIR``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from agui_adapter.protocol import catalog as messages
from tests.support.agui_stream import RECORDER, check_stream, parse_sse
from tests.support.copilotkit import (
    ROOT,
    Frontend,
    RuntimeServer,
    app_dir,
    require_copilotkit,
    terminal,
    types,
)
from tests.support.flow import kernel_calls, wait_for

pytestmark = pytest.mark.copilotkit

CLIENT_MODULE = ROOT / "agui_adapter" / "web" / "console" / "agui-adapter-client.mjs"


class Stack:
    """Adapter, CopilotKit runtime and front end, plus what the tests check them with."""

    def __init__(
        self, adapter: Any, runtime: RuntimeServer, frontend: Frontend, workspace: Path, token: str | None = None
    ) -> None:
        self.adapter, self.runtime, self.frontend = adapter, runtime, frontend
        self.workspace = workspace
        self.token = token  # the adapter's bearer token, if it has one

    def props(self, **extra: Any) -> dict[str, Any]:
        """The app's CopilotKit ``properties``: forwardedProps with ``iacCode`` for the thread."""
        iac = {"schemaVersion": 1, "rosInvocationId": "inv-ck", "cwd": str(self.workspace)}
        return {"iacCode": iac, **extra}

    def turn(self, thread: str, text: str, **kw: Any) -> dict[str, Any]:
        props = kw.pop("props", None) or self.props()
        return self.frontend.call("turn", threadId=thread, text=text, props=props, **kw)

    def adapter_stream(self, thread: str, answer: dict[str, Any]) -> list[dict[str, Any]]:
        """What the adapter itself sent for the run the front end saw, from its events route;
        checked as every stream of the suites is, and recorded for the official client."""
        [started] = [e for e in answer["events"] if e["type"] == "RUN_STARTED"]
        url = f"{self.adapter.url}threads/{quote(thread, safe='')}/runs/{quote(started['runId'], safe='')}/events"
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        response = requests.get(url, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        events = parse_sse(response.content)
        check_stream(events)
        RECORDER.record(thread, response.content)
        return events


@pytest.fixture
def stack_factory(adapter_process: Any, tmp_path: Path, workspace: Path) -> Iterator[Callable[..., Stack]]:
    modules = require_copilotkit()
    app = app_dir(tmp_path, modules)
    started: list[tuple[RuntimeServer, Frontend]] = []

    def factory(
        *adapter_args: str,
        runtime_env: dict[str, str] | None = None,
        route: Callable[[str], str] | None = None,
        token: str | None = None,
    ) -> Stack:
        """``route`` maps the adapter's URL to the one the runtime is given (a proxy's);
        ``token``: the adapter's bearer token, given to the runtime as the recipe reads it."""
        adapter = adapter_process(*adapter_args, env={"IAC_CODE_AGUI_AUTH_TOKEN": token} if token else None)
        env = {**(runtime_env or {}), **({"AGUI_ADAPTER_TOKEN": token} if token else {})}
        runtime = RuntimeServer(app, route(adapter.url) if route else adapter.url, env).start()
        frontend = Frontend(app, runtime.url)
        started.append((runtime, frontend))
        return Stack(adapter, runtime, frontend, workspace, token)

    yield factory
    for runtime, frontend in started:
        frontend.close()
        runtime.stop()


@pytest.fixture
def stack(stack_factory: Callable[..., Stack]) -> Stack:
    return stack_factory("--heartbeat-seconds", "2")


def custom_value(answer: dict[str, Any], name: str) -> dict[str, Any]:
    [value] = [e["value"] for e in answer["events"] if e["type"] == "CUSTOM" and e["name"] == name]
    return value  # type: ignore[no-any-return]


def test_text_reasoning_tool_calls_and_custom_events(stack: Stack) -> None:
    thread = "ck-turns"
    answer = stack.turn(thread, "[THINK] [PROGRESS] hello")
    assert answer["error"] is None, answer
    seen = types(answer)
    assert terminal(answer)["type"] == "RUN_FINISHED" and terminal(answer)["outcome"] == {"type": "success"}
    for kind in ("REASONING_START", "REASONING_MESSAGE_CONTENT", "REASONING_END", "TEXT_MESSAGE_CONTENT"):
        assert kind in seen, kind
    assert seen.index("TOOL_CALL_START") < seen.index("TOOL_CALL_ARGS") < seen.index("TOOL_CALL_END")
    assert seen.index("TOOL_CALL_END") < seen.index("TOOL_CALL_RESULT")
    names = [e["name"] for e in answer["events"] if e["type"] == "CUSTOM"]
    assert "iac-code.session.v1" in names and "iac-code.artifact.v1" in names
    assert names.count("iac-code.tool-progress.v1") == 2
    roles = [m["role"] for m in answer["messages"]]
    assert roles[0] == "user" and "assistant" in roles and "tool" in roles and "reasoning" in roles
    # The runtime hands the front end every event the adapter sent, in order.
    assert [e["type"] for e in stack.adapter_stream(thread, answer)] == seen
    # The next turn carries the whole history (reasoning, tool call and result included).
    again = stack.turn(thread, "[RECALL]")
    assert terminal(again)["type"] == "RUN_FINISHED", again
    text = "".join(e["delta"] for e in again["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "This context has seen 2 user turns."
    stack.adapter_stream(thread, again)


def test_permission_interrupt_answered_through_resume(stack: Stack) -> None:
    thread = "ck-interrupt"
    first = stack.turn(thread, "[WRITE] make a file")
    end = terminal(first)
    assert end["type"] == "RUN_FINISHED" and end["outcome"]["type"] == "interrupt", first
    [interrupt] = end["outcome"]["interrupts"]
    assert interrupt["reason"] == "tool_call" and interrupt["metadata"]["kind"] == "permission"
    [call] = [e for e in first["events"] if e["type"] == "TOOL_CALL_START"]
    assert interrupt["toolCallId"] == call["toolCallId"]
    stack.adapter_stream(thread, first)
    # The front end's interrupt state builds the resume (and a tool message for the call).
    resumed = stack.frontend.call(
        "resume", threadId=thread, status="resolved", payload={"decision": "allow_once"}, props=stack.props()
    )
    assert resumed["error"] is None, resumed
    assert terminal(resumed)["type"] == "RUN_FINISHED" and terminal(resumed)["outcome"] == {"type": "success"}
    [result] = [e for e in resumed["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == interrupt["toolCallId"]
    assert (stack.workspace / "hello.txt").exists()
    stack.adapter_stream(thread, resumed)
    after = stack.turn(thread, "hello again")
    assert terminal(after)["type"] == "RUN_FINISHED", after


def test_the_adapter_token_stays_on_the_server_and_the_thread_header_gets_through(
    stack_factory: Callable[..., Stack],
) -> None:
    """The recipe's ``AGUI_ADAPTER_TOKEN`` authenticates the runtime to the adapter, whatever
    ``Authorization`` the browser sends the runtime; the provider's ``X-AGUI-Thread-Id`` header
    reaches the adapter (the runtime forwards ``X-*`` headers), for sticky routing by thread."""
    stack = stack_factory("--heartbeat-seconds", "2", token="ck-adapter-token-7d1e")
    thread = "ck-headers"
    answer = stack.turn(thread, "hello", headers={"Authorization": "Bearer the-app-s-own", "X-AGUI-Thread-Id": thread})
    assert terminal(answer)["type"] == "RUN_FINISHED", answer
    stack.adapter_stream(thread, answer)
    other = stack.turn(thread, "hello", headers={"X-AGUI-Thread-Id": "another-thread"})
    end = terminal(other)
    assert end["type"] == "RUN_ERROR" and "400" in end["message"] and "INVALID_INPUT" in end["message"], other
    assert messages.THREAD_HEADER_MISMATCH in end["message"]


def stop_and_turn_again(stack: Stack, scripted_kernel: Any, thread: str) -> tuple[float, float]:
    """Stop a run while the kernel is silent, then turn again; (seconds from Stop to the
    kernel's CancelTask, seconds from Stop to the next turn being admitted)."""
    stopped = stack.turn(thread, "[SILENT 1200] think for a minute", stopOn="CUSTOM")
    stop_at = time.monotonic() - stopped["stoppedAfterMs"] / 1000
    assert stopped["stoppedAfterMs"] < 10_000, stopped  # the front end's run ends at once
    assert "RUN_FINISHED" not in types(stopped)
    task = custom_value(stopped, "iac-code.session.v1")["taskId"]
    wait_for(lambda: any(c["params"]["id"] == task for c in kernel_calls(scripted_kernel, "CancelTask")), 45)
    cancelled = time.monotonic() - stop_at
    events = stack.adapter_stream(thread, stopped)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED", events[-1]
    # The next turn: a thread that is still busy answers 409 THREAD_BUSY (as RUN_ERROR through the
    # runtime); it must be free within the deadline, long before the silent kernel would have ended.
    deadline = time.monotonic() + 30
    while True:
        again = stack.turn(thread, "[RECALL] are you there?")
        end = terminal(again)
        if end["type"] == "RUN_FINISHED":
            break
        assert "THREAD_BUSY" in end.get("message", ""), again
        assert time.monotonic() < deadline, "the thread stayed busy after Stop"
        time.sleep(0.2)
    free = time.monotonic() - stop_at
    assert end["outcome"] == {"type": "success"}
    stack.adapter_stream(thread, again)
    return cancelled, free


def test_stop_cancels_the_kernel_task_and_the_next_turn_works(stack: Stack, scripted_kernel: Any) -> None:
    cancelled, free = stop_and_turn_again(stack, scripted_kernel, "ck-stop")
    print(f"Stop -> kernel CancelTask {cancelled:.2f} s, thread free {free:.2f} s")


def test_stop_with_the_adapter_agent_frees_the_thread_at_once(
    stack_factory: Callable[..., Stack], scripted_kernel: Any
) -> None:
    """With the adapter's client module (``AGUI_ADAPTER_CLIENT_MODULE``), Stop also calls the
    cancel extension: the thread is free at once, whatever the server notices of the hang-up
    (heartbeats every 60 s here)."""
    assert CLIENT_MODULE.is_file(), CLIENT_MODULE  # shipped with the package: never skipped
    stack = stack_factory("--heartbeat-seconds", "60", runtime_env={"AGUI_ADAPTER_CLIENT_MODULE": str(CLIENT_MODULE)})
    cancelled, free = stop_and_turn_again(stack, scripted_kernel, "ck-stop-agent")
    print(f"Stop (adapter agent) -> kernel CancelTask {cancelled:.2f} s, thread free {free:.2f} s")
    assert free < 5, free


def test_suggestions_on(stack: Stack) -> None:
    """CopilotKit puts ``toolChoice`` beside the app's properties in ``forwardedProps``: accepted
    and ignored. Its suggestion run also sends its ``copilotkitSuggest`` tool, which the contract
    refuses (``tools`` must be empty): that run fails alone, the thread goes on."""
    thread = "ck-suggest"
    answer = stack.turn(thread, "hello", props=stack.props(toolChoice="auto"))
    assert terminal(answer)["type"] == "RUN_FINISHED" and terminal(answer)["outcome"] == {"type": "success"}, answer
    stack.adapter_stream(thread, answer)
    suggestion = stack.frontend.call("suggest", threadId=thread, props=stack.props())
    end = terminal(suggestion)
    assert end["type"] == "RUN_ERROR", suggestion
    assert "INVALID_INPUT" in end["message"] and messages.TOOLS_NOT_SUPPORTED in end["message"]
    assert "forwardedProps" not in end["message"]  # toolChoice itself was accepted
    after = stack.turn(thread, "[RECALL]")
    assert terminal(after)["type"] == "RUN_FINISHED", after
    text = "".join(e["delta"] for e in after["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "This context has seen 2 user turns."


def test_a_page_that_leaves_does_not_stop_the_run(stack: Stack, scripted_kernel: Any) -> None:
    """Closing the tab is not a Stop for CopilotKit: its runtime stops forwarding to that page
    and keeps reading the run from the adapter to its end (the recipe README's "A tab that
    closes"); meanwhile it answers another turn on the thread with an empty stream."""
    thread = "ck-leave"
    left = stack.turn(thread, "[SILENT 100] think for a while", leaveOn="CUSTOM")
    assert left["stoppedAfterMs"] < 10_000 and "RUN_FINISHED" not in types(left), left
    task = custom_value(left, "iac-code.session.v1")["taskId"]
    meanwhile = stack.turn(thread, "[RECALL] me again")
    assert meanwhile["events"] == [] and meanwhile["error"] is None, meanwhile  # CopilotKit's silent refusal
    wait_for(lambda: b"Thread already running" in stack.runtime.log, 10)
    events = stack.adapter_stream(thread, left)  # follows the live run to its end
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, events[-1]
    assert task not in {c["params"]["id"] for c in kernel_calls(scripted_kernel, "CancelTask")}
    again = stack.turn(thread, "[RECALL] and now")
    assert terminal(again)["type"] == "RUN_FINISHED", again


def test_the_adapter_agent_reconnects_behind_the_runtime(stack_factory: Callable[..., Stack]) -> None:
    """With the adapter's client module and a disconnect grace period, a connection between the
    runtime and the adapter that drops mid-run is resumed with Last-Event-ID: the front end sees
    one whole run (the recipe README's "Reattach and Stop")."""
    assert CLIENT_MODULE.is_file(), CLIENT_MODULE  # shipped with the package: never skipped
    from urllib.parse import urlsplit

    from tests.support.cutting_proxy import CuttingProxy  # shipped with the client module

    proxies: list[CuttingProxy] = []

    def through_a_cutting_proxy(adapter_url: str) -> str:
        parts = urlsplit(adapter_url)
        proxies.append(CuttingProxy((parts.hostname or "127.0.0.1", parts.port or 80), [1500, 2500]))
        return proxies[0].url

    stack = stack_factory(
        "--disconnect-grace-seconds",
        "30",
        "--heartbeat-seconds",
        "1",
        runtime_env={"AGUI_ADAPTER_CLIENT_MODULE": str(CLIENT_MODULE)},
        route=through_a_cutting_proxy,
    )
    [proxy] = proxies
    try:
        thread = "ck-reconnect"
        answer = stack.turn(thread, "[SLOW] [THINK] go")
        assert answer["error"] is None, answer
        end = terminal(answer)
        assert end["type"] == "RUN_FINISHED" and end["outcome"] == {"type": "success"}, answer
        assert proxy.cut_count == 2
        resumed = [r for r in proxy.streams() if r.method == "GET"]
        assert resumed and all(r.last_event_id for r in resumed), proxy.requests
        # Exactly the adapter's run: every event once, in order.
        whole = stack.adapter_stream(thread, answer)
        assert [e["type"] for e in whole] == types(answer)
        assert [e.get("delta") for e in whole] == [e.get("delta") for e in answer["events"]]
    finally:
        proxy.close()
