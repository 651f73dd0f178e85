"""The iac-code workspace: allowed roots, confinement, and creating only when asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.errors import AguiError
from agui_adapter.state.workspace import Workspaces, allowed_roots, ensure_workspace, resolve_workspace


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path.resolve()


def refused(raw: str, roots: list[Path], template: str) -> None:
    with pytest.raises(AguiError) as caught:
        resolve_workspace(raw, roots)
    assert caught.value.code == "INVALID_INPUT"
    assert caught.value.message == template


def snapshot(path: Path) -> set[str]:
    return {str(p) for p in path.rglob("*")}


# --- allowed roots -------------------------------------------------------------------------


def test_defaults_are_process_cwd_and_temp_dir(tmp_path: Path) -> None:
    cwd, temp = tmp_path / "cwd", tmp_path / "temp"
    cwd.mkdir()
    temp.mkdir()
    assert allowed_roots({}, str(cwd), str(temp)) == [cwd.resolve(), temp.resolve()]


def test_defaults_skip_missing_directories_and_duplicates(tmp_path: Path) -> None:
    assert allowed_roots({}, str(tmp_path / "missing"), str(tmp_path)) == [tmp_path.resolve()]
    assert allowed_roots({}, str(tmp_path), str(tmp_path)) == [tmp_path.resolve()]


def test_agui_variable_wins(tmp_path: Path) -> None:
    a, b, c = (tmp_path / name for name in "abc")
    for path in (a, b, c):
        path.mkdir()
    env = {
        "IAC_CODE_AGUI_ALLOWED_CWDS": os.pathsep.join([str(a), "", str(b)]),
        "IACCODE_A2A_ALLOWED_CWDS": str(c),
    }
    assert allowed_roots(env, str(tmp_path), str(tmp_path)) == [a.resolve(), b.resolve()]


def test_kernel_variable_is_the_fallback(tmp_path: Path) -> None:
    c = tmp_path / "c"
    c.mkdir()
    env = {"IAC_CODE_AGUI_ALLOWED_CWDS": "", "IACCODE_A2A_ALLOWED_CWDS": str(c)}
    assert allowed_roots(env, "/nonexistent-cwd", "/nonexistent-temp") == [c.resolve()]


def test_configured_roots_drop_files_and_missing_paths(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    env = {"IAC_CODE_AGUI_ALLOWED_CWDS": os.pathsep.join([str(file), str(tmp_path / "nope")])}
    assert allowed_roots(env, str(tmp_path), str(tmp_path)) == []


def test_only_separators_gives_no_roots(tmp_path: Path) -> None:
    env = {"IAC_CODE_AGUI_ALLOWED_CWDS": os.pathsep * 3}
    assert allowed_roots(env, str(tmp_path), str(tmp_path)) == []


def test_roots_expand_home_and_resolve_symlinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "ws").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(home / "ws")
    monkeypatch.setenv("HOME", str(home))
    env = {"IAC_CODE_AGUI_ALLOWED_CWDS": os.pathsep.join(["~/ws", str(link)])}
    assert allowed_roots(env, str(tmp_path), str(tmp_path)) == [(home / "ws").resolve()]


def test_relative_roots_are_taken_from_the_process_cwd(tmp_path: Path) -> None:
    (tmp_path / "rel").mkdir()
    env = {"IAC_CODE_AGUI_ALLOWED_CWDS": "rel"}
    assert allowed_roots(env, str(tmp_path), "/nonexistent") == [(tmp_path / "rel").resolve()]


def test_allowed_roots_creates_nothing(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    allowed_roots({"IAC_CODE_AGUI_ALLOWED_CWDS": str(tmp_path / "x")}, str(tmp_path), str(tmp_path))
    assert snapshot(tmp_path) == before


# --- resolve -----------------------------------------------------------------------------


def test_root_itself_and_existing_child(root: Path) -> None:
    (root / "child").mkdir()
    assert resolve_workspace(str(root), [root]) == root
    assert resolve_workspace(str(root / "child"), [root]) == root / "child"


def test_missing_child_is_accepted_but_not_created(root: Path) -> None:
    target = root / "a" / "b"
    before = snapshot(root)
    assert resolve_workspace(str(target), [root]) == target
    assert not target.exists()
    assert snapshot(root) == before


def test_path_is_normalized(root: Path) -> None:
    assert resolve_workspace(f"{root}/x/../y/./z/", [root]) == root / "y" / "z"


def test_dotdot_escape_is_refused(root: Path) -> None:
    refused(f"{root}/../outside", [root], messages.CWD_OUTSIDE_ROOTS)


def test_sibling_with_common_prefix_is_outside(root: Path) -> None:
    sibling = Path(str(root) + "-evil")
    refused(str(sibling), [root], messages.CWD_OUTSIDE_ROOTS)


def test_symlink_escaping_a_root_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    refused(str(root / "escape"), [root], messages.CWD_OUTSIDE_ROOTS)
    refused(str(root / "escape" / "deeper"), [root], messages.CWD_OUTSIDE_ROOTS)


def test_symlink_into_a_root_resolves_to_the_real_path(root: Path, tmp_path: Path) -> None:
    (root / "real").mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(root / "real")
    assert resolve_workspace(str(alias), [root]) == root / "real"


def test_roots_given_unresolved_are_compared_resolved(root: Path, tmp_path: Path) -> None:
    alias_root = tmp_path / "alias-root"
    alias_root.symlink_to(root)
    assert resolve_workspace(str(root / "ws"), [alias_root]) == root / "ws"


@pytest.mark.parametrize("raw", ["relative/path", "./ws", "ws", "$HOME/ws", "~nosuchuser-xyz/ws"])
def test_relative_paths_are_refused(raw: str, root: Path) -> None:
    refused(raw, [root], messages.CWD_NOT_ABSOLUTE)


def test_empty_is_refused(root: Path) -> None:
    refused("", [root], messages.CWD_NOT_ABSOLUTE)


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert resolve_workspace("~/ws", [home.resolve()]) == home.resolve() / "ws"


def test_environment_variables_are_not_expanded(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGUI_TEST_ESCAPE", "../../..")
    resolved = resolve_workspace(f"{root}/$AGUI_TEST_ESCAPE/ws", [root])
    assert resolved == root / "$AGUI_TEST_ESCAPE" / "ws"


def test_file_is_refused(root: Path) -> None:
    (root / "file.txt").write_text("x")
    refused(str(root / "file.txt"), [root], messages.CWD_NOT_DIRECTORY)


def test_path_under_a_file_is_refused(root: Path) -> None:
    (root / "file.txt").write_text("x")
    refused(str(root / "file.txt" / "sub"), [root], messages.CWD_NOT_DIRECTORY)


def test_symlink_to_a_file_is_refused(root: Path) -> None:
    (root / "file.txt").write_text("x")
    (root / "link").symlink_to(root / "file.txt")
    refused(str(root / "link"), [root], messages.CWD_NOT_DIRECTORY)


def test_outside_check_comes_before_the_directory_check(root: Path, tmp_path: Path) -> None:
    outside_file = tmp_path / "outside.txt"
    outside_file.write_text("x")
    refused(str(outside_file), [root], messages.CWD_OUTSIDE_ROOTS)


def test_no_roots_refuses_everything(root: Path) -> None:
    refused(str(root), [], messages.CWD_OUTSIDE_ROOTS)


def test_nul_byte_is_invalid(root: Path) -> None:
    refused(f"{root}/a\x00b", [root], messages.CWD_INVALID)


def test_symlink_loop_is_refused(root: Path) -> None:
    (root / "loop").symlink_to(root / "loop")
    refused(str(root / "loop" / "x"), [root], messages.CWD_INVALID)
    refused(str(root / "loop"), [root], messages.CWD_INVALID)


def test_one_of_several_roots(root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert resolve_workspace(str(other / "ws"), [root, other.resolve()]) == other.resolve() / "ws"


# --- ensure -------------------------------------------------------------------------------


def test_ensure_creates_parents_and_is_idempotent(root: Path) -> None:
    target = resolve_workspace(str(root / "a" / "b"), [root])
    ensure_workspace(target)
    assert target.is_dir()
    ensure_workspace(target)
    assert target.is_dir()


def test_ensure_over_a_file_fails(root: Path) -> None:
    file = root / "file"
    file.write_text("x")
    with pytest.raises(AguiError) as caught:
        ensure_workspace(file)
    assert caught.value.code == "INVALID_INPUT"
    assert caught.value.message == messages.CWD_CANNOT_CREATE


def test_ensure_under_a_file_fails(root: Path) -> None:
    (root / "file").write_text("x")
    with pytest.raises(AguiError) as caught:
        ensure_workspace(root / "file" / "ws")
    assert caught.value.message == messages.CWD_CANNOT_CREATE


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_ensure_without_permission_fails(root: Path) -> None:
    locked = root / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(AguiError) as caught:
            ensure_workspace(locked / "ws")
        assert caught.value.message == messages.CWD_CANNOT_CREATE
    finally:
        locked.chmod(0o700)


# --- Workspaces: the per-server check ------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_workspaces_see_a_root_created_later_within_the_refresh_time(tmp_path: Path) -> None:
    late = tmp_path / "late"
    clock = Clock()
    workspaces = Workspaces({"IAC_CODE_AGUI_ALLOWED_CWDS": str(late)}, refresh_seconds=1.0, clock=clock)
    with pytest.raises(AguiError) as caught:
        workspaces.resolve(str(late / "ws"))
    assert caught.value.message == messages.CWD_OUTSIDE_ROOTS
    late.mkdir()
    clock.now += 0.5  # the roots are still the ones resolved a moment ago
    with pytest.raises(AguiError):
        workspaces.resolve(str(late / "ws"))
    clock.now += 0.5
    assert workspaces.resolve(str(late / "ws")) == late.resolve() / "ws"


def test_workspaces_refuse_what_resolve_workspace_refuses(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    state = root / "state"
    state.mkdir(parents=True)
    (root / "file").write_text("x")
    (root / "loop").symlink_to(root / "loop")
    (root / "out").symlink_to(tmp_path, target_is_directory=True)
    workspaces = Workspaces({"IAC_CODE_AGUI_ALLOWED_CWDS": str(root)}, reserved=(state,))
    for raw in ("relative", str(state / "x"), str(root / "file" / "x"), str(root / "loop"), str(root / "out"), "/"):
        with pytest.raises(AguiError) as fast:
            workspaces.resolve(raw)
        with pytest.raises(AguiError) as slow:
            resolve_workspace(raw, [root], [state])
        assert (fast.value.message, fast.value.params) == (slow.value.message, slow.value.params), raw
    assert workspaces.resolve(str(root / "a" / ".." / "b")) == resolve_workspace(str(root / "b"), [root]) == root / "b"


def test_ensure_workspace_makes_deep_paths_without_recursing(tmp_path: Path) -> None:
    # deeper than the interpreter's recursion limit: Path.mkdir(parents=True) raised RecursionError
    deep = Path(str(tmp_path) + "/d" * 1100)
    try:
        ensure_workspace(deep)
        assert deep.is_dir()
        ensure_workspace(deep)  # already there
    finally:  # shutil.rmtree, which cleans tmp_path up, recurses too
        for path in (deep, *deep.parents):
            if path == tmp_path:
                break
            if path.is_dir():
                path.rmdir()


def test_ensure_workspace_refuses_whatever_fails(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file" / "sub", Path(str(tmp_path) + "/" + "n" * 300)):
        with pytest.raises(AguiError) as caught:
            ensure_workspace(path)
        assert caught.value.code == "INVALID_INPUT"
        assert caught.value.message == messages.CWD_CANNOT_CREATE


def test_paths_too_deep_or_too_long_are_refused_before_anything_is_made(root: Path) -> None:
    for suffix in ("/d" * 129, "/x" * 2100, "/" + "n" * 256, "/a/" + "é" * 128):
        refused(str(root) + suffix, [root], messages.CWD_INVALID)
    assert snapshot(root) == set()
    assert resolve_workspace(str(root) + "/d" * 100, [root]) == Path(str(root) + "/d" * 100)


def test_the_string_containment_check_agrees_with_pathlib() -> None:
    """``_within`` (strings, on the way to every RUN_STARTED) against ``PurePath.is_relative_to``."""
    from pathlib import PurePosixPath

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agui_adapter.state.workspace import _within

    names = st.sampled_from(["a", "b", "ab", "a.b", "b a", "é", "..a", "a-"])
    paths = st.lists(names, max_size=4).map(lambda parts: "/" + "/".join(parts))

    @settings(max_examples=400, deadline=None)
    @given(paths, paths)
    def agree(path: str, root: str) -> None:
        assert _within(path, root) == PurePosixPath(path).is_relative_to(PurePosixPath(root))

    agree()


def test_a_component_that_is_a_file_or_a_dangling_link_is_refused(root: Path) -> None:
    (root / "file").write_text("x")
    refused(str(root / "file" / "ws"), [root], messages.CWD_NOT_DIRECTORY)
    refused(str(root / "file"), [root], messages.CWD_NOT_DIRECTORY)
    (root / "loop").symlink_to(root / "loop")
    refused(str(root / "loop" / "ws"), [root], messages.CWD_INVALID)


def test_workspaces_resolve_a_path_once_per_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = (tmp_path / "root").resolve()
    (root / "ws").mkdir(parents=True)
    clock = Clock()
    workspaces = Workspaces({"IAC_CODE_AGUI_ALLOWED_CWDS": str(root)}, refresh_seconds=1.0, clock=clock)
    resolved: list[str] = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda path, **kw: resolved.append(str(path)) or real(path, **kw))
    raw = str(root / "a" / ".." / "ws")
    assert workspaces.resolve(raw) == root / "ws"
    assert workspaces.resolve(raw) == root / "ws"
    clock.now += 0.5
    assert workspaces.resolve(raw) == root / "ws"
    assert [path for path in resolved if path.endswith("ws")] == [str(root / "ws")]  # then the path kept
    clock.now += 0.5  # the roots are resolved again, and the path with them
    assert workspaces.resolve(raw) == root / "ws"
    assert [path for path in resolved if path.endswith("ws")] == [str(root / "ws")] * 2


def test_workspaces_check_a_kept_path_again_once_it_changed(tmp_path: Path) -> None:
    root = (tmp_path / "root").resolve()
    outside = (tmp_path / "outside").resolve()
    (root / "ws").mkdir(parents=True)
    outside.mkdir()
    clock = Clock()
    workspaces = Workspaces({"IAC_CODE_AGUI_ALLOWED_CWDS": str(root)}, refresh_seconds=1.0, clock=clock)
    raw = str(root / "ws")
    assert workspaces.resolve(raw) == root / "ws"
    (root / "ws").rmdir()  # gone: the full check again, which allows a workspace still to be made
    assert workspaces.resolve(raw) == root / "ws"
    (root / "ws").symlink_to(outside, target_is_directory=True)  # now a link out of the root
    with pytest.raises(AguiError) as caught:
        workspaces.resolve(raw)
    assert caught.value.message == messages.CWD_OUTSIDE_ROOTS
    (root / "ws").unlink()
    (root / "ws").write_text("a file")
    with pytest.raises(AguiError) as caught:
        workspaces.resolve(raw)
    assert caught.value.message == messages.CWD_NOT_DIRECTORY


def test_workspaces_forget_kept_paths_beyond_their_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = (tmp_path / "root").resolve()
    root.mkdir()
    workspaces = Workspaces({"IAC_CODE_AGUI_ALLOWED_CWDS": str(root)}, clock=Clock())
    monkeypatch.setattr(Workspaces, "SEEN_MAX", 3)
    for name in "abcdefg":
        assert workspaces.resolve(str(root / name)) == root / name
        assert len(workspaces._seen) <= 3
