"""``forwardedProps`` keys other than ``iacCode`` (CopilotKit's ``toolChoice``), over real sockets.

They are accepted and ignored: the run is the one ``iacCode`` alone describes, their values
never reach the kernel, the state directory or the logs, and a retry that differs only in them
is the same run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.support.agui_client import Client, resume, run_body, session_value
from tests.support.flow import interrupted, kernel_calls

MARKER = "tool-choice-marker-5f1c"


def with_tool_choice(body: dict[str, Any], value: Any = MARKER, **more: Any) -> dict[str, Any]:
    """``body`` with what CopilotKit's runtime adds beside the app's properties."""
    body["forwardedProps"]["toolChoice"] = value
    body["forwardedProps"].update(more)
    return body


def state_files_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_tool_choice_beside_iac_code_runs_and_goes_nowhere(
    client: Client, workspace: Path, scripted_kernel: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = with_tool_choice(run_body("[THINK] [TOOL] hello", cwd=str(workspace)), {"type": "function", "name": MARKER})
    result = client.run(body)
    assert result.status == 200, result.error
    assert result.terminal["type"] == "RUN_FINISHED" and result.terminal["outcome"] == {"type": "success"}
    assert result.of("TOOL_CALL_START") and result.of("REASONING_START")
    sent = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(result)["contextId"])
    assert sent and all(MARKER not in json.dumps(call) and "toolChoice" not in json.dumps(call) for call in sent)
    assert MARKER not in caplog.text
    assert MARKER not in state_files_text(tmp_path / "state")


def test_a_retry_that_differs_only_in_other_keys_is_the_same_run(client: Client, workspace: Path) -> None:
    body = with_tool_choice(run_body(cwd=str(workspace)), "auto")
    assert client.run(body).terminal["type"] == "RUN_FINISHED"
    retry = json.loads(json.dumps(body))
    retry["forwardedProps"]["toolChoice"] = "none"
    retry["forwardedProps"]["appTab"] = 3
    refused = client.run(retry)
    assert (refused.status, refused.error["code"]) == (409, "DUPLICATE_RUN_ID")
    del retry["forwardedProps"]["toolChoice"], retry["forwardedProps"]["appTab"]
    assert client.run(retry).error["code"] == "DUPLICATE_RUN_ID"
    retry["forwardedProps"]["iacCode"]["model"] = "another-model"  # iacCode is part of the run
    assert client.run(retry).error["code"] == "RUN_ID_CONFLICT"
    # A reattach by POST with the run's body but other toolChoice still finds the run.
    again = client.reattach(with_tool_choice(json.loads(json.dumps(body)), "required"), 1)
    assert again.status == 200
    assert again.rest()[-1][1]["type"] == "RUN_FINISHED"


def test_resume_with_tool_choice_and_iac_code_stays_strict(
    client: Client, workspace: Path, scripted_kernel: Any
) -> None:
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    strict = with_tool_choice(resume(body, answer))
    strict["forwardedProps"]["iacCode"]["toolChoice"] = "auto"  # inside iacCode: refused, named
    refused = client.run(strict)
    assert (refused.status, refused.error["code"]) == (400, "INVALID_INPUT")
    assert "forwardedProps.iacCode.toolChoice" in refused.error["message"]
    resumed = client.run(with_tool_choice(resume(body, answer)))
    assert resumed.terminal["type"] == "RUN_FINISHED" and resumed.terminal["outcome"] == {"type": "success"}
    assert (workspace / "hello.txt").exists()
    sent = kernel_calls(scripted_kernel, "SendStreamingMessage", session_value(result)["contextId"])
    assert all(MARKER not in json.dumps(call) for call in sent)
