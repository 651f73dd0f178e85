"""Request ids over a real socket: echoed (or made up) on every response, on every log line."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.kernel_client.launch import KernelProcess, free_port
from tests.support.agui_client import Client, run_body
from tests.support.flow import wait_for
from tests.support.servers import InProcessAdapter

GENERATED = re.compile(r"[0-9a-f]{32}")


def records_of(caplog: pytest.LogCaptureFixture, request_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "request_id", None) == request_id]


def test_a_given_request_id_is_echoed_everywhere(adapter: Any, client: Client, workspace: Path) -> None:
    rid = "client-chosen-id/42"
    for response in (
        requests.get(adapter.url + "health", headers={"X-Request-ID": rid}, timeout=10),
        requests.get(adapter.url + "nope", headers={"X-Request-ID": rid}, timeout=10),
        requests.head(adapter.url + "health", headers={"X-Request-ID": rid}, timeout=10),
    ):
        assert response.headers["X-Request-ID"] == rid
    stream = client.run(run_body(cwd=str(workspace)), headers={"X-Request-ID": rid})
    assert stream.status == 200 and stream.headers["X-Request-ID"] == rid
    refused = client.run(run_body(cwd="relative"), headers={"X-Request-ID": rid})
    assert refused.status == 400 and refused.headers["X-Request-ID"] == rid
    cancel = client.cancel("no-such-execution", {"threadId": "t-x", "rosInvocationId": "inv-1"})
    assert cancel.status_code == 404 and GENERATED.fullmatch(cancel.headers["X-Request-ID"])


@pytest.mark.parametrize("given", ["", "x" * 129, "tab\there", "caf\u00e9"])
def test_an_unusable_request_id_is_replaced(adapter: Any, given: str) -> None:
    headers = {"X-Request-ID": given.encode("latin-1")} if given else {}
    response = requests.get(adapter.url + "health", headers=headers, timeout=10)
    assert GENERATED.fullmatch(response.headers["X-Request-ID"])


def test_every_request_gets_its_own_id(adapter: Any) -> None:
    ids = {requests.get(adapter.url + "health", timeout=10).headers["X-Request-ID"] for _ in range(5)}
    assert len(ids) == 5


def test_log_lines_carry_the_request_id(caplog: pytest.LogCaptureFixture, client: Client, workspace: Path) -> None:
    caplog.set_level(logging.INFO)
    result = client.run(run_body(cwd=str(workspace)), headers={"X-Request-ID": "rid-stream-1"})
    assert result.status == 200
    # admitted on the request, ended while the server iterated the body; the access line comes
    # when the server closes the body, which may be just after the client has the last byte
    wait_for(lambda: any(r.name == "agui_adapter.access" for r in records_of(caplog, "rid-stream-1")))
    lines = records_of(caplog, "rid-stream-1")
    assert any("admitted" in r.getMessage() for r in lines)
    assert any(r.name == "agui_adapter.run" for r in lines)
    assert all(r.getMessage().endswith("[request rid-stream-1]") for r in lines)
    client.run(run_body(cwd="relative"), headers={"X-Request-ID": "rid-refused-1"})
    # a refusal served by a worker (its body came after its head) is logged after it is sent
    wait_for(lambda: any("refused" in r.getMessage() for r in records_of(caplog, "rid-refused-1")))
    outside = [r for r in caplog.records if r.name.startswith("agui_adapter") and r.request_id == "-"]
    assert not outside, [r.getMessage() for r in outside]


def test_the_kernel_pump_logs_with_the_request_id(
    caplog: pytest.LogCaptureFixture, make_adapter: Any, workspace: Path
) -> None:
    caplog.set_level(logging.INFO)
    adapter = make_adapter()
    dead = InProcessAdapter(adapter.settings, KernelProcess(f"http://127.0.0.1:{free_port()}/", "x", "dead"))
    try:
        result = dead.client().run(run_body(cwd=str(workspace)), headers={"X-Request-ID": "rid-dead-kernel"})
        assert result.terminal["code"] == "A2A_UNAVAILABLE"
    finally:
        dead.stop()
    lines = records_of(caplog, "rid-dead-kernel")
    assert any("unavailable" in r.getMessage() for r in lines), [r.getMessage() for r in caplog.records]
