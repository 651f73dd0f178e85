"""The periodic orphan scan (``Adoption.scan``) remembers what it saw: a thread directory
whose runs had all ended, unchanged since, is not opened again; a changed one, or one whose
change may share a clock tick with the last look, is looked into again; a run still written
is looked at every time, so that it is adopted once its writer is gone."""

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
    adoption, root, looked, adopted = scanner
    writer = written_run(root)
    try:
        for _ in range(2):
            assert adoption.scan() == 0
        assert looked == ["r-1", "r-1"] and adopted == []
    finally:
        writer.close()  # the writer is gone, without an end
    assert adoption.scan() == 1
    assert adopted == ["r-1"]


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
