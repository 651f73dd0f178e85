"""The record log: entries framed and scanned, rotation gated by the records being written,
durable saves through it, and recovery from the logs of dead processes (real processes,
SIGKILL)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_adapter.ops.start_gate import StartGate
from agui_adapter.state import record_log
from agui_adapter.state.record_log import ENTRY, FILE_BYTES, HEADER, MAGIC, RecordLog, frame, scan
from agui_adapter.state.retention import prune
from agui_adapter.state.store import ThreadStore
from tests.support.flow import wait_for
from tests.unit.test_store import record

ROOT = Path(__file__).resolve().parents[2]


def log_file(payloads: list[bytes], epoch: bytes = b"E" * 8, size: int = 4096) -> bytes:
    data = HEADER.pack(MAGIC, epoch) + b"".join(frame(epoch, p) for p in payloads)
    return data + bytes(max(0, size - len(data)))


# ====================================================================== the format (sans-I/O)
def test_a_file_gives_back_its_entries_in_order() -> None:
    payloads = [b'{"a":1}', b"x" * 300, b"\n"]
    assert list(scan(log_file(payloads))) == payloads


@given(st.lists(st.binary(min_size=1, max_size=60), max_size=6), st.data())
@settings(max_examples=200, deadline=None)
def test_a_torn_file_gives_a_prefix_of_its_entries(payloads: list[bytes], data: st.DataObject) -> None:
    whole = log_file(payloads, size=0)
    cut = data.draw(st.integers(min_value=0, max_value=len(whole)))
    torn = whole[:cut] + bytes(64)  # the zeros past a torn append
    got = list(scan(torn))
    assert got == payloads[: len(got)]
    whole_entries = sum(
        1 for i in range(len(payloads)) if HEADER.size + sum(ENTRY.size + len(p) for p in payloads[: i + 1]) <= cut
    )
    # every entry written whole is found; a torn one only when the zeros past it complete it
    # byte for byte (its payload ended in zeros), so that it is the entry that was written
    assert len(got) >= whole_entries


def test_a_scan_stops_at_another_epoch_or_a_bad_checksum() -> None:
    old = frame(b"O" * 8, b"old entry")
    data = HEADER.pack(MAGIC, b"N" * 8) + frame(b"N" * 8, b"new") + old
    assert list(scan(data)) == [b"new"]  # a reset file's leftovers do not count
    good = log_file([b"first", b"second"], size=0)
    flipped = bytearray(good)
    flipped[-1] ^= 1
    assert list(scan(bytes(flipped))) == [b"first"]
    assert list(scan(b"NOTALOG!" + bytes(100))) == []
    assert list(scan(b"")) == []


# ====================================================================== the log
@pytest.fixture
def made(tmp_path: Path) -> RecordLog:
    threads = tmp_path / "threads"
    threads.mkdir()
    the_log = RecordLog(tmp_path / record_log.DIRECTORY, threads)
    assert the_log.append(b"early", threads / "x.json") is None  # the files are being made
    wait_for(lambda: the_log.ready)
    return the_log


def entries_of(path: Path) -> list[bytes]:
    return list(scan(path.read_bytes()))


def test_the_files_are_private_preallocated_and_locked(made: RecordLog) -> None:
    files = sorted(made.directory.iterdir())
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["0.log", "1.log"]
    assert all(f.stat().st_size == FILE_BYTES and f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert made.directory.stat().st_mode & 0o777 == 0o700
    assert list(record_log.orphaned_entries(made.directory)) == []  # held: a live process's


def test_an_append_is_in_the_file_when_it_returns(made: RecordLog) -> None:
    target = made.threads_dir / "t.json"
    ticket = made.append(b'{"threadId":"t"}', target)
    assert ticket is not None
    made.written(ticket)
    assert [entries_of(f) for f in sorted(made.directory.iterdir())] == [[b'{"threadId":"t"}'], []]


def test_a_half_full_file_is_checkpointed_once_its_records_are_written(made: RecordLog) -> None:
    big = b"r" * (FILE_BYTES // 8)
    paths = [made.threads_dir / f"t{i}.json" for i in range(5)]
    for path in paths:
        path.write_bytes(b"{}")
    tickets = [made.append(big, path) for path in paths[:4]]
    assert all(tickets)
    first, second = sorted(made.directory.iterdir())
    for ticket in tickets[1:]:
        made.written(ticket)
    # past half full: the other file takes the appends; the first waits for its last record
    later = made.append(b"later", paths[4])
    assert later is not None
    made.written(later)
    assert entries_of(second) == [b"later"]
    assert len(entries_of(first)) == 4  # one record of it is still being written: kept
    made.written(tickets[0])
    wait_for(lambda: entries_of(first) == [])
    assert entries_of(second) == [b"later"]


def test_a_save_wakes_the_logs_thread_only_when_it_waits_for_that_save(made: RecordLog) -> None:
    notified: list[int] = []

    class Counting(threading.Condition):
        def notify_all(self) -> None:
            notified.append(1)
            super().notify_all()

    made._wake = Counting(made._lock)
    for i in range(20):  # saves to the active file: nothing waits for them
        ticket = made.append(b'{"threadId":"t%d"}' % i, made.threads_dir / f"t{i}.json")
        assert ticket is not None
        made.written(ticket)
    assert notified == []


def concurrent_appends(made: RecordLog, monkeypatch: pytest.MonkeyPatch, first_sync: object) -> tuple[list, list]:
    """Eight threads append at once; the first ``fdatasync`` waits until all eight entries
    are in the file, then does ``first_sync`` (None: sync; an exception: raise it). The
    tickets, and the syncs that were made."""
    active = made._active
    assert active is not None
    syncs: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fd != active.fd:  # os.fdatasync is the process's: another thread's sync (a log left by another test)
            real(fd)
            return
        syncs.append(fd)
        if len(syncs) == 1:
            wait_for(lambda: active.appended == 8)  # an append does not wait for a sync under way
            if isinstance(first_sync, BaseException):
                raise first_sync
        real(fd)

    monkeypatch.setattr(record_log.os, "fdatasync", fdatasync)
    tickets: list = [None] * 8

    def save(i: int) -> None:
        tickets[i] = made.append(b'{"threadId":"t%d"}' % i, made.threads_dir / f"t{i}.json")

    workers = [threading.Thread(target=save, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    return tickets, syncs


def test_concurrent_saves_share_a_sync(made: RecordLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group commit: while one save syncs, the others append; one more sync covers them all."""
    tickets, syncs = concurrent_appends(made, monkeypatch, None)
    assert all(tickets)
    assert len(syncs) == 2
    first = sorted(made.directory.iterdir())[0]
    assert sorted(entries_of(first)) == sorted(b'{"threadId":"t%d"}' % i for i in range(8))
    for ticket in tickets:
        made.written(ticket)
    assert made._active is not None and made._active.writing == 0


