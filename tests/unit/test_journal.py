"""The run journal (``state/journal.py``) on a real directory: segments, bounds, readers (any number),
the writer's liveness and retention. The HTTP side is in tests/flow/test_reattach.py."""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.protocol import events as ev
from agui_adapter.run.client_watch import ClientWatch
from agui_adapter.state import journal_bell
from agui_adapter.state.journal import (
    END,
    JournalReader,
    JournalStore,
    ReplayUnavailable,
    RunNotFound,
    follow,
    join_readers,
    writer_alive,
)
from tests.support.flow import wait_for


def chunk(first_id: int, count: int, size: int = 10) -> bytes:
    return ev.encode_many([{"type": "CUSTOM", "n": i, "pad": "x" * size} for i in range(count)], first_id)


def ids(data: bytes) -> list[int]:
    return [int(frame.split(b"\n")[0][4:]) for frame in data.split(b"\n\n") if frame.startswith(b"id: ")]


@pytest.fixture
def store(tmp_path: Path) -> JournalStore:
    return JournalStore(tmp_path, retention_seconds=300, buffer_bytes=64 * 1024)


def test_a_reader_gets_the_events_after_its_id_then_new_ones_then_the_end(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 3), 4)
    reader = store.open_reader("t", "r", 1)
    assert ids(reader.read()) == [2, 3]
    assert reader.read() == b"" and not reader.ended
    writer.append(chunk(4, 2), 6)
    assert ids(reader.read()) == [4, 5]
    writer.end()
    assert reader.read() == b"" and reader.ended
    assert ids(store.open_reader("t", "r", 0).read()) == [1, 2, 3, 4, 5]


