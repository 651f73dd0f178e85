"""Retention of thread records (issue 9, case 6) and lock files that survive deletion.

Real files in a temp state dir, ages set with ``os.utime``, run locks held by another
process with a real ``flock``, and a lock waiter racing a deletion.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.config import ConfigError, load_settings
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.state.record import PendingInterrupt
from agui_adapter.state.retention import DAY_SECONDS, RetentionJob, prune, start_retention
from agui_adapter.state.store import Execution, ThreadRecord, ThreadStore, thread_key
from tests.support.flow import wait_for

NOW = 1_800_000_000.0  # a fixed "now" (2027-01-15)
RETAIN = 30 * DAY_SECONDS


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    return ThreadStore(tmp_path / "state")


def make_thread(
    store: ThreadStore, thread_id: str, *, age_days: float, pending: dict[str, PendingInterrupt] | None = None
) -> None:
    """A saved record with its two lock files, all last changed ``age_days`` before NOW."""
    record = ThreadRecord(
        thread_id=thread_id,
        context_id=f"ctx-{thread_id}",
        cwd="/tmp/ws",
        user_id=None,
        execution=Execution(execution_id=f"ex-{thread_id}", ros_invocation_id="inv-1", pending=pending or {}),
    )
    with store.locked(thread_id):
        store.save(record)
    lock = store.try_lock_run(thread_id)
    assert lock is not None
    lock.release()
    set_age(store, thread_key(thread_id), age_days)


def set_age(store: ThreadStore, key: str, age_days: float) -> None:
    stamp = NOW - age_days * DAY_SECONDS
    for suffix in (".json", ".lock", ".run"):
        path = store.threads_dir / f"{key}{suffix}"
        if path.exists():
            os.utime(path, (stamp, stamp))


def files_of(store: ThreadStore, thread_id: str) -> set[str]:
    key = thread_key(thread_id)
    return {p.name for p in store.threads_dir.glob(f"{key}.*")}


def pending_interrupt(expires_at: Any) -> dict[str, PendingInterrupt]:
    return {"input-1": PendingInterrupt({}, {"id": "input-1", "expiresAt": expires_at})}


# --- what is pruned and what is kept -----------------------------------------------------------


def test_old_threads_are_deleted_and_recent_ones_kept(store: ThreadStore) -> None:
    make_thread(store, "old", age_days=40)
    make_thread(store, "just-over", age_days=30.01)
    make_thread(store, "recent", age_days=1)
    make_thread(store, "just-under", age_days=29.99)
    make_thread(store, "weird thread/id", age_days=45)  # a key that is not the id itself
    report = prune(store, RETAIN, now=NOW)
    assert report.removed == 3
    for gone in ("old", "just-over", "weird thread/id"):
        assert files_of(store, gone) == set()
    assert files_of(store, "recent") == {"recent.json", "recent.lock", "recent.run"}
    assert files_of(store, "just-under") == {"just-under.json", "just-under.lock", "just-under.run"}
    assert store.thread_keys() == ["just-under", "recent"]


def test_a_thread_with_a_live_run_is_never_deleted(store: ThreadStore, tmp_path: Path) -> None:
    make_thread(store, "busy", age_days=90)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
            str(store.threads_dir / "busy.run"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        report = prune(store, RETAIN, now=NOW)
        assert report.removed == 0 and report.kept_busy_or_recent == 1
        assert files_of(store, "busy") == {"busy.json", "busy.lock", "busy.run"}
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    assert prune(store, RETAIN, now=NOW).removed == 1  # the run ended: now it goes
    assert files_of(store, "busy") == set()


def test_a_run_lock_held_in_this_process_protects_too(store: ThreadStore) -> None:
    make_thread(store, "mine", age_days=90)
    lock = store.try_lock_run("mine")
    assert lock is not None
    try:
        assert prune(store, RETAIN, now=NOW).removed == 0
    finally:
        lock.release()


def test_an_unexpired_pending_interrupt_protects_the_thread(store: ThreadStore) -> None:
    make_thread(store, "waiting", age_days=60, pending=pending_interrupt(rfc3339(NOW + 3600)))
    make_thread(store, "expired", age_days=60, pending=pending_interrupt(rfc3339(NOW - 3600)))
    make_thread(store, "unreadable-expiry", age_days=60, pending=pending_interrupt("tomorrow-ish"))
    make_thread(store, "no-expiry", age_days=60, pending={"i": PendingInterrupt({}, {})})
    report = prune(store, RETAIN, now=NOW)
    assert report.removed == 1 and report.kept_pending == 3
    assert files_of(store, "expired") == set()
    for kept in ("waiting", "unreadable-expiry", "no-expiry"):
        assert f"{kept}.json" in files_of(store, kept)
    # once it has expired, the waiting thread goes as well
    assert prune(store, RETAIN, now=NOW + 7200).removed == 1
    assert files_of(store, "waiting") == set()


def test_lock_files_left_without_a_record_are_pruned_by_age(store: ThreadStore) -> None:
    for thread_id, age in (("refused-long-ago", 50), ("refused-today", 0)):
        with store.locked(thread_id):
            pass
        lock = store.try_lock_run(thread_id)
        assert lock is not None
        lock.release()
        set_age(store, thread_id, age)
    assert prune(store, RETAIN, now=NOW).removed == 1
    assert files_of(store, "refused-long-ago") == set()
    assert files_of(store, "refused-today") == {"refused-today.lock", "refused-today.run"}


def test_an_unreadable_record_is_kept_and_reported(store: ThreadStore) -> None:
    make_thread(store, "broken", age_days=90)
    (store.threads_dir / "broken.json").write_text("{not json")
    set_age(store, "broken", 90)
    make_thread(store, "impostor", age_days=90)
    (store.threads_dir / "impostor.json").write_text('{"schemaVersion": 1, "threadId": "someone-else"}')
    set_age(store, "impostor", 90)
    report = prune(store, RETAIN, now=NOW)
    assert report.removed == 0 and report.failed == 2
    assert "broken.json" in files_of(store, "broken") and "impostor.json" in files_of(store, "impostor")


def test_temporary_files_and_strangers_are_not_threads(store: ThreadStore) -> None:
    make_thread(store, "t", age_days=90)
    (store.threads_dir / ".t.json.abc.tmp").write_text("x")
    (store.threads_dir / "README").write_text("x")
    assert store.thread_keys() == ["t"]
    assert prune(store, RETAIN, now=NOW).removed == 1
    assert sorted(p.name for p in store.threads_dir.iterdir()) == [".t.json.abc.tmp", "README"]


def test_a_pruned_thread_starts_afresh(store: ThreadStore) -> None:
    make_thread(store, "again", age_days=90)
    assert prune(store, RETAIN, now=NOW).removed == 1
    with store.locked("again"):
        assert store.load("again") is None
    lock = store.try_lock_run("again")
    assert lock is not None
    lock.release()
    assert prune(store, RETAIN).removed == 0  # with the real clock, just touched


def test_an_empty_or_missing_directory_is_fine(tmp_path: Path) -> None:
    assert prune(ThreadStore(tmp_path / "nothing-here"), RETAIN).removed == 0
    assert not (tmp_path / "nothing-here").exists()


# --- locks and deletion -------------------------------------------------------------------------


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


def test_a_waiter_on_a_deleted_lock_file_locks_the_new_one(store: ThreadStore) -> None:
    """The inode check: a waiter that opened the lock file before it was unlinked retries."""
    make_thread(store, "raced", age_days=0)
    path = store.threads_dir / "raced.lock"
    pruner_fd = os.open(path, os.O_RDWR)
    fcntl.flock(pruner_fd, fcntl.LOCK_EX)  # the pruner holds the record lock

    waiter_store = ThreadStore(store.root)  # another "process": no shared in-process stripes
    opened = threading.Event()
    real_open = waiter_store._open_lock_file
    opens: list[int] = []

    def spying_open(lock_path: str) -> int:
        fd = real_open(lock_path)
        opens.append(os.fstat(fd).st_ino)
        opened.set()
        return fd

    waiter_store._open_lock_file = spying_open  # type: ignore[method-assign]
    inside = threading.Event()
    leave = threading.Event()

    def waiter() -> None:
        with waiter_store.locked("raced"):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert opened.wait(10)  # it opened the old file ...
    old_inode = os.fstat(pruner_fd).st_ino
    wait_for(lambda: _flock_waited_on(old_inode), 10)  # ... and now waits for the flock
    assert not inside.is_set()
    os.unlink(path)  # delete while holding, as remove_if does ...
    os.close(pruner_fd)  # ... then let go
    assert inside.wait(10)
    try:
        assert len(opens) == 2 and opens[0] == old_inode  # it retried on a fresh file
        # The lock it holds is the one the path names: a newcomer cannot get it.
        newcomer = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(newcomer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(newcomer)
    finally:
        leave.set()
        thread.join(10)


def test_a_run_lock_try_on_a_deleted_file_retries_too(store: ThreadStore) -> None:
    make_thread(store, "run-raced", age_days=0)
    path = str(store.threads_dir / "run-raced.run")
    real_open = store._open_lock_file
    calls: list[str] = []

    def deleting_open(lock_path: str) -> int:
        fd = real_open(lock_path)
        calls.append(lock_path)
        if len(calls) == 1:
            os.unlink(lock_path)  # deleted (by a pruner) between our open and our flock
        return fd

    store._open_lock_file = deleting_open  # type: ignore[method-assign]
    lock = store.try_lock_run("run-raced")
    assert lock is not None and calls == [path, path]
    try:
        other = ThreadStore(store.root)
        assert other.try_lock_run("run-raced") is None  # held on the file the path names
    finally:
        lock.release()


def test_mutual_exclusion_holds_while_threads_are_pruned(tmp_path: Path) -> None:
    """Two stores (as two processes would) update one thread while it is pruned over and over."""
    root = tmp_path / "state"
    stores = [ThreadStore(root) for _ in range(2)]
    make_thread(stores[0], "hot", age_days=0)
    for path in stores[0].threads_dir.glob("hot.*"):
        os.utime(path, (time.time() - 60, time.time() - 60))
    inside = [0]
    overlaps = [0]
    rounds = [0]
    stop = threading.Event()

    def worker(store: ThreadStore) -> None:
        while not stop.is_set():
            with store.locked("hot"):
                inside[0] += 1
                if inside[0] > 1:
                    overlaps[0] += 1
                time.sleep(0.0005)
                inside[0] -= 1

    def pruner() -> None:
        pruning = ThreadStore(root)
        while not stop.is_set():
            rounds[0] += prune(pruning, 0, now=time.time() + 10).removed
            with pruning.locked("hot"):  # recreate the lock files for the next round
                pass

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores] + [threading.Thread(target=pruner)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: rounds[0] > 10, 60)  # the thread really was deleted again and again meanwhile
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert overlaps[0] == 0


# --- settings and the job -----------------------------------------------------------------------


def test_setting_from_flag_env_and_file(tmp_path: Path) -> None:
    assert load_settings({}, env={}).thread_retention_days == 0
    assert load_settings({"thread_retention_days": "7"}, env={}).thread_retention_days == 7
    env = {"IAC_CODE_AGUI_THREAD_RETENTION_DAYS": "0.5"}
    assert load_settings({}, env=env).thread_retention_days == 0.5
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nthread_retention_days = 90\n")
    assert load_settings({}, env={}, config_path=str(conf)).thread_retention_days == 90
    assert load_settings({"thread_retention_days": "off"}, env=env, config_path=str(conf)).thread_retention_days == 0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match="thread_retention_days"):
            load_settings({"thread_retention_days": bad}, env={})


def test_retention_is_off_by_default(tmp_path: Path) -> None:
    settings = load_settings({"state_dir": str(tmp_path / "state")}, env={})
    assert start_retention(settings) is None


def test_the_job_prunes_at_start_and_then_periodically(store: ThreadStore) -> None:
    make_thread(store, "first", age_days=40)
    clock = [NOW]
    job = RetentionJob(store, RETAIN, interval=0.05, clock=lambda: clock[0]).start()
    try:
        deadline = time.monotonic() + 10
        while files_of(store, "first") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert files_of(store, "first") == set()
        make_thread(store, "second", age_days=10)
        clock[0] = NOW + 25 * DAY_SECONDS  # 35 days old now
        while files_of(store, "second") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert files_of(store, "second") == set()
    finally:
        job.stop()
    assert job.passes >= 2


def test_the_adapter_prunes_at_start_up(adapter_process: Any, tmp_path: Path) -> None:
    """``python run.py --thread-retention-days`` prunes the state dir it is given, at once."""
    state = ThreadStore(tmp_path / "state")
    stamp_now = time.time()
    for thread_id, age in (("ancient", 400), ("fresh", 0)):
        make_thread(state, thread_id, age_days=0)
        for path in state.threads_dir.glob(f"{thread_id}.*"):
            os.utime(path, (stamp_now - age * DAY_SECONDS, stamp_now - age * DAY_SECONDS))
    adapter = adapter_process("--thread-retention-days", "30")
    deadline = time.monotonic() + 15
    while files_of(state, "ancient") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert files_of(state, "ancient") == set()
    assert files_of(state, "fresh") == {"fresh.json", "fresh.lock", "fresh.run"}
    while b"deleted 1 idle thread record" not in adapter.log and time.monotonic() < deadline:
        time.sleep(0.1)
    assert b"deleted 1 idle thread record" in adapter.log
