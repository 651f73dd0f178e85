"""The adapter's state directory is never a workspace (issue 9, case 5).

A ``cwd`` equal to the state directory, inside it or containing it is refused with
``INVALID_INPUT`` naming ``cwd``, even when it lies under an allowed root (the default roots
include the temp dir, where the state dir may live), symlinks resolved either way, and
nothing is created for the refused request.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol import i18n
from agui_adapter.protocol.errors import AguiError
from agui_adapter.state.workspace import resolve_workspace
from tests.support.flow import wait_for


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(allowed root, state dir inside it); the state dir exists."""
    root = (tmp_path / "root").resolve()
    state = root / "var" / "agui"
    state.mkdir(parents=True)
    return root, state


def refused_as_state_dir(raw: str, roots: list[Path], reserved: list[Path]) -> None:
    with pytest.raises(AguiError) as caught:
        resolve_workspace(raw, roots, reserved)
    assert caught.value.code == "INVALID_INPUT"
    assert caught.value.message == messages.CWD_STATE_DIR


@pytest.mark.parametrize("relative", ["var/agui", "var/agui/threads", "var/agui/a/b/c", "var", "."])
def test_the_state_dir_its_inside_and_its_ancestors_are_refused(layout: tuple[Path, Path], relative: str) -> None:
    root, state = layout
    refused_as_state_dir(str(root / relative), [root], [state])


@pytest.mark.parametrize("relative", ["var/agui-other", "var/aguix/y", "ws", "var/other/agui"])
def test_siblings_and_lookalikes_are_accepted(layout: tuple[Path, Path], relative: str) -> None:
    root, state = layout
    assert resolve_workspace(str(root / relative), [root], [state]) == root / relative


def test_dot_segments_cannot_sneak_in(layout: tuple[Path, Path]) -> None:
    root, state = layout
    refused_as_state_dir(str(root / "ws" / ".." / "var" / "agui" / "threads"), [root], [state])
    refused_as_state_dir(str(root / "var" / "agui" / "."), [root], [state])


def test_a_symlink_into_the_state_dir_is_refused(layout: tuple[Path, Path]) -> None:
    root, state = layout
    (root / "innocent").symlink_to(state / "threads", target_is_directory=True)
    (state / "threads").mkdir()
    refused_as_state_dir(str(root / "innocent"), [root], [state])
    refused_as_state_dir(str(root / "innocent" / "deeper"), [root], [state])


def test_a_state_dir_named_through_a_symlink_is_compared_by_its_real_path(layout: tuple[Path, Path]) -> None:
    root, state = layout
    link = root / "state-link"
    link.symlink_to(state, target_is_directory=True)
    refused_as_state_dir(str(state / "x"), [root], [link])
    refused_as_state_dir(str(root / "var"), [root], [link])
    assert resolve_workspace(str(root / "ws"), [root], [link]) == root / "ws"


def test_a_state_dir_that_does_not_exist_yet_is_reserved_too(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    state = root / "not-yet" / "agui"
    refused_as_state_dir(str(state / "threads"), [root], [state])
    refused_as_state_dir(str(root / "not-yet"), [root], [state])
    assert not (root / "not-yet").exists()


def test_the_roots_are_checked_first_and_nothing_reserved_means_no_change(layout: tuple[Path, Path]) -> None:
    root, state = layout
    with pytest.raises(AguiError) as caught:
        resolve_workspace("/", [root], [state])  # contains the state dir, but outside the roots
    assert caught.value.message == messages.CWD_OUTSIDE_ROOTS
    assert resolve_workspace(str(state), [root]) == state  # the old signature still works


@pytest.mark.parametrize("language", i18n.SUPPORTED_LANGUAGES)
def test_the_message_names_cwd_in_every_language(language: str) -> None:
    assert "cwd" in i18n.translate(language, messages.CWD_STATE_DIR)


# --- over a socket ----------------------------------------------------------------------------


def _body(cwd: str) -> dict[str, Any]:
    return {
        "threadId": f"thread-{uuid.uuid4().hex[:12]}",
        "runId": f"run-{uuid.uuid4().hex[:12]}",
        "state": {},
        "messages": [{"id": "m1", "role": "user", "content": "[WRITE] hello"}],
        "tools": [],
        "context": [],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": cwd}},
    }


def _tree(path: Path) -> set[str]:
    return {str(p) for p in path.rglob("*")}


@pytest.mark.parametrize("where", ["state", "child", "parent"])
@pytest.mark.parametrize("language", ["en", "zh"])
def test_post_with_the_state_dir_as_cwd_is_refused(
    make_adapter: Any, tmp_path: Path, where: str, language: str
) -> None:
    adapter = make_adapter()  # state dir tmp_path/state, allowed root tmp_path
    state = Path(adapter.settings.state_dir).resolve()
    cwd = {"state": state, "child": state / "threads" / "ws", "parent": state.parent}[where]
    wait_for(lambda: adapter.app.engine.store.log.ready)  # its files are made as the process starts
    before = _tree(tmp_path)
    response = requests.post(
        adapter.url,
        data=json.dumps(_body(str(cwd))),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Language": language},
        timeout=30,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT"
    assert "cwd" in error["message"]
    assert error["message"] == i18n.translate(language, messages.CWD_STATE_DIR)
    assert _tree(tmp_path) == before  # nothing created: no workspace, no thread record, no lock file


def test_post_next_to_the_state_dir_is_accepted(make_adapter: Any, tmp_path: Path) -> None:
    adapter = make_adapter()
    response = requests.post(
        adapter.url,
        data=json.dumps(_body(str(tmp_path / "state-ws"))),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        timeout=30,
    )
    assert response.status_code == 200
    assert b"RUN_FINISHED" in response.content
    assert os.path.isdir(tmp_path / "state-ws")