def test_a_half_written_frame_waits_for_its_end(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    data = chunk(1, 2)
    writer.append(data[:-7], 2)  # torn between two writes, as a reader may see one
    reader = store.open_reader("t", "r", 0)
    assert ids(reader.read()) == [1]
    writer.append(data[-7:], 3)
    assert ids(reader.read()) == [2]


def test_segments_roll_and_old_events_fall_out_per_event(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    next_id = 1
    for _ in range(40):  # 40 chunks of 20 events of about 130 bytes: 100 KiB in all
        writer.append(chunk(next_id, 20, 100), next_id + 20)
        next_id += 20
    big = chunk(next_id, 600, 100)  # one wake-up larger than the whole buffer: split per event
    writer.append(big, next_id + 600)
    next_id += 600
    writer.end()
    segments = sorted(p for p in store.run_dir("t", "r").iterdir() if p.suffix == ".sse")
    assert 1 < len(segments)
    assert sum(p.stat().st_size for p in segments) <= 64 * 1024 + 16 * 1024
    first_kept = int(segments[0].stem)
    assert first_kept > 1
    with pytest.raises(ReplayUnavailable):
        store.open_reader("t", "r", first_kept - 2)
    everything = store.open_reader("t", "r", first_kept - 1).read()
    assert ids(everything) == list(range(first_kept, next_id))


def test_a_reader_that_falls_behind_the_buffer_is_told(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 5), 6)
    reader = store.open_reader("t", "r", 0)
    assert ids(reader.read()) == [1, 2, 3, 4, 5]
    next_id = 6
    for _ in range(10):
        writer.append(chunk(next_id, 200, 100), next_id + 200)
        next_id += 200
    with pytest.raises(ReplayUnavailable):
        reader.read()


def test_unknown_runs_and_threads(store: JournalStore) -> None:
    store.open_writer("t", "r").append(chunk(1, 1), 2)
    with pytest.raises(RunNotFound):
        store.open_reader("t", "other", 0)
    with pytest.raises(RunNotFound):
        store.open_reader("other", "r", 0)


def test_hostile_ids_stay_inside_the_journal_directory(store: JournalStore, tmp_path: Path) -> None:
    writer = store.open_writer("../../etc", "../../../x")
    writer.append(chunk(1, 1), 2)
    writer.end()
    assert store.run_dir("../../etc", "../../../x").resolve().is_relative_to((tmp_path / "journal").resolve())
    assert ids(store.open_reader("../../etc", "../../../x", 0).read()) == [1]


def test_any_number_of_readers_follow_a_run_and_the_writer_counts_them(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    directory = store.run_dir("t", "r")
    assert writer_alive(directory) and writer.readers() == 1  # the run's own client
    writer.append(chunk(1, 2), 3)
    first = store.open_reader("t", "r", 0)
    first.attach()
    second = store.open_reader("t", "r", 1)
    second.attach()
    assert writer.readers() == 3 and store.readers("t", "r") == 3
    writer.client_left()
    assert writer.readers() == 2
    writer.append(chunk(3, 1), 4)
    assert ids(first.read()) == [1, 2, 3] and ids(second.read()) == [2, 3]  # none ends another
    first.detach()
    assert writer.readers() == 1
    second.close()
    assert writer.readers() == 0
    writer.end()
    assert not writer_alive(directory)


def test_a_reader_whose_process_died_counts_for_nothing(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    directory = store.run_dir("t", "r")
    fd, path = join_readers(directory)
    assert writer.readers() == 2
    os.close(fd)  # its lock goes with its process; the file stays behind
    assert path.exists() and writer.readers() == 1
    assert not path.exists()  # the count tidied it away
    writer.end()
    assert writer.readers() == 0  # the ended run's own client left too


def test_nothing_left_for_a_reader_that_has_all_of_an_ended_run(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 3), 4)
    live = store.open_reader("t", "r", 3)
    assert not live.nothing_left()  # the run goes on: more may come
    writer.end()
    assert store.open_reader("t", "r", 3).nothing_left()
    assert store.open_reader("t", "r", 9).nothing_left()
    whole = store.open_reader("t", "r", 0)
    assert not whole.nothing_left()
    assert ids(whole.read()) == [1, 2, 3] and whole.ended  # what it read ahead is not lost
    tail = store.open_reader("t", "r", 2)
    assert not tail.nothing_left() and ids(tail.read()) == [3]


def test_nothing_left_after_the_made_up_end_of_a_run_whose_process_died(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 2), 3)
    writer.close()  # its process went without writing the end
    assert not store.open_reader("t", "r", 2).nothing_left()  # the reader still needs the made-up end
    assert store.open_reader("t", "r", 3).nothing_left()  # it had it (id 3, past the journal)


def test_follow_replays_and_ends_at_the_end_or_when_its_client_hangs_up(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 2), 3)
    writer.end()
    reader = store.open_reader("t", "r", 0)
    reader.attach()
    assert ids(b"".join(follow(reader, heartbeat_seconds=10, poll_seconds=0.01))) == [1, 2]

    writer = store.open_writer("t", "r2")
    writer.append(chunk(1, 2), 3)
    reader = store.open_reader("t", "r2", 0)
    reader.attach()
    gone: list[bool] = []
    client = ClientWatch(lambda: bool(gone), "r2")  # a server asked on ticks
    chunks = follow(reader, heartbeat_seconds=0.02, poll_seconds=0.01, client=client)
    assert ids(next(chunks)) == [1, 2]
    assert next(chunks) == ev.HEARTBEAT  # the run is silent
    other = store.open_reader("t", "r2", 0)
    other.attach()  # another reader does not end this one
    assert next(chunks) == ev.HEARTBEAT
    gone.append(True)
    started = time.monotonic()
    assert [c for c in chunks if c != ev.HEARTBEAT] == []
    assert time.monotonic() - started < 1.0
    other.close()
    writer.end()


class Follower:
    """``follow`` drained on a thread of its own, its chunks kept as they come."""

    def __init__(self, reader: JournalReader, **options: Any) -> None:
        self.chunks: list[bytes] = []
        self.wake = threading.Event()
        self._follow = follow(reader, wake=self.wake, **options)
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        for data in self._follow:
            self.chunks.append(data)

    def ids(self) -> list[int]:
        return ids(b"".join(self.chunks))


