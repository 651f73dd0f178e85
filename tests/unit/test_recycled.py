"""Recycled record files: saves under the record's lock write into the file an earlier save
replaced (no inode made or freed), readers that catch a recycled file read again, and a dead
process's spares go with its record log (a real process, SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from agui_adapter.state import record_log, recycled
from agui_adapter.state.record import RecordIds
from agui_adapter.state.recycled import SUFFIX, Spares, remove_spares
from agui_adapter.state.store import StoreError, ThreadStore
from tests.support.flow import wait_for
from tests.unit.test_store import record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> ThreadStore:
    store = ThreadStore(tmp_path)
    store.use_log()
    wait_for(lambda: store.log is not None and store.log.ready)
    return store


def spares_in(store: ThreadStore) -> list[str]:
    return sorted(name for name in os.listdir(store.threads_dir) if name.endswith(SUFFIX))


def test_saves_under_the_lock_write_into_the_records_they_replaced(store: ThreadStore) -> None:
    store.save(record())
    inodes = []
    for n in range(4):
        store.update("t-1", RecordIds("e1", session_id=None if n else "s-1"))
        inodes.append(os.stat(store.path_for("t-1")).st_ino)
    # the first update makes a file and keeps the first record as a spare; from then on the
    # two files take turns, and no save makes a new one
    assert inodes[2] == inodes[0] and inodes[3] == inodes[1] and inodes[0] != inodes[1]
    assert len(spares_in(store)) == 1
    loaded = store.load("t-1")
    assert loaded is not None and loaded.session_id == "s-1" and loaded.revision == 5
    spare = store.threads_dir / spares_in(store)[0]
    assert spare.stat().st_mode & 0o777 == 0o600
    assert json.loads(spare.read_bytes())["revision"] == 4  # the record it was, until it is written again


def test_a_spare_serves_any_thread_and_new_records_take_one(store: ThreadStore) -> None:
    store.save(record("a"))
    store.update("a", RecordIds("e1", session_id="s-a"))  # a spare: the first "a"
    spare_inode = os.stat(store.threads_dir / spares_in(store)[0]).st_ino
    with store.locked("b"):
        store.save(record("b"))  # a new record, written into the spare
    assert os.stat(store.path_for("b")).st_ino == spare_inode
    assert spares_in(store) == []
    assert store.load("a").session_id == "s-a" and store.load("b").thread_id == "b"  # type: ignore[union-attr]


def test_a_save_outside_the_record_lock_is_classic(store: ThreadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    linked: list[str] = []
    link = os.link
    monkeypatch.setattr(os, "link", lambda src, dst, **kw: (linked.append(dst), link(src, dst, **kw)))
    thread = record()
    store.save(thread)
    store.save(thread)
    store.save(thread)
    assert linked == [] and spares_in(store) == []  # nothing kept without the lock that keeps saves apart
    store.update("t-1", RecordIds("e1", session_id="s-1"))
    assert len(linked) == 1 and spares_in(store) == [os.path.basename(linked[0])]


def test_a_failed_replace_leaves_the_record_and_no_second_name(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(record())
    before = store.path_for("t-1").read_bytes()

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(StoreError):
        store.update("t-1", RecordIds("e1", session_id="s-1"))
    monkeypatch.undo()
    assert store.path_for("t-1").read_bytes() == before
    assert spares_in(store) == [] and not [n for n in os.listdir(store.threads_dir) if n.endswith(".tmp")]
    store.update("t-1", RecordIds("e1", session_id="s-1"))
    assert store.load("t-1").session_id == "s-1"  # type: ignore[union-attr]


def test_a_reader_that_catches_a_recycled_file_reads_again(store: ThreadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.save(record())
    real = ThreadStore._read
    caught = iter([b"", json.dumps({**json.loads(store.path_for("t-1").read_bytes()), "threadId": "other"})])

    def racing(path: str) -> object:
        found = next(caught, None)  # a truncated file, then another thread's record
        if found is None:
            return real(path)
        if not found:
            raise StoreError("the thread state is not valid JSON")
        return json.loads(found)

    monkeypatch.setattr(ThreadStore, "_read", staticmethod(racing))
    loaded = store.load("t-1")
    assert loaded is not None and loaded.thread_id == "t-1"


def test_a_record_that_stays_unreadable_is_still_refused(store: ThreadStore) -> None:
    store.save(record())
    store.path_for("t-1").write_bytes(b"{not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        store.load("t-1")


def test_readers_never_fail_while_saves_recycle(store: ThreadStore) -> None:
    store.save(record())
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                assert store.load("t-1") is not None
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    try:
        for n in range(300):
            store.update("t-1", RecordIds("e1", session_id=f"s-{n}" if n == 0 else None))
    finally:
        done.set()
        for reader in readers:
            reader.join()
    assert failures == []


def test_a_process_keeps_at_most_most_spares(store: ThreadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recycled, "MOST", 2)
    for name in ("a", "b", "c", "d"):
        store.save(record(name))
    barrier = threading.Barrier(4)
    real_link = os.link

    def link_together(src: str, dst: str, **kw: bool) -> None:
        barrier.wait(timeout=30)  # four saves find no spare at once, then each keeps one
        real_link(src, dst, **kw)

    monkeypatch.setattr(os, "link", link_together)
    savers = [threading.Thread(target=store.update, args=(n, RecordIds("e1", session_id="s"))) for n in "abcd"]
    spares = store._current_spares()
    assert spares is not None
    for saver in savers:
        saver.start()
    for saver in savers:
        saver.join()
    assert len(spares_in(store)) == 2 == len(spares)  # the other two records were deleted
    assert all(store.load(n).session_id == "s" for n in "abcd")  # type: ignore[union-attr]


def test_spares_are_named_after_the_process_log() -> None:
    spares = Spares("/d/", "123-abc")
    first, second = spares.name(), spares.name()
    assert first.startswith("/d/.123-abc.") and first.endswith(SUFFIX) and first != second
    assert spares.take() is None
    spares.give(first)
    assert len(spares) == 1 and spares.take() == first and spares.take() is None


SAVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from agui_adapter.state.record import RecordIds
    from agui_adapter.state.store import Execution, ThreadRecord, ThreadStore
    store = ThreadStore(Path(sys.argv[1]))
    store.use_log()
    while not store.log.ready:
        time.sleep(0.01)
    for name in ("a", "b"):
        with store.locked(name):
            store.save(ThreadRecord(name, "agui-x", "/w", None, Execution("e1", "r1")))
        store.update(name, RecordIds("e1", session_id="s-" + name))
    print(store.log.stem, flush=True)
    time.sleep(60)
    """
)


