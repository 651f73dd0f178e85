"""A thread's two OS locks, both kinds (``thread_locks``): who they exclude, how they go.

Every behaviour is checked for ``RangeLocks`` (bytes of one shared file) and ``FileLocks``
(a file per lock), with real locks: other threads, forked and killed processes. The races
with deletion that only files have are checked for ``FileLocks`` alone.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agui_adapter.state import thread_locks
from agui_adapter.state.store import StoreError, ThreadStore
from agui_adapter.state.thread_locks import RECORD, RUN, FileLocks, RangeLocks, ThreadLocks
from tests.support.flow import wait_for

KINDS = [RangeLocks, FileLocks]

needs_ranges = pytest.mark.skipif(not thread_locks.ranges_supported(), reason="no open-file-description locks here")


@pytest.fixture(params=KINDS, ids=lambda kind: kind.__name__)
def kind(request: pytest.FixtureRequest) -> Callable[[str], ThreadLocks]:
    if request.param is RangeLocks and not thread_locks.ranges_supported():
        pytest.skip("no open-file-description locks here")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def threads_dir(tmp_path: Path) -> str:
    path = tmp_path / "threads"
    path.mkdir()
    return str(path)


def test_a_lock_is_exclusive_and_released(kind: Callable[[str], ThreadLocks], threads_dir: str) -> None:
    locks, other = kind(threads_dir), kind(threads_dir)
    held = locks.acquire("t-1", RUN, blocking=False)
    assert held is not None
    assert other.acquire("t-1", RUN, blocking=False) is None  # the same lock, another open
    assert locks.acquire("t-1", RUN, blocking=False) is None  # even through the same object
    locks.release(held)
    again = other.acquire("t-1", RUN, blocking=False)
    assert again is not None
    other.release(again)


def test_locks_of_other_threads_and_the_other_lock_are_independent(
    kind: Callable[[str], ThreadLocks], threads_dir: str
) -> None:
    locks = kind(threads_dir)
    run = locks.acquire("t-1", RUN, blocking=False)
    held = [run]
    try:
        for key, which in (("t-1", RECORD), ("t-2", RUN), ("t-2", RECORD), ("t-10", RUN)):
            fd = locks.acquire(key, which, blocking=False)
            assert fd is not None, (key, which)
            held.append(fd)
    finally:
        for fd in held:
            if fd is not None:
                locks.release(fd)


def test_a_blocking_acquisition_waits_for_the_holder(kind: Callable[[str], ThreadLocks], threads_dir: str) -> None:
    locks = kind(threads_dir)
    held = locks.acquire("t-1", RECORD, blocking=True)
    assert held is not None
    got = threading.Event()

    def waiter() -> None:
        fd = locks.acquire("t-1", RECORD, blocking=True)
        got.set()
        assert fd is not None
        locks.release(fd)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert not got.wait(0.3)  # waits (a bounded look for a wrong early success, not a timing)
    locks.release(held)
    assert got.wait(10)
    thread.join(10)


def _hold(kind: Callable[[str], ThreadLocks], threads_dir: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    fd = kind(threads_dir).acquire("t-1", RUN, blocking=False)
    assert fd is not None
    ready.set()
    signal.pause()


def test_a_lock_holds_across_processes_and_dies_with_its_holder(
    kind: Callable[[str], ThreadLocks], threads_dir: str
) -> None:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_hold, args=(kind, threads_dir, ready))
    child.start()
    try:
        assert ready.wait(10)
        locks = kind(threads_dir)
        assert locks.acquire("t-1", RUN, blocking=False) is None
        free = locks.acquire("t-2", RUN, blocking=False)
        assert free is not None
        locks.release(free)
    finally:
        child.kill()  # SIGKILL: no clean-up runs in the holder
        child.join(10)
    fd = locks.acquire("t-1", RUN, blocking=False)
    assert fd is not None  # a dead process leaves nothing stuck
    locks.release(fd)


def test_release_lets_go_even_when_a_forked_child_shares_the_open_file(
    kind: Callable[[str], ThreadLocks], threads_dir: str
) -> None:
    """A child forked while a lock is held keeps the open file; closing ours alone would keep
    the lock held until the child exits."""
    locks = kind(threads_dir)
    fd = locks.acquire("t-1", RUN, blocking=False)
    assert fd is not None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: keeps every fd open until told to go
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        locks.release(fd)
        again = kind(threads_dir).acquire("t-1", RUN, blocking=False)
        assert again is not None
        locks.release(again)
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


def test_a_directory_that_is_gone_is_a_lock_error(kind: Callable[[str], ThreadLocks], tmp_path: Path) -> None:
    locks = kind(str(tmp_path / "missing"))
    with pytest.raises(thread_locks.LockError, match="No such file"):
        locks.acquire("t-1", RECORD, blocking=True)


# --- ranges -------------------------------------------------------------------------------------


@needs_ranges
def test_ranges_make_no_file_per_thread(threads_dir: str) -> None:
    locks = RangeLocks(threads_dir)
    held = [locks.acquire(f"t-{i}", which, blocking=False) for i in range(50) for which in (RECORD, RUN)]
    assert all(fd is not None for fd in held)
    for fd in held:
        locks.release(fd)  # type: ignore[arg-type]
    assert os.listdir(threads_dir) == [thread_locks.RANGES_FILE]
    assert os.stat(os.path.join(threads_dir, thread_locks.RANGES_FILE)).st_mode & 0o777 == 0o600


def test_offsets_are_a_thread_s_own_and_fit_in_an_off_t() -> None:
    keys = [f"thread-{i}" for i in range(20_000)] + ["", "x" * 300, "中文"]
    records = {RangeLocks.offset(key, RECORD) for key in keys}
    assert len(records) == len(keys)
    for key in keys:
        record = RangeLocks.offset(key, RECORD)
        assert record % 2 == 0 and RangeLocks.offset(key, RUN) == record + 1 < 2**63


@needs_ranges
def test_the_store_uses_ranges_here_and_leaves_no_lock_file(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "state")
    lock = store.try_lock_run("t-1")
    assert lock is not None
    with store.locked("t-1"):
        assert ThreadStore(tmp_path / "state").try_lock_run("t-1") is None  # another "process"
    lock.release()
    assert sorted(os.listdir(store.threads_dir)) == [thread_locks.RANGES_FILE]


def test_files_are_the_fallback(monkeypatch: pytest.MonkeyPatch, threads_dir: str) -> None:
    monkeypatch.setattr(thread_locks, "ranges_supported", lambda: False)
    assert isinstance(thread_locks.for_directory(threads_dir), FileLocks)


@needs_ranges
def test_files_are_the_fallback_where_the_file_system_refuses_ranges(
    monkeypatch: pytest.MonkeyPatch, threads_dir: str
) -> None:
    assert isinstance(thread_locks.for_directory(threads_dir), RangeLocks)
    real_fcntl = fcntl.fcntl

    def refusing(fd: int, cmd: int, arg: bytes | int = 0) -> bytes | int:
        if cmd == fcntl.F_OFD_GETLK:
            raise OSError(22, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    assert isinstance(thread_locks.for_directory(threads_dir), FileLocks)


def test_the_store_reports_a_lock_it_cannot_take(kind: Callable[[str], ThreadLocks], tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "state", locks=kind)
    lock = store.try_lock_run("t-1")
    assert lock is not None
    lock.release()
    for name in os.listdir(store.threads_dir):
        os.unlink(store.threads_dir / name)
    store.threads_dir.rmdir()
    with pytest.raises(StoreError, match="No such file"):
        store.try_lock_run("t-1")


# --- files: deletion races ----------------------------------------------------------------------


def _flock_waited_on(inode: int) -> bool:
    """Whether some process is blocked waiting for a flock on ``inode`` (Linux ``/proc/locks``;
    True where there is no way to look)."""
    locks = Path("/proc/locks")
    if not locks.exists():
        return True
    for line in locks.read_text().splitlines():
        fields = line.split()
        if "->" in fields and "FLOCK" in fields:
            device_inode = fields[fields.index("FLOCK") + 4]
            if int(device_inode.rsplit(":", 1)[1]) == inode:
                return True
    return False


def test_a_waiter_on_a_deleted_lock_file_locks_the_new_one(threads_dir: str) -> None:
    """The inode check: a waiter that opened the lock file before it was unlinked retries."""
    holder = FileLocks(threads_dir)
    held = holder.acquire("raced", RECORD, blocking=True)  # the pruner holds the record lock
    assert held is not None
    path = holder.path("raced", RECORD)

    waiter_locks = FileLocks(threads_dir)
    opened = threading.Event()
    real_open = waiter_locks._open
    opens: list[int] = []

    def spying_open(lock_path: str) -> int:
        fd = real_open(lock_path)
        opens.append(os.fstat(fd).st_ino)
        opened.set()
        return fd

    waiter_locks._open = spying_open  # type: ignore[method-assign]
    got: list[int | None] = []

    thread = threading.Thread(target=lambda: got.append(waiter_locks.acquire("raced", RECORD, blocking=True)))
    thread.start()
    assert opened.wait(10)  # it opened the old file ...
    old_inode = os.fstat(held).st_ino
    wait_for(lambda: _flock_waited_on(old_inode), 10)  # ... and now waits for the flock
    assert not got
    os.unlink(path)  # delete while holding, as remove_if does ...
    holder.release(held)  # ... then let go
    thread.join(10)
    assert got and got[0] is not None
    try:
        assert len(opens) == 2 and opens[0] == old_inode  # it retried on a fresh file
        # The lock it holds is the one the path names: a newcomer cannot get it.
        assert FileLocks(threads_dir).acquire("raced", RECORD, blocking=False) is None
    finally:
        waiter_locks.release(got[0])


def test_a_run_lock_try_on_a_deleted_file_retries_too(threads_dir: str) -> None:
    locks = FileLocks(threads_dir)
    path = locks.path("run-raced", RUN)
    real_open = locks._open
    calls: list[str] = []

    def deleting_open(lock_path: str) -> int:
        fd = real_open(lock_path)
        calls.append(lock_path)
        if len(calls) == 1:
            os.unlink(lock_path)  # deleted (by a pruner) between our open and our flock
        return fd

    locks._open = deleting_open  # type: ignore[method-assign]
    fd = locks.acquire("run-raced", RUN, blocking=False)
    assert fd is not None and calls == [path, path]
    try:
        assert FileLocks(threads_dir).acquire("run-raced", RUN, blocking=False) is None  # held on the file named
    finally:
        locks.release(fd)