def test_a_follower_is_woken_by_its_writer_in_this_process_not_by_polls(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 2), 3)
    reader = store.open_reader("t", "r", 0)
    reader.attach()
    follower = Follower(reader, heartbeat_seconds=600, poll_seconds=600)  # never a poll in this test
    wait_for(lambda: follower.ids() == [1, 2])
    writer.append(chunk(3, 1), 4)  # the bell: read at once
    wait_for(lambda: follower.ids() == [1, 2, 3])
    writer.append(chunk(4, 2), 6)
    wait_for(lambda: follower.ids() == [1, 2, 3, 4, 5])
    writer.end()
    follower.thread.join(10)
    assert not follower.thread.is_alive()  # the end was rung too
    assert journal_bell.of(os.fspath(reader.directory)) is None  # the writer took its bell down
    reader.close()


def test_a_follower_leaves_the_bell_when_it_stops(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 1), 2)
    bell = journal_bell.of(os.fspath(store.run_dir("t", "r")))
    assert bell is not None
    reader = store.open_reader("t", "r", 0)
    chunks = follow(reader, heartbeat_seconds=600, poll_seconds=600)
    assert ids(next(chunks)) == [1]
    assert bell._listeners  # listening while it follows
    chunks.close()  # the client went: the response is closed
    assert not bell._listeners
    reader.close()
    writer.end()


def test_a_follower_polls_a_journal_whose_writer_is_elsewhere(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    directory = os.fspath(store.run_dir("t", "r"))
    bell = journal_bell.of(directory)
    assert bell is not None
    journal_bell.take_down(directory, bell)  # as for a writer in another process: no bell here
    writer._bell = None
    writer.append(chunk(1, 1), 2)
    reader = store.open_reader("t", "r", 0)
    follower = Follower(reader, heartbeat_seconds=600, poll_seconds=0.01)
    wait_for(lambda: follower.ids() == [1])
    writer.append(chunk(2, 1), 3)
    wait_for(lambda: follower.ids() == [1, 2])
    writer.end()
    follower.thread.join(10)
    assert not follower.thread.is_alive()
    reader.close()


def test_the_servers_word_on_a_hang_up_wakes_a_follower(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 1), 2)
    reader = store.open_reader("t", "r", 0)
    told: list[Any] = []

    def watch(word: Any) -> bool:
        told.append(word)
        return True  # the server watches the socket, and will tell

    gone: list[bool] = []
    wake = threading.Event()
    client = ClientWatch(lambda: bool(gone), "r", watch, wake.set)
    chunks: list[bytes] = []
    drained = threading.Thread(
        target=lambda: chunks.extend(follow(reader, heartbeat_seconds=600, poll_seconds=600, client=client, wake=wake)),
        daemon=True,
    )
    drained.start()
    wait_for(lambda: ids(b"".join(chunks)) == [1])
    gone.append(True)
    told[0](True)  # the I/O thread's word: the client hung up
    drained.join(10)
    assert not drained.is_alive()
    reader.close()
    writer.end()


def test_a_reader_here_that_leaves_tells_the_writer_at_once(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")

    class Run:
        woken = 0

        def wake(self) -> None:
            self.woken += 1

    run = Run()
    writer.hear_readers(run.wake)
    reader = store.open_reader("t", "r", 0)
    reader.attach()
    assert not writer.readers_left()
    reader.detach()
    assert run.woken == 1 and writer.readers_left()
    assert not writer.readers_left()  # told once per leaving
    reader.detach()  # not attached any more: nobody left
    assert run.woken == 1 and not writer.readers_left()
    gone = weakref.ref(run)
    del run  # the bell holds the run's wake-up weakly: no cycle keeps an ended run
    assert gone() is None
    other = store.open_reader("t", "r", 0)
    other.attach()
    other.detach()  # the run is gone: nobody to wake
    assert writer.readers_left()
    writer.end()


def test_a_bell_taken_down_late_leaves_the_next_writers_bell(tmp_path: Path) -> None:
    old = journal_bell.hang(str(tmp_path))
    new = journal_bell.hang(str(tmp_path))  # a process that adopted the run, say
    woken = threading.Event()
    old.listen(woken)
    journal_bell.take_down(str(tmp_path), old)
    assert woken.is_set()  # its followers look again
    assert journal_bell.of(str(tmp_path)) is new
    journal_bell.take_down(str(tmp_path), new)
    assert journal_bell.of(str(tmp_path)) is None


def test_follow_ends_with_the_lost_event_when_the_writer_died(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 2), 3)
    writer.close()  # its process went without writing the end
    reader = store.open_reader("t", "r", 0)
    reader.attach()
    out = b"".join(follow(reader, heartbeat_seconds=10, poll_seconds=0.01, lost=lambda n: chunk(n, 1)))
    assert ids(out) == [1, 2, 3] and END not in out


