"""The periodic orphan scan (``Adoption.scan``) remembers what it saw: a thread directory
whose runs had all ended, unchanged since, is not opened again; a changed one, or one whose
change may share a clock tick with the last look, is looked into again; a run still written
is looked at every time (its writer first, its journal once the writer is gone), so that it
is adopted once its writer is gone; a run this process writes is not looked at at all."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.run import adoption as adoption_module
from agui_adapter.run.adoption import Adoption
from agui_adapter.run.engine import RunEngine
from agui_adapter.state.journal import END, JournalWriter
from agui_adapter.state.store import ThreadStore

OLD = 10.0  # seconds: older than ``SETTLED_SECONDS``


def make_run(root: Path, thread: str, run: str, *, ended: bool) -> Path:
    """A journal directory as the scan sees it: a segment that ends with the end mark or not."""
    directory = root / thread / run
    (directory / "readers").mkdir(parents=True)
    (directory / "000000000001.sse").write_bytes(b"id: 1\ndata: {}\n\n" + (END if ended else b""))
    return directory


def age(path: Path, seconds: float = OLD) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def scanner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Adoption, Path, list[str], list[str]]]:
    """The engine's ``Adoption`` (no background scanner), the journal root, the run directories
    whose end was looked for, and those it tried to adopt."""
    engine = RunEngine(
        ThreadStore(tmp_path / "state"),
        KernelClient("http://127.0.0.1:9/", "token"),
        Settings(state_dir=str(tmp_path / "state")),
        adopt_orphans=False,
    )
    looked: list[str] = []
    adopted: list[str] = []
    end_seen = adoption_module._end_seen

    def counting(directory: Path) -> bool | None:
        looked.append(directory.name)
        return end_seen(directory)

    monkeypatch.setattr(adoption_module, "_end_seen", counting)
    monkeypatch.setattr(engine.adoption, "adopt", lambda directory: adopted.append(directory.name) or "adopted")
    engine.journals.root.mkdir(parents=True, exist_ok=True)
    yield engine.adoption, engine.journals.root, looked, adopted


def test_an_unchanged_thread_whose_runs_all_ended_is_not_opened_again(scanner) -> None:
    adoption, root, looked, adopted = scanner
    for index in range(5):
        make_run(root, f"t-{index}", "r-1", ended=True)
        make_run(root, f"t-{index}", "r-2", ended=True)
        age(root / f"t-{index}")
    adoption.scan()
    assert sorted(looked) == ["r-1"] * 5 + ["r-2"] * 5
    looked.clear()
    assert adoption.scan() == 0
    assert looked == [] and adopted == []


def test_a_new_orphan_in_a_quiet_thread_is_adopted_at_the_next_scan(scanner) -> None:
    """A run directory made or removed changes its thread directory's mtime."""
    adoption, root, looked, adopted = scanner
    make_run(root, "t-a", "r-1", ended=True)
    age(root / "t-a")
    adoption.scan()
    looked.clear()
    make_run(root, "t-a", "r-2", ended=False)  # a process died while writing it
    assert adoption.scan() == 1
    assert adopted == ["r-2"]
    assert sorted(looked) == ["r-1", "r-2"], "a changed directory is looked into whole"


def test_a_thread_changed_within_the_settling_time_is_looked_into_again(scanner) -> None:
    """Two changes in one tick of the file clock leave one mtime: a recent mtime proves nothing."""
    adoption, root, looked, adopted = scanner
    make_run(root, "t-a", "r-1", ended=True)
    stamp = (root / "t-a").stat().st_mtime_ns
    adoption.scan()
    make_run(root, "t-a", "r-2", ended=False)
    os.utime(root / "t-a", ns=(stamp, stamp))  # the same tick: the mtime did not move
    assert adoption.scan() == 1
    assert adopted == ["r-2"]


def written_run(root: Path) -> JournalWriter:
    """An unended run of thread ``t-a`` with a live writer (of this process or another)."""
    directory = make_run(root, "t-a", "r-1", ended=False)
    age(root / "t-a")
    writer = JournalWriter.claim(directory, 1 << 20)
    assert writer is not None
    return writer