def test_a_dead_process_spares_go_with_its_log(tmp_path: Path) -> None:
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert saver.stdout is not None
    stem = saver.stdout.readline().strip()
    store = ThreadStore(tmp_path)
    try:
        # "a" replaced once kept a spare, which "b" was written into; "b" replaced once kept one
        assert len(spares_in(store)) == 1 and f".{stem}." in spares_in(store)[0]
        store.recover()
        assert len(spares_in(store)) == 1  # a live process's are left alone
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait()
    mine = ThreadStore(tmp_path)
    mine.use_log()
    wait_for(lambda: mine.log is not None and mine.log.ready)
    mine.update("a", RecordIds("e1", task_id=None, session_id=None))  # a spare of this process
    assert store.recover() == 0
    left = spares_in(store)
    assert len(left) == 1 and f".{stem}." not in left[0]  # the dead one's gone, the live one's kept
    assert list((tmp_path / record_log.DIRECTORY).iterdir()) and store.load("a").session_id == "s-a"  # type: ignore[union-attr]
    assert store.load("b").session_id == "s-b"  # type: ignore[union-attr]


def test_remove_spares_deletes_only_that_stem(tmp_path: Path) -> None:
    for name in (".1-aa.0.spare", ".1-aa.1.spare", ".2-bb.0.spare", ".1-aa.0.tmp", "t.json"):
        (tmp_path / name).write_bytes(b"x")
    assert remove_spares(str(tmp_path), "1-aa") == 2
    assert sorted(os.listdir(tmp_path)) == [".1-aa.0.tmp", ".2-bb.0.spare", "t.json"]
    assert remove_spares(str(tmp_path / "missing"), "1-aa") == 0


def test_a_durable_save_writes_over_a_spare_and_cuts_what_is_left(
    store: ThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = record("long")
    long.cwd = "/w/" + "x" * 5000  # a record longer than the next one written into its file
    with store.locked("long"):
        store.save(long)
    store.update("long", RecordIds("e1", session_id="s-long"))  # the long record: a spare
    opened: list[int] = []
    real_open = os.open

    def watch(path: str, flags: int, *args: int) -> int:
        if str(path).endswith(SUFFIX):
            opened.append(flags)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", watch)
    with store.locked("short"):
        store.save(record("short"))  # durable: over the old bytes, its blocks kept
    assert len(opened) == 1 and not opened[0] & os.O_TRUNC
    assert store.path_for("short").stat().st_size < 1000
    assert store.load("short").cwd == "/w"  # type: ignore[union-attr]
    store.update("long", RecordIds("e1", task_id="t-9"))  # a spare again: the "long" before
    opened.clear()
    store.update("short", RecordIds("e1", session_id="s-short"))  # not durable: emptied first
    assert len(opened) == 1 and opened[0] & os.O_TRUNC
    assert store.load("short").session_id == "s-short"  # type: ignore[union-attr]
    assert store.load("long").execution.task_id == "t-9"  # type: ignore[union-attr]
