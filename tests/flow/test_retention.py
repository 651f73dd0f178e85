"""Retention of thread records (issue 9, case 6), with either kind of thread lock.

Real files in a temp state dir, ages set with ``os.utime``, run locks held by another
process, and updates racing deletions. Each test that touches locks runs with both kinds
(``thread_locks``): a byte of one shared file, and a file per lock that retention deletes
(the races of such a file's deletion are in ``tests/unit/test_thread_locks.py``).
"""

from __future__ import annotations

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
from agui_adapter.state import thread_locks
from agui_adapter.state.record import PendingInterrupt
from agui_adapter.state.retention import DAY_SECONDS, RetentionJob, prune, start_retention
from agui_adapter.state.store import Execution, ThreadRecord, ThreadStore, thread_key
from agui_adapter.state.thread_locks import FileLocks, RangeLocks
from tests.support.flow import wait_for

NOW = 1_800_000_000.0  # a fixed "now" (2027-01-15)
RETAIN = 30 * DAY_SECONDS


LOCKS = {"ranges": RangeLocks, "files": FileLocks}


@pytest.fixture(params=sorted(LOCKS))
def locks(request: pytest.FixtureRequest) -> str:
    if request.param == "ranges" and not thread_locks.ranges_supported():
        pytest.skip("no open-file-description locks here")
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def store(tmp_path: Path, locks: str) -> ThreadStore:
    return ThreadStore(tmp_path / "state", locks=LOCKS[locks])


def uses_files(store: ThreadStore) -> bool:
    store._ensure_dirs()
    return isinstance(store._locks, FileLocks)


def thread_files(store: ThreadStore, key: str) -> set[str]:
    """The files a thread with a record has: its record, and its lock files with ``FileLocks``."""
    return {f"{key}{suffix}" for suffix in (".json", *(FileLocks.SUFFIXES if uses_files(store) else ()))}


def make_thread(
    store: ThreadStore,
    thread_id: str,
    *,
    age_days: float | None,
    pending: dict[str, PendingInterrupt] | None = None,
) -> None:
    """A saved record (and, with ``FileLocks``, its two lock files), all last changed ``age_days``
    before NOW (None: just now)."""
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
    if age_days is not None:
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
    assert files_of(store, "recent") == thread_files(store, "recent")
    assert files_of(store, "just-under") == thread_files(store, "just-under")
    assert store.thread_keys() == ["just-under", "recent"]


def test_a_thread_with_a_live_run_is_never_deleted(store: ThreadStore, locks: str) -> None:
    make_thread(store, "busy", age_days=90)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from agui_adapter.state import thread_locks\n"
            "from agui_adapter.state.store import ThreadStore\n"
            "kind = {'ranges': thread_locks.RangeLocks, 'files': thread_locks.FileLocks}[sys.argv[2]]\n"
            "lock = ThreadStore(sys.argv[1], locks=kind).try_lock_run('busy')\n"
            "print('locked' if lock else 'busy', flush=True)\n"
            "sys.stdin.read()\n",
            str(store.root),
            locks,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        report = prune(store, RETAIN, now=NOW)
        assert report.removed == 0 and report.kept_busy_or_recent == 1
        assert files_of(store, "busy") == thread_files(store, "busy")
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


def test_lock_files_left_without_a_record_are_pruned_by_age(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path / "state", locks=FileLocks)
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


def test_with_ranges_a_refused_request_leaves_no_file_and_old_lock_files_go(tmp_path: Path) -> None:
    """An adapter with ``RangeLocks`` leaves nothing for a thread that never had a record,
    and prunes the lock files an older adapter (a file per lock) left, by their age."""
    if not thread_locks.ranges_supported():
        pytest.skip("no open-file-description locks here")
    store = ThreadStore(tmp_path / "state", locks=RangeLocks)
    with store.locked("refused"):
        pass
    lock = store.try_lock_run("refused")
    assert lock is not None
    lock.release()
    assert files_of(store, "refused") == set() and store.thread_keys() == []
    for thread_id, age in (("legacy-long-ago", 50), ("legacy-today", 0)):
        for suffix in FileLocks.SUFFIXES:
            (store.threads_dir / f"{thread_id}{suffix}").touch()
        set_age(store, thread_id, age)
    assert prune(store, RETAIN, now=NOW).removed == 1
    assert files_of(store, "legacy-long-ago") == set()
    assert files_of(store, "legacy-today") == {"legacy-today.lock", "legacy-today.run"}


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
    left = [".t.json.abc.tmp", "README"] + ([] if uses_files(store) else [thread_locks.RANGES_FILE])
    assert sorted(p.name for p in store.threads_dir.iterdir()) == sorted(left)


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


def test_mutual_exclusion_holds_while_threads_are_pruned(tmp_path: Path, locks: str) -> None:
    """Two stores (as two processes would) update one thread while it is pruned over and over."""
    root = tmp_path / "state"
    stores = [ThreadStore(root, locks=LOCKS[locks]) for _ in range(2)]
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
        pruning = ThreadStore(root, locks=LOCKS[locks])
        while not stop.is_set():
            rounds[0] += prune(pruning, 0, now=time.time() + 10).removed
            make_thread(pruning, "hot", age_days=None)  # the record (and any lock files) again, for the next round

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
    assert files_of(state, "fresh") == thread_files(state, "fresh")
    while b"deleted 1 idle thread record" not in adapter.log and time.monotonic() < deadline:
        time.sleep(0.1)
    assert b"deleted 1 idle thread record" in adapter.log
