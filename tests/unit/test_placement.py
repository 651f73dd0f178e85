"""The state directory is marked the top of a hierarchy (``chattr +T``) before its
subdirectories are made, where the file system knows the mark; elsewhere nothing changes."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from agui_adapter.state import placement
from agui_adapter.state.store import ThreadStore


def _takes_the_mark(parent: Path) -> bool:
    """Whether this file system keeps a ``T`` mark, asked of e2fsprogs' ``chattr`` and ``lsattr``
    (not of the code under test): ext4 does; tmpfs has inode flags but not this one."""
    if shutil.which("chattr") is None or shutil.which("lsattr") is None:
        return False
    scratch = Path(tempfile.mkdtemp(dir=parent))
    try:
        if subprocess.run(["chattr", "+T", str(scratch)], capture_output=True).returncode != 0:
            return False
        shown = subprocess.run(["lsattr", "-d", str(scratch)], capture_output=True, text=True)
        return shown.returncode == 0 and "T" in shown.stdout.split()[0]
    finally:
        scratch.rmdir()


needs_the_mark = pytest.mark.skipif(
    not _takes_the_mark(Path(tempfile.gettempdir())), reason="no chattr, or no T mark on this file system"
)


@needs_the_mark
def test_a_new_state_directory_is_marked_before_its_subdirectories_are_made(tmp_path, monkeypatch):
    root = tmp_path / "state"
    marked_before: list[bool] = []
    spread = placement.spread

    def watching(directory: str) -> bool:
        marked_before.append(not any((root / name).exists() for name in ("threads", "record-log", "journal")))
        return spread(directory)

    monkeypatch.setattr(placement, "spread", watching)
    ThreadStore(root).use_log()
    assert marked_before == [True]
    assert placement.flags(str(root)) & placement.FS_TOPDIR_FL
    assert (root / "threads").is_dir()


@needs_the_mark
def test_lsattr_shows_the_mark(tmp_path):
    root = tmp_path / "state"
    ThreadStore(root).use_log()
    shown = subprocess.run(["lsattr", "-d", str(root)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "T" in shown.stdout.split()[0]


@needs_the_mark
def test_the_mark_keeps_the_other_flags_and_is_set_once(tmp_path, monkeypatch):
    root = tmp_path / "state"
    root.mkdir()
    assert placement.spread(str(root)) is True
    before = placement.flags(str(root))
    calls: list[int] = []
    ioctl = placement.fcntl.ioctl

    def counting(fd, request, arg):
        calls.append(request)
        return ioctl(fd, request, arg)

    monkeypatch.setattr(placement.fcntl, "ioctl", counting)
    assert placement.spread(str(root)) is True
    assert calls == [placement.FS_IOC_GETFLAGS]  # already marked: nothing written
    assert placement.flags(str(root)) == before


@pytest.mark.parametrize("code", [errno.ENOTTY, errno.EOPNOTSUPP, errno.EPERM])
def test_a_file_system_or_owner_that_refuses_the_mark_changes_nothing(tmp_path, monkeypatch, code):
    def refusing(fd, request, arg):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(placement.fcntl, "ioctl", refusing)
    assert placement.spread(str(tmp_path)) is False
    store = ThreadStore(tmp_path / "state")
    store.use_log()
    with store.locked("t1"):
        pass
    assert (tmp_path / "state" / "threads").is_dir()


def test_a_missing_directory_is_not_an_error(tmp_path):
    assert placement.spread(str(tmp_path / "absent")) is False


def test_the_ioctl_numbers_are_linux_fs_h():
    # _IOR('f', 1, long) and _IOW('f', 2, long) on this machine's word size
    if placement._LONG == 8:
        assert (placement.FS_IOC_GETFLAGS, placement.FS_IOC_SETFLAGS) == (0x80086601, 0x40086602)
    else:
        assert (placement.FS_IOC_GETFLAGS, placement.FS_IOC_SETFLAGS) == (0x80046601, 0x40046602)
