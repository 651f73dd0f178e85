"""``X-AGUI-Thread-Id`` on ``POST /`` over a real socket: optional, equal to ``threadId`` or a 400.

The header exists so that a load balancer can route every request of a thread to the one
adapter+kernel pair that holds its workspace (``deploy/``); a mismatch is refused before any
state is touched, so the refused run never reaches the kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agui_adapter.protocol.i18n import SUPPORTED_LANGUAGES
from tests.support.agui_client import Client, run_body
from tests.support.flow import kernel_calls


def test_without_the_header_a_run_is_unchanged(client: Client, workspace: Path) -> None:
    result = client.run(run_body("hello", cwd=str(workspace)))
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"


def test_an_equal_header_is_accepted(client: Client, workspace: Path) -> None:
    body = run_body("hello", cwd=str(workspace))
    result = client.run(body, headers={"X-AGUI-Thread-Id": body["threadId"]})
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"
    assert "scripted kernel" in result.text()


@pytest.mark.parametrize("language", sorted(SUPPORTED_LANGUAGES))
def test_a_different_header_is_invalid_input_naming_the_header(
    client: Client, workspace: Path, scripted_kernel: Any, language: str
) -> None:
    body = run_body("hello", cwd=str(workspace))
    sent_before = len(kernel_calls(scripted_kernel, "SendStreamingMessage"))
    result = client.run(body, headers={"X-AGUI-Thread-Id": body["threadId"] + "-other", "Accept-Language": language})
    assert result.status == 400, result.raw
    assert result.error is not None and result.error["code"] == "INVALID_INPUT"
    assert "X-AGUI-Thread-Id" in result.error["message"]
    assert body["threadId"] not in result.error["message"]
    assert len(kernel_calls(scripted_kernel, "SendStreamingMessage")) == sent_before
    # the thread was not created: the same body with the right header runs as a new thread
    again = client.run(body, headers={"X-AGUI-Thread-Id": body["threadId"]})
    assert again.status == 200 and again.terminal["type"] == "RUN_FINISHED"
    assert len(kernel_calls(scripted_kernel, "SendStreamingMessage")) == sent_before + 1