def test_retention_sweeps_ended_and_dead_journals_but_not_live_ones(tmp_path: Path) -> None:
    store = JournalStore(tmp_path, retention_seconds=100, buffer_bytes=64 * 1024)
    ended = store.open_writer("t", "ended")
    ended.end()
    dead = store.open_writer("t", "dead")
    dead.close()
    live = store.open_writer("t", "live")
    assert store.sweep(time.time() + 50) == 0
    assert store.sweep(time.time() + 200) == 2
    assert not store.run_dir("t", "ended").exists() and not store.run_dir("t", "dead").exists()
    assert store.run_dir("t", "live").exists()
    live.end()


def test_files_are_private(store: JournalStore) -> None:
    writer = store.open_writer("t", "r")
    writer.append(chunk(1, 1), 2)
    directory = store.run_dir("t", "r")
    reader = store.open_reader("t", "r", 0)
    reader.attach()
    assert directory.stat().st_mode & 0o777 == 0o700
    entries = list(directory.rglob("*"))
    assert any(p.parent.name == "readers" for p in entries)
    assert all(p.stat().st_mode & 0o777 == (0o700 if p.is_dir() else 0o600) for p in entries)
    reader.close()
    writer.end()


def spare_dirs(store: JournalStore) -> list[Path]:
    spares = store.root / "Spares"
    return sorted(spares.iterdir()) if spares.exists() else []


def test_a_journal_made_ahead_of_need_is_taken_by_the_next_run_whole(store: JournalStore) -> None:
    first = store.open_writer("t", "r1", {"runId": "r1"})  # made here; a spare is made meanwhile
    wait_for(lambda: len(spare_dirs(store)) == 1 and store._spare is not None, 10)
    (spare,) = spare_dirs(store)
    assert sorted(p.name for p in spare.iterdir()) == ["000000000001.sse", "readers", "run.json"]
    assert writer_alive(spare)  # held: a sweeper leaves it, however old
    assert store.sweep(now=time.time() + 10 * 3600) == 0 and spare.exists()
    inode = spare.stat().st_ino
    second = store.open_writer("t", "r2", {"runId": "r2"})
    directory = store.run_dir("t", "r2")
    assert directory.stat().st_ino == inode and not spare.exists()  # the spare, renamed into place
    assert json.loads((directory / "run.json").read_text()) == {"runId": "r2"}
    assert store.readers("t", "r2") == 1  # the run's own client, as for a journal made on the spot
    second.append(chunk(1, 2), 3)
    second.end()
    assert ids(store.open_reader("t", "r2", 0).read()) == [1, 2]
    # the run that took the spare asks for the next one once past its start, not while it starts
    assert not store._wanted and store._spare is None
    store.replenish()
    wait_for(lambda: len(spare_dirs(store)) == 1 and store._spare is not None, 10)  # the next one
    store.replenish()  # one is ready: nothing more is made
    assert not store._wanted
    first.end()


def test_a_run_asks_for_the_next_spare_once_its_first_events_past_run_started_are_sent(store: JournalStore) -> None:
    from agui_adapter.run.run_journal import RunJournal

    store.open_writer("t", "r0").end()  # made on the spot: a spare is asked for at once
    wait_for(lambda: store._spare is not None, 10)

    class Props:
        ros_invocation_id = preferred_language = run_mode = pipeline_name = None

    class Machine:
        run_input = type("RunInput", (), {"props": Props(), "parent_run_id": None})()
        mode = type("Mode", (), {"value": "turn"})()
        language = "en"

    class Translator:
        pipeline_seen = False

    journal = RunJournal("r1")
    journal.open(store, "t", Machine())  # takes the spare
    assert store._spare is None
    # the driver passes the id after the chunk's last event, as the journal's writer takes it
    journal.append(chunk(1, 1), 2, Translator())  # RUN_STARTED: still starting
    journal.sent()
    assert not store._wanted and store._spare is None
    journal.append(chunk(2, 3), 5, Translator())  # its first events after RUN_STARTED
    assert not store._wanted and store._spare is None  # not before they are sent
    journal.sent()
    wait_for(lambda: store._spare is not None, 10)
    journal.end()


