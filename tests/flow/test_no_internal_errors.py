"""No input reaches a 500, and what the log says about one request stays short, over a real
socket: a workspace that cannot be resolved or created is a 400 naming
``forwardedProps.iacCode.cwd``; an unexpected failure is a 500 ``INTERNAL_ERROR`` logged as one
bounded line with the request id, never a traceback quoting the input."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.state.workspace import CWD_FIELD
from tests.support.agui_client import Client, run_body
from tests.support.flow import wait_for

#: The longest log line one request may cause (bytes), and the most it may add to the log.
MAX_LINE = 2048
MAX_GROWTH = 8 * 1024


def deep_path(base: Path, components: int) -> str:
    return str(base) + "/dd" * components


def test_a_workspace_of_a_thousand_components_is_a_400_with_a_bounded_log(
    adapter_process: Any, workspace: Path
) -> None:
    adapter = adapter_process()
    client = Client(adapter.url)
    body = run_body(cwd=deep_path(workspace, 1000))
    data = json.dumps(body).encode()
    assert 2500 < len(data) < 4096  # a 3 KB request
    before = len(adapter.log)
    result = client.run(data, headers={"X-Request-ID": "rid-deep-cwd"})
    assert result.status == 400, result.raw[:300]
    assert result.error["code"] == "INVALID_INPUT"
    assert CWD_FIELD in result.error["message"]
    assert list(workspace.iterdir()) == []  # nothing created
    wait_for(lambda: b"refused=INVALID_INPUT [request rid-deep-cwd]" in adapter.log)  # its last line
    added = adapter.log[before:]
    assert len(added) < MAX_GROWTH, added[:500]
    assert all(len(line) < MAX_LINE for line in added.splitlines()), added[:500]
    assert b"Traceback" not in added
    assert client.session.get(adapter.url + "health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "suffix",
    [
        "/d" * 200,  # deeper than any workspace
        "/" + "n" * 300,  # a component longer than a file name may be
        "/x" * 2100,  # longer than PATH_MAX
        "/a/" + "é" * 200,  # a name long in bytes, not in characters
    ],
    ids=["deep", "long-name", "long-path", "long-utf8-name"],
)
def test_workspaces_that_cannot_be_made_are_400s(client: Client, workspace: Path, suffix: str) -> None:
    result = client.run(run_body(cwd=str(workspace) + suffix))
    assert result.status == 400, result.raw[:300]
    assert result.error["code"] == "INVALID_INPUT" and CWD_FIELD in result.error["message"]
    assert list(workspace.iterdir()) == []


def test_a_deep_but_reasonable_workspace_is_created(client: Client, workspace: Path) -> None:
    cwd = deep_path(workspace, 100)
    result = client.run(run_body(cwd=cwd))
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"
    assert Path(cwd).is_dir()


def test_a_failure_creating_the_workspace_is_a_400(
    adapter: Any, client: Client, workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_mkdir = os.mkdir

    def boom(path: Any, *args: Any, **kwargs: Any) -> None:
        if not str(path).startswith(str(workspace)):
            return real_mkdir(path, *args, **kwargs)
        raise RecursionError("maximum recursion depth exceeded " + str(path) * 500)

    caplog.set_level(logging.INFO)
    monkeypatch.setattr("agui_adapter.state.workspace.os.mkdir", boom)
    result = client.run(run_body(cwd=str(workspace / "new")), headers={"X-Request-ID": "rid-mkdir"})
    assert result.status == 400 and CWD_FIELD in result.error["message"]
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == "rid-mkdir"]
    assert lines and all(not r.exc_info and len(r.getMessage()) < MAX_LINE for r in lines)
    assert all(r.levelno < logging.ERROR for r in lines)  # a refusal, not a failure of the adapter


def test_an_unexpected_failure_is_a_500_and_one_bounded_line(
    adapter: Any, client: Client, workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = adapter.app.engine

    def admit(*args: Any, **kwargs: Any) -> Any:
        try:
            raise KeyError("inner " + "q" * 50_000)
        except KeyError:
            raise ValueError("outer\n" + "p" * 100_000) from None

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(engine, "admit", admit)
    result = client.run(run_body(cwd=str(workspace)), headers={"X-Request-ID": "rid-boom"})
    assert result.status == 500 and result.error["code"] == "INTERNAL_ERROR"
    assert result.headers["X-Request-ID"] == "rid-boom"
    assert "p" * 100 not in result.raw.decode()
    lines = [r for r in caplog.records if getattr(r, "request_id", None) == "rid-boom" and r.levelno >= logging.ERROR]
    assert len(lines) == 1, [r.getMessage()[:200] for r in lines]
    line = lines[0]
    message = line.getMessage()
    assert line.exc_info is None and "\n" not in message and len(message) < MAX_LINE
    assert "ValueError" in message and "rid-boom" in message
    # the server keeps serving
    assert client.run(run_body(cwd=str(workspace))).status == 500
    monkeypatch.undo()
    assert client.run(run_body(cwd=str(workspace))).status == 200
