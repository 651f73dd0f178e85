"""A run's request is parsed and checked once, though the server's I/O thread saw it first.

The built-in server offers every small whole request to the application on its I/O thread
(``answer_inline``): a refusal is answered there; a valid run is declined there, after its
checks, because admission writes and waits. What the application found while declining (the
body, its payload and the validated run input) goes to the same request on its worker
(``http.connection.INLINE_CARRY_KEY``), which takes it only for the very same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import EnvironBuilder

import agui_adapter.web.app as web_app
from agui_adapter.http.connection import INLINE_CARRY_KEY
from agui_adapter.protocol.validation import validate_run_input
from tests.support.agui_client import Client, run_body
from tests.support.servers import InProcessAdapter


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread id of every run input the app validated."""
    seen: list[str] = []

    def counting(payload: Any) -> Any:
        seen.append(payload.get("threadId") if isinstance(payload, dict) else None)
        return validate_run_input(payload)

    monkeypatch.setattr(web_app, "validate_run_input", counting)
    return seen


def test_a_run_is_validated_once_though_the_io_thread_declined_it_first(
    client: Client, workspace: Path, validations: list[str]
) -> None:
    for _ in range(3):
        body = run_body(cwd=str(workspace))
        result = client.run(body)
        assert result.status == 200 and result.types()[-1] == "RUN_FINISHED"
        assert validations.count(body["threadId"]) == 1


def test_a_refusal_is_still_answered_on_the_io_thread_and_validated_once(
    client: Client, workspace: Path, validations: list[str]
) -> None:
    body = {**run_body(cwd=str(workspace)), "threadId": ""}
    result = client.run(body)
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"
    assert validations == [""]


def _call(adapter: InProcessAdapter, body: bytes, carry: Any) -> tuple[str, bytes]:
    environ = EnvironBuilder(
        method="POST",
        path="/",
        data=body,
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
    ).get_environ()
    environ[INLINE_CARRY_KEY] = carry
    status: list[str] = []
    answer = adapter.app(environ, lambda s, h, e=None: status.append(s))
    try:
        first = next(iter(answer))
    finally:
        getattr(answer, "close", lambda: None)()
    return status[0], first


def test_a_carry_for_other_bytes_is_not_taken(adapter: InProcessAdapter, workspace: Path) -> None:
    """Only the very bytes that were checked are spared their checks: a carry that does not
    match the body (a server's mistake) is ignored, and the body is checked as it is."""
    good = run_body(cwd=str(workspace))
    good_bytes = json.dumps(good).encode()
    carry = web_app._Checked(good_bytes, good, validate_run_input(good))
    bad = json.dumps({**good, "threadId": ""}).encode()
    status, first = _call(adapter, bad, carry)
    assert status.startswith("400") and json.loads(first)["error"]["code"] == "INVALID_INPUT"
    status, first = _call(adapter, b"not json", carry)
    assert status.startswith("400")
    status, first = _call(adapter, good_bytes, ("something else",))  # not a carry of this app's
    assert status.startswith("200") and b"RUN_STARTED" in first
