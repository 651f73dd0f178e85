"""The durable thread store: keys, atomic files, permissions, cross-process locks."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
from pathlib import Path

import pytest

from agui_adapter.state.record import PendingInterrupt
from agui_adapter.state.store import Execution, StoreError, ThreadRecord, ThreadStore, thread_key


def record(thread_id: str = "t-1") -> ThreadRecord:
    return ThreadRecord(
        thread_id=thread_id,
        context_id="agui-x",
        cwd="/w",
        user_id=None,
        execution=Execution(execution_id="e1", ros_invocation_id="r1"),
    )


@pytest.mark.parametrize(
    "thread_id",
    ["thread-1", "THREAD", "../../etc/passwd", "CON", "a/b", ".", "..", "x" * 500, "中文", "nul.txt", "a" * 101],
)
def test_keys_never_escape_the_directory(thread_id: str) -> None:
    key = thread_key(thread_id)
    assert "/" not in key and key not in (".", "..") and len(key) <= 210
    assert key == thread_key(thread_id)


def test_distinct_ids_get_distinct_keys() -> None:
    ids = ["Thread-1", "thread-1", "THREAD-1", "CON", "con"]
    assert len({thread_key(i) for i in ids}) == len(ids)


def test_round_trip_and_modes(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "state")
    rec = record()
    rec.remember_run("run-1", "d" * 64)
    rec.execution.pending["p1"] = PendingInterrupt({"inputId": "p1"}, {"id": "p1"})
    store.save(rec)
    loaded = store.load("t-1")
    assert loaded == rec
    path = store.path_for("t-1")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "state" / "threads").stat().st_mode & 0o777) == "0o700"
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


def _save_under_umask(root: str, mask: int, queue: multiprocessing.Queue) -> None:
    os.umask(mask)
    store = ThreadStore(Path(root))
    store.save(record())
    store.save(record())  # a replacement, too
    queue.put(oct(store.path_for("t-1").stat().st_mode & 0o777))


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o277, 0o477, 0o777])
def test_a_record_is_0600_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    """A umask that keeps the owner's bits needs no fchmod; one that takes them away gets
    one (in a child process: the umask is the whole process's)."""
    queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_save_under_umask, args=(str(tmp_path), mask, queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == "0o600"


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 200_000])
def test_a_record_is_read_whole_whatever_its_size(tmp_path: Path, size: int) -> None:
    from agui_adapter.state import store as store_module

    path = tmp_path / "f"
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert store_module._read_all(fd) == data
    finally:
        os.close(fd)


def test_a_record_that_grew_after_its_size_was_taken_is_read_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agui_adapter.state import store as store_module

    path = tmp_path / "f"
    data = b"y" * 300_000
    path.write_bytes(data)
    real_fstat = os.fstat

    class Smaller:
        def __init__(self, st: os.stat_result) -> None:
            self.st_size = st.st_size // 3

    monkeypatch.setattr(store_module.os, "fstat", lambda fd: Smaller(real_fstat(fd)))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert store_module._read_all(fd) == data
    finally:
        os.close(fd)


def test_corrupt_or_foreign_files_are_errors(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    store.save(record())
    path = store.path_for("t-1")
    path.write_text("{not json")
    with pytest.raises(StoreError):
        store.load("t-1")
    data = record("other").to_json()
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError):
        store.load("t-1")


def test_symlinked_state_file_is_refused(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    store.save(record())
    target = tmp_path / "elsewhere.json"
    os.replace(store.path_for("t-1"), target)
    os.symlink(target, store.path_for("t-1"))
    with pytest.raises(StoreError):
        store.load("t-1")


def test_histories_are_bounded(tmp_path: Path) -> None:
    rec = record()
    for i in range(1500):
        rec.remember_run(f"r{i}", "d")
        rec.remember_answer("e", f"i{i}", "d")
        rec.execution.execution_id = f"e{i}"
        rec.retire_execution()
    assert len(rec.run_digests) == 1000 and "r1499" in rec.run_digests and "r0" not in rec.run_digests
    assert len(rec.applied_answers) == 500 and len(rec.terminal_executions) == 200


def _hold_lock(
    root: str, thread_id: str, ready: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event
) -> None:  # type: ignore[name-defined]
    lock = ThreadStore(Path(root)).try_lock_run(thread_id)
    assert lock is not None
    ready.set()
    done.wait(10)


def test_run_lock_holds_across_processes_and_dies_with_them(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_lock, args=(str(tmp_path), "t-1", ready, done))
    child.start()
    assert ready.wait(10)
    assert store.try_lock_run("t-1") is None
    assert store.try_lock_run("t-2") is not None
    child.kill()
    child.join(10)
    lock = store.try_lock_run("t-1")  # a dead process leaves nothing stuck
    assert lock is not None
    assert store.try_lock_run("t-1") is None  # and in one process too
    lock.release()
    assert store.try_lock_run("t-1") is not None


def test_a_save_draws_nothing_from_the_process_random(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    for i in range(5):
        store.save(record(f"t{i}"), durable=False)
    assert [random.random() for _ in range(3)] == expected


def test_forked_workers_pick_other_temporary_names() -> None:
    from agui_adapter.state import store as store_module

    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first name, to the parent
        os.close(reader)
        os.write(writer, b"%016x" % store_module._TEMP_NAMES.getrandbits(64))
        os._exit(0)
    os.close(writer)
    child = os.read(reader, 16)
    os.close(reader)
    os.waitpid(pid, 0)
    assert child != b"%016x" % store_module._TEMP_NAMES.getrandbits(64)