def test_a_failed_shared_sync_leaves_every_save_it_covered_to_the_classic_write(
    made: RecordLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    tickets, syncs = concurrent_appends(made, monkeypatch, OSError(5, "Input/output error"))
    assert tickets == [None] * 8  # none trusted to a second fdatasync after a failed one
    assert len(syncs) == 1
    assert not made.ready  # off: the next saves are classic from the start
    assert made._active is not None and made._active.writing == 0  # nothing left for a checkpoint to wait on


def test_an_entry_over_half_a_file_is_left_to_the_classic_write(made: RecordLog) -> None:
    assert made.append(b"x" * (FILE_BYTES // 2), made.threads_dir / "t.json") is None
    assert made.ready


def test_a_file_being_made_is_never_taken_for_a_dead_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's recovery in the instant between a file's creation and its lock (CI saw
    it: two adapters on one state directory, one making its files as the other started) finds
    nothing to read: the file is not named ``*.log`` before it is locked."""
    directory = tmp_path / record_log.DIRECTORY
    threads = tmp_path / "threads"
    threads.mkdir()
    found: list[list[str]] = []  # what each recovery read
    recovering = threading.local()
    real_flock = record_log.fcntl.flock

    def recovery_first(fd: int, operation: int) -> None:
        if not getattr(recovering, "now", False) and os.fstat(fd).st_size == 0:  # just made, not locked
            recovering.now = True
            try:
                found.append([path.name for path, _ in record_log.orphaned_entries(directory)])
            finally:
                recovering.now = False
        real_flock(fd, operation)

    monkeypatch.setattr(record_log.fcntl, "flock", recovery_first)
    the_log = RecordLog(directory, threads)
    the_log._make_files()
    monkeypatch.undo()
    assert found == [[], []]  # a recovery in the instant before each lock: nothing of the maker's
    files = sorted(directory.iterdir())
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["0.log", "1.log"]
    assert all(f.stat().st_size == FILE_BYTES for f in files)
    assert list(record_log.orphaned_entries(directory)) == []  # held by their maker


def test_recovery_deletes_what_a_maker_killed_before_its_lock_left_and_nothing_else(tmp_path: Path) -> None:
    """A ``kill -9`` between a file's creation and its lock leaves an empty ``*.log.making``:
    recovery deletes it once it is old and nobody holds it; a young one may be in that very
    instant, and a held one is its maker's."""
    directory = tmp_path / record_log.DIRECTORY
    directory.mkdir()
    old = time.time() - record_log.UNMADE_SECONDS - 5
    dead, young, held = (directory / f"{n}-0123456789abcdef-0.log{record_log.MAKING}" for n in (101, 102, 103))
    for path in (dead, young, held):
        path.touch()
    os.utime(dead, (old, old))
    os.utime(held, (old, old))
    holder = os.open(held, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    store = ThreadStore(tmp_path)
    try:
        assert store.recover() == 0
        assert sorted(p.name for p in directory.iterdir()) == [young.name, held.name]
    finally:
        os.close(holder)
    store.recover()
    assert sorted(p.name for p in directory.iterdir()) == [young.name]  # let go: its maker died
    assert record_log.remove_unmade(directory, now=time.time() + record_log.UNMADE_SECONDS + 1) == 1
    assert list(directory.iterdir()) == []


def test_a_log_that_cannot_be_made_is_off_and_saves_stay_durable(tmp_path: Path) -> None:
    (tmp_path / record_log.DIRECTORY).write_text("in the way")  # not a directory
    store = ThreadStore(tmp_path)
    store.use_log()
    assert store.log is not None
    wait_for(lambda: store.log is not None and store.log._off)
    thread = record()
    store.save(thread)
    assert store.load("t-1") is not None and store.load("t-1").revision == 1  # type: ignore[union-attr]


# ====================================================================== the store through it
def test_durable_saves_go_to_the_log_with_their_revision(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    store.use_log()
    assert store.log is not None
    wait_for(lambda: store.log.ready)  # type: ignore[union-attr]
    thread = record()
    store.save(thread)
    store.save(thread, durable=False)
    store.save(thread)
    logged = [json.loads(p) for f in sorted(store.log.directory.iterdir()) for p in entries_of(f)]
    assert [entry["revision"] for entry in logged] == [1, 3]  # the plain write is not logged
    assert logged[-1] == json.loads(store.path_for("t-1").read_bytes())
    assert store.load("t-1").revision == 3  # type: ignore[union-attr]


def test_a_record_written_before_revisions_reads_as_revision_0(tmp_path: Path) -> None:
    store = ThreadStore(tmp_path)
    store.save(record())
    path = store.path_for("t-1")
    data = json.loads(path.read_bytes())
    del data["revision"]
    path.write_text(json.dumps(data))
    assert store.load("t-1").revision == 0  # type: ignore[union-attr]


# ====================================================================== recovery
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from agui_adapter.state.store import Execution, ThreadRecord, ThreadStore
    store = ThreadStore(Path(sys.argv[1]))
    store.use_log()
    while not store.log.ready:
        time.sleep(0.01)
    for name in sys.argv[2:]:
        thread = ThreadRecord(name, "agui-x", "/w", None, Execution("e1", "r1"))
        store.save(thread)
        thread.user_id = "u-" + name
        store.save(thread)  # revision 2, the newest
    print("saved", flush=True)
    time.sleep(60)
    """
)


def start_writer(root: Path, *threads: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), *threads], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "saved\n"
    return process


def test_a_live_process_log_is_left_alone(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, "a")
    try:
        ThreadStore(tmp_path).path_for("a").unlink()
        assert ThreadStore(tmp_path).recover() == 0
        assert len(list((tmp_path / record_log.DIRECTORY).iterdir())) == 2
    finally:
        writer.kill()
        writer.wait()


def test_records_a_power_cut_took_come_back_from_a_dead_process_log(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, "lost", "torn", "older", "newer", "kept")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    store = ThreadStore(tmp_path)
    # what a power cut may leave of writes that were not synced in place
    store.path_for("lost").unlink()
    store.path_for("torn").write_bytes(b"")
    older = json.loads(store.path_for("older").read_bytes())
    older.update(revision=1, userId=None)
    store.path_for("older").write_text(json.dumps(older))
    newer = json.loads(store.path_for("newer").read_bytes())
    newer.update(revision=7, userId="moved-on")
    store.path_for("newer").write_text(json.dumps(newer))
    kept_before = store.path_for("kept").read_bytes()

    assert store.recover() == 3
    for name in ("lost", "torn", "older"):
        restored = store.load(name)
        assert restored is not None and restored.revision == 2 and restored.user_id == "u-" + name
    assert store.load("newer").user_id == "moved-on"  # type: ignore[union-attr]
    assert store.path_for("kept").read_bytes() == kept_before
    assert list((tmp_path / record_log.DIRECTORY).iterdir()) == []  # read once, then deleted
    assert store.recover() == 0


def test_after_a_kill_nothing_is_written_back(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, "a", "b")
    writer.kill()
    writer.wait()
    store = ThreadStore(tmp_path)
    before = {name: store.path_for(name).read_bytes() for name in ("a", "b")}
    assert store.recover() == 0  # the page cache had every record as new as the log
    assert {name: store.path_for(name).read_bytes() for name in ("a", "b")} == before
    assert list((tmp_path / record_log.DIRECTORY).iterdir()) == []


def test_retention_reads_dead_logs_before_it_deletes(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, "idle")
    writer.kill()
    writer.wait()
    store = ThreadStore(tmp_path)
    store.path_for("idle").unlink()
    prune(store, max_age_seconds=10**9)
    assert list((tmp_path / record_log.DIRECTORY).iterdir()) == []
    assert store.load("idle") is not None and os.path.exists(store.path_for("idle"))


def test_a_forked_worker_makes_its_own_files(made: RecordLog) -> None:
    """gunicorn --preload: the app (and its log) is made before the workers are forked."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: appends must not land in the parent's files
        code = 1
        try:
            assert made.append(b"child", made.threads_dir / "c.json") is None  # its own are being made
            wait_for(lambda: made.ready)
            ticket = made.append(b"child", made.threads_dir / "c.json")
            assert ticket is not None
            os.write(write_end, ticket.path.name.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    name = os.read(read_end, 200).decode()
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert name.startswith(f"{pid}-")
    parents = [f for f in made.directory.iterdir() if f.name.startswith(f"{os.getpid()}-")]
    assert len(parents) == 2 and all(entries_of(f) == [] for f in parents)
    assert entries_of(made.directory / name) == [b"child"]
    assert [path.name for path, _ in record_log.orphaned_entries(made.directory)] == [
        f"{pid}-{name.split('-')[1]}-{n}.log" for n in (0, 1)
    ]  # the worker died: its files are a dead process's


def test_an_entry_is_checkpointed_once_it_is_rotate_seconds_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_log, "ROTATE_SECONDS", 0.2)  # the thread looks every 0.1 s
    now = [0.0]  # the log's clock, moved by hand: the entry's age is not left to chance
    threads = tmp_path / "threads"
    threads.mkdir()
    (threads / "t.json").write_bytes(b"{}")
    the_log = RecordLog(tmp_path / record_log.DIRECTORY, threads, clock=lambda: now[0])
    the_log.start()
    wait_for(lambda: the_log.ready)
    first, second = sorted(the_log.directory.iterdir())
    ticket = the_log.append(b"entry", threads / "t.json")
    assert ticket is not None
    the_log.written(ticket)
    now[0] += 0.1
    assert entries_of(first) == [b"entry"]  # young: kept
    now[0] += 0.1
    wait_for(lambda: entries_of(first) == [])  # old enough: the record synced in place, the file reset
    ticket = the_log.append(b"next", threads / "t.json")
    assert ticket is not None
    the_log.written(ticket)
    assert entries_of(second) == [b"next"]  # the other file took over


def test_a_live_process_reads_the_logs_of_processes_that_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_log, "ROTATE_SECONDS", 0.2)
    store = ThreadStore(tmp_path)
    store.use_log()
    writer = start_writer(tmp_path, "a")  # a gunicorn worker, say
    dead = {f.name for f in (tmp_path / record_log.DIRECTORY).iterdir() if f.name.startswith(f"{writer.pid}-")}
    assert len(dead) == 2
    store.path_for("a").unlink()  # what a power cut took
    writer.kill()
    writer.wait()
    wait_for(lambda: not dead & {f.name for f in (tmp_path / record_log.DIRECTORY).iterdir()})
    assert store.load("a") is not None and store.load("a").revision == 2  # type: ignore[union-attr]


def test_a_dropped_log_ends_its_thread_and_lets_its_files_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An app built and dropped (tests, an embedding process) leaves no thread and no held file."""
    import gc
    import threading

    monkeypatch.setattr(record_log, "ROTATE_SECONDS", 0.2)

    def used_and_dropped() -> threading.Thread:
        store = ThreadStore(tmp_path)
        store.use_log()
        the_log = store.log
        assert the_log is not None
        wait_for(lambda: the_log.ready)
        assert the_log._thread is not None and the_log._thread.is_alive()
        return the_log._thread

    thread = used_and_dropped()
    wait_for(lambda: gc.collect() >= 0 and not thread.is_alive())
    dead = [path.name for path, _ in record_log.orphaned_entries(tmp_path / record_log.DIRECTORY)]
    assert len(dead) == 2  # their locks were released with them
    assert not any(t.name == "record-log" and t is thread for t in threading.enumerate())


def test_a_save_waiting_for_anothers_sync_lets_the_next_start_in(
    made: RecordLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start's save that finds a sync under way gives its turn at the start gate to the next
    start meanwhile (whose save may then share the next sync), and takes a turn again after;
    a save that syncs at once keeps its turn."""
    gate = StartGate(1, stall_seconds=30)
    active = made._active
    assert active is not None
    syncing, disk = threading.Event(), threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fd == active.fd and not disk.is_set():
            syncing.set()
            disk.wait(30)
        real(fd)

    monkeypatch.setattr(record_log.os, "fdatasync", fdatasync)
    first = threading.Thread(target=lambda: made.written(made.append(b'{"threadId":"a"}', made.threads_dir / "a.json")))
    first.start()  # no start of its own: it syncs, and holds the sync
    assert syncing.wait(30)
    turns: list[bool] = []

    def start_that_saves() -> None:
        slot = gate.enter()
        ticket = made.append(b'{"threadId":"b"}', made.threads_dir / "b.json")
        turns.append(slot.holding)
        made.written(ticket)
        slot.leave()

    saver = threading.Thread(target=start_that_saves)
    saver.start()
    wait_for(lambda: active.appended == 2 and gate.taken() == 0)  # appended, and its turn given up
    nxt = gate.enter()  # the next start gets in while the save waits
    disk.set()
    wait_for(lambda: len(gate._back) == 1)  # synced: back for a turn, ahead of new starts
    nxt.leave()
    saver.join(30)
    first.join(30)
    assert turns == [True] and gate.taken() == 0
    with_turn = gate.enter()
    made.written(made.append(b'{"threadId":"c"}', made.threads_dir / "c.json"))  # no sync under way
    assert with_turn.holding and gate.taken() == 1
    with_turn.leave()