def test_a_run_still_written_is_looked_at_until_its_writer_goes(scanner) -> None:
    """Its writer is looked for first: while it lives, the journal is not opened."""
    adoption, root, looked, adopted = scanner
    writer = written_run(root)
    try:
        for _ in range(2):
            assert adoption.scan() == 0
        assert looked == [] and adopted == []
    finally:
        writer.close()  # the writer is gone, without an end
    assert adoption.scan() == 1
    assert adopted == ["r-1"]
    assert looked == ["r-1"]


class _Writing:
    """A live run of this process, as ``LiveRuns`` lists it (only what the scan asks)."""

    def __init__(self, directory: Path | None) -> None:
        self.journal_held = directory


def test_the_runs_this_process_writes_are_not_looked_at(scanner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither their journal nor their lock: a run this process writes is no orphan."""
    adoption, root, looked, adopted = scanner
    writer = written_run(root)
    other = make_run(root, "t-b", "r-2", ended=False)  # an orphan beside it
    probed: list[str] = []
    alive = adoption_module.writer_alive

    def counting(directory: Path) -> bool:
        probed.append(directory.name)
        return alive(directory)

    monkeypatch.setattr(adoption_module, "writer_alive", counting)
    monkeypatch.setattr(adoption._live, "all", lambda: [_Writing(writer.directory), _Writing(None)])
    try:
        assert adoption.scan() == 1
        assert adopted == [other.name] and probed == [other.name] and looked == [other.name]
    finally:
        writer.close()
    monkeypatch.setattr(adoption._live, "all", lambda: [])
    adopted.clear()
    adoption.scan()
    assert "r-1" in adopted, "once it no longer writes it, an orphan like any"


@pytest.mark.parametrize(
    ("tail", "ended"),
    [
        (b"", False),
        (END, True),
        (b"id: 1\ndata: {}\n\n" + END, True),
        (b"id: 1\ndata: {}\n\n", False),
        (END[1:], False),
    ],
)
def test_the_end_mark_is_read_from_the_newest_segment(tmp_path: Path, tail: bytes, ended: bool) -> None:
    directory = tmp_path / "r-1"
    directory.mkdir()
    (directory / "000000000001.sse").write_bytes(b"id: 0\ndata: {}\n\n" + END)  # an older segment's end
    (directory / "000000000002.sse").write_bytes(tail)
    assert adoption_module._end_seen(directory) is ended


def test_a_writer_holds_its_directory_until_it_ends(tmp_path: Path) -> None:
    from agui_adapter.run.run_journal import RunJournal

    journal = RunJournal("r-1")
    assert journal.held_directory() is None
    journal.writer = JournalWriter.claim(make_run(tmp_path, "t-a", "r-1", ended=False), 1 << 20)
    assert journal.writer is not None
    assert journal.held_directory() == tmp_path / "t-a" / "r-1"
    journal.writer.end()
    assert journal.held_directory() is None


def test_a_run_that_ended_since_the_last_scan_quiets_its_thread(scanner) -> None:
    adoption, root, looked, adopted = scanner
    writer = written_run(root)
    try:
        adoption.scan()
    finally:
        writer.end()
    adoption.scan()
    looked.clear()
    adoption.scan()
    assert looked == [] and adopted == []


def test_a_thread_removed_and_made_again_is_looked_into(scanner) -> None:
    adoption, root, looked, adopted = scanner
    make_run(root, "t-a", "r-1", ended=True)
    age(root / "t-a")
    adoption.scan()
    for path in sorted((root / "t-a").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (root / "t-a").rmdir()
    adoption.scan()  # gone: forgotten
    make_run(root, "t-a", "r-1", ended=False)  # the same names, another run
    age(root / "t-a")
    assert adoption.scan() == 1
    assert adopted == ["r-1"]


def test_a_look_that_failed_is_not_remembered(scanner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of file handles for a moment: the run is no orphan this time, and looked at again."""
    adoption, root, looked, adopted = scanner
    make_run(root, "t-a", "r-1", ended=False)
    age(root / "t-a")
    listdir = os.listdir

    def out_of_handles(path):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "listdir", out_of_handles)
    assert adoption.scan() == 0 and adopted == []
    monkeypatch.setattr(os, "listdir", listdir)
    assert adoption.scan() == 1
    assert adopted == ["r-1"]