def test_a_spare_asked_for_while_one_is_being_made_is_that_one(
    store: JournalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that made its own journal (none was ready) asks for the next one past its start,
    while the maker may still be making the one the run asked for first: one spare, not two
    with the first left behind (a held, never-taken directory)."""
    import threading

    release = threading.Event()
    make_fresh = store._make_fresh

    def slow_make_fresh(parent: Path) -> tuple[Path, object]:
        assert release.wait(10)
        return make_fresh(parent)

    monkeypatch.setattr(store, "_make_fresh", slow_make_fresh)
    assert store._take_spare() is None  # none ready: one is asked for, and is being made
    wait_for(lambda: store._making, 10)
    store.replenish()  # the run, past its start
    release.set()
    wait_for(lambda: store._spare is not None, 10)
    wait_for(lambda: not store._making and not store._wanted, 10)
    assert len(spare_dirs(store)) == 1


def test_no_thread_id_names_the_spares_directory() -> None:
    from agui_adapter.state.store import thread_key

    assert thread_key("Spares") != "Spares" and thread_key("spares") == "spares"


def test_without_room_for_a_spare_runs_make_their_own_and_the_maker_tries_again(store: JournalStore) -> None:
    store.root.mkdir(parents=True)
    (store.root / "Spares").write_bytes(b"")  # not a directory: no spare can be made
    first = store.open_writer("t", "r1")
    wait_for(lambda: store._spare_maker is None, 10)  # it gave up, saying why
    assert store._spare is None
    second = store.open_writer("t", "r2")  # made on the spot, whole
    assert store.readers("t", "r2") == 1 and (store.run_dir("t", "r2") / "000000000001.sse").exists()
    wait_for(lambda: store._spare_maker is None, 10)  # the maker it asked for gave up too
    (store.root / "Spares").unlink()
    third = store.open_writer("t", "r3")  # the next run asks again
    wait_for(lambda: store._spare is not None and len(spare_dirs(store)) == 1, 10)
    for writer in (first, second, third):
        writer.end()


def test_a_run_id_journaled_before_starts_afresh(store: JournalStore) -> None:
    """The same run id again on a thread whose journal directory exists (retention kept the
    first journal): the new journal holds only its own events, never the old ones."""
    old = store.open_writer("t", "r1", {"runId": "r1"})
    old.append(chunk(1, 3), 4)
    old.end()
    store.open_writer("t", "other").end()  # the thread's directory is there, not made anew
    again = store.open_writer("t", "r1", {"runId": "r1"})
    again.append(chunk(1, 1, size=3), 2)
    assert ids(store.open_reader("t", "r1", 0).read()) == [1]
    again.end()


def test_a_taken_spare_s_run_json_is_written_without_truncating_it(store: JournalStore, monkeypatch) -> None:
    """A spare's run.json is empty: opening it with O_TRUNC would have ext4 write its data out
    when it is closed (``auto_da_alloc``) on the way to RUN_STARTED. A retry, whose first
    attempt may have written it, truncates."""
    store.open_writer("t", "r1", {"runId": "r1"}).end()
    wait_for(lambda: store._spare is not None, 10)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    writer = store.open_writer("t", "r2", {"runId": "r2", "pad": "x" * 100})
    monkeypatch.undo()
    metas = [flags for path, flags in opened if path.endswith("run.json")]
    assert len(metas) == 1 and not metas[0] & os.O_TRUNC and metas[0] & os.O_WRONLY
    directory = store.run_dir("t", "r2")
    assert json.loads((directory / "run.json").read_text()) == {"runId": "r2", "pad": "x" * 100}
    assert (directory / "run.json").stat().st_mode & 0o777 == 0o600
    writer.end()
    # a shorter meta over a longer one (a retry's case) is truncated
    from agui_adapter.state.journal import _write_private

    _write_private(directory / "run.json", b"{}")
    assert (directory / "run.json").read_bytes() == b"{}"
