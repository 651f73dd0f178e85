"""Run journals: the events a run sent, kept on disk so that a client can come back to it.

A run takes minutes; a reload, a sleeping laptop or a proxy dropping an idle connection
must not cost it. Every event of a run has an SSE ``id`` (1, 2, ... within the run), and
the run's driver appends each chunk it writes (heartbeats excepted) to the run's journal.
A client that comes back with ``Last-Event-ID: K`` (``POST /`` with the run's own body, or
``GET /threads/{t}/runs/{r}/events``) is sent the journal after K, then the run's new
events as they are appended, up to its end. The journal is plain files in the state
directory, so a reattach that reaches another worker process (gunicorn ``-w 4``) reads and
follows the same run as the worker that runs it.

Layout, per run: ``<state>/journal/<thread key>/<run key>/``

* ``<first id>.sse`` (12 digits): append-only segments holding the SSE frames exactly as
  the client got them. A new segment starts once the current one holds a quarter of
  ``replay_buffer_bytes``; the oldest segments are deleted while the run's segments hold
  more than that, and a reattach that needs their events is ``REPLAY_UNAVAILABLE``.
  The writer appends whole chunks and never fsyncs (a journal is worth nothing after a
  crash of the machine: the run it follows is gone too).
* The run's end is the comment ``: end`` appended after its last event (readers stop
  there; it is never forwarded).
* ``readers/``: one file per reader attached now, the run's own client included, each
  held under an OS lock by its reader (any process): any number of readers follow a run at
  once, each from its own ``Last-Event-ID``, and none ends another. A reader that leaves
  deletes its file; a file nobody holds locked is a reader whose process died, and counts
  for nothing. The run's writer counts them (``JournalWriter.readers``) to know when the
  last one left: that starts the disconnect grace period.
* The writer holds an OS lock on the run's directory for the run's life: a directory
  without an end and without a holder is a run whose process died (or handed it over at
  shutdown). Another process may then take the lock and become the run's writer
  (``claim_writer``; ``adoption``): it goes on appending after the journal's last id.
* ``run.json``: what a process adopting the run needs to know of it and the journal does
  not say (its mode, rosInvocationId, cwd, language, run mode); never a secret.
* ``pipeline.json``: for a pipeline run, the kernel journal's sequences its events delivered
  (written after each chunk), so that an adopter does not deliver them twice.
* ``handed-over``: written when a process stopping gracefully left the run to the kernel
  (``--on-shutdown handover``); the next process adopts it.

A journal is made under a temporary name (``.new-…``) and renamed into place once its writer
holds it. One is made ahead of need, in ``<state>/journal/Spares/`` (no thread key has capital
letters), by a thread of its own: a run renames it into place instead of making its files
between its request and ``RUN_STARTED``, and asks for the next one (``replenish``) once it is
past its start, so that the maker's file-system calls do not compete with it until then.

Journals live for ``replay_retention_seconds`` after their run's last write
(``JournalStore.sweep``, from a daemon thread in each process). They hold only events,
which never carry a secret, in 0600 files in 0700 directories.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from agui_adapter.ops import process_local
from agui_adapter.protocol.events import HEARTBEAT
from agui_adapter.state import journal_bell
from agui_adapter.state.store import thread_key

log = logging.getLogger("agui_adapter.state.journal")

END = b": end\n\n"
_SEGMENT_SUFFIX = ".sse"
_READERS = "readers"
RUN_META = "run.json"
HANDED_OVER = "handed-over"
PIPELINE_NOTE = "pipeline.json"
_NEW, _NEW_LIFETIME = ".new-", 3600.0
#: Where the spare journal waits (a name no thread key takes: keys are lower case).
_SPARES = "Spares"
#: How often a follower checks that the run's process is alive (and its client still there).
READER_REFRESH_SECONDS = 1.0
#: How often a follower asks its server whether its client hung up, when the server does not tell.
CLIENT_CHECK_SECONDS = 0.2
#: How often a reader looks for new events when the run's writer is another process (the
#: writer in this process rings the journal's bell instead, ``journal_bell``).
POLL_SECONDS = 0.05
_READ_SIZE = 256 * 1024


class RunNotFound(Exception):
    """No journal for that run of that thread: unknown, or expired."""


class ReplayUnavailable(Exception):
    """The journal no longer holds the events the reader needs."""


def _segment_name(first_id: int) -> str:
    return f"{first_id:012d}{_SEGMENT_SUFFIX}"


def _segments(directory: Path) -> list[int]:
    """The first ids of a run's segments, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    starts = []
    for name in names:
        if name.endswith(_SEGMENT_SUFFIX) and name[:-4].isdigit():
            starts.append(int(name[:-4]))
    return sorted(starts)


def _write_private(path: Path, data: bytes, *, empty: bool = False) -> None:
    """``data`` at ``path``, 0600. ``empty``: the file is new or empty (a spare's ``run.json``),
    so it is opened without ``O_TRUNC``: on ext4 a file truncated to nothing has its data
    written out when it is closed (``auto_da_alloc``), some 40 µs on the way to RUN_STARTED."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (0 if empty else os.O_TRUNC), 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_meta(directory: Path) -> dict[str, Any] | None:
    """The run's ``run.json`` (None when absent or unreadable)."""
    try:
        data = json.loads((directory / RUN_META).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_pipeline_note(directory: Path) -> dict[str, Any] | None:
    """The run's ``pipeline.json`` (None when absent or unreadable)."""
    try:
        data = json.loads((directory / PIPELINE_NOTE).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mark_handed_over(directory: Path, when: float) -> None:
    """Journal that the run was left running in the kernel by a process stopping."""
    with contextlib.suppress(OSError):
        _write_private(directory / HANDED_OVER, json.dumps({"at": when, "pid": process_local.pid()}).encode("utf-8"))


def scan_run(directory: Path, up_to: int | None = None) -> tuple[int, bool, list[dict[str, Any]]]:
    """What a run's journal holds: its last event id, whether it ended, and its events
    (those of the segments still kept), parsed; only those up to id ``up_to`` when given."""
    last, ended, events = 0, False, []
    for start in _segments(directory):
        try:
            data = (directory / _segment_name(start)).read_bytes()
        except FileNotFoundError:
            continue
        for frame in data.split(b"\n\n")[:-1]:
            if frame + b"\n\n" == END:
                ended = True
                continue
            if not frame.startswith(b"id: "):
                continue
            head, _, body = frame.partition(b"\ndata: ")
            try:
                frame_id, event = int(head[4:]), json.loads(body)
            except ValueError:
                continue
            if up_to is not None and frame_id > up_to:
                return last, ended, events
            if frame_id > last:
                last = frame_id
                if isinstance(event, dict):
                    events.append(event)
    return last, ended, events


# ====================================================================== readers
def join_readers(directory: Path, *, fresh: bool = False) -> tuple[int, Path]:
    """Put a reader among the run's readers: a file held under an exclusive lock for as long
    as the reader is attached (made under a hidden name and renamed once locked, so that a
    counter never takes it for a dead reader's). The lock's fd and the file, for ``leave``.

    ``fresh``: the journal is still being made under its temporary name, where no counter
    looks: the file is made under its own name at once (the writer's own client)."""
    readers = directory / _READERS
    if fresh:
        os.mkdir(readers, 0o700)
        path = readers / f"{process_local.pid()}-{process_local.uuid4().hex}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd, path
    readers.mkdir(mode=0o700, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".", dir=readers)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = readers / f"{process_local.pid()}-{process_local.uuid4().hex}"
        os.rename(temporary, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return fd, path


def leave_readers(presence: tuple[int, Path] | None) -> None:
    """Take a reader out of the run's readers (its file first, then its lock)."""
    if presence is None:
        return
    fd, path = presence
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


def count_readers(directory: Path) -> int:
    """How many readers are attached to the run now, in any process (the run's own client
    included while it is there). A file whose lock nobody holds is a dead reader's: removed."""
    try:
        entries = list(os.scandir(directory / _READERS))
    except OSError:
        return 0
    count = 0
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue  # left meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                count += 1
            continue
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # nobody holds it: its process died
            os.unlink(entry.path)
    return count


# ====================================================================== the store
def first_id_of(chunk: bytes, next_id: int) -> int:
    """The id of a chunk's first frame, ``next_id`` being the id after its last (each frame
    ends with a blank line, and holds none)."""
    return next_id - chunk.count(b"\n\n")


class JournalStore:
    """Where the journals of one state directory live; one per process."""

    def __init__(self, state_dir: Path, *, retention_seconds: float, buffer_bytes: int) -> None:
        self.root = Path(state_dir) / "journal"
        self.retention_seconds = retention_seconds
        self.buffer_bytes = buffer_bytes
        self._sweeper: threading.Thread | None = None
        self._sweeper_lock = threading.Lock()
        self._root_private = False  # the root's mode was set (once per process)
        self._spare: tuple[Path, JournalWriter] | None = None  # a journal made ahead of need
        self._spare_wanted = threading.Condition()
        self._spare_maker: threading.Thread | None = None
        self._wanted = False  # a spare was asked for and is not made yet
        self._making = False  # the maker is making one (a second ask would leave the first behind)

    def run_dir(self, thread_id: str, run_id: str) -> Path:
        return self.root / thread_key(thread_id) / thread_key(run_id)

    def open_writer(self, thread_id: str, run_id: str, meta: dict[str, Any] | None = None) -> JournalWriter:
        """The journal of a run that starts now (OSError when the disk refuses); ``meta``
        goes to ``run.json`` (what an adopting process needs, ``adoption``).

        It is made under a temporary name and renamed into place once its writer holds it,
        so that a sweeper (of any process) never takes a new journal for a dead one. The
        journal made ahead of need (``_make_spares``, on a thread of its own) is taken when
        there is one: the five files and directories a journal is made of cost some 1.5 ms
        of the time to RUN_STARTED when made here."""
        self._start_sweeper()
        directory = self.run_dir(thread_id, run_id)
        spare = self._take_spare()
        for attempt in range(3):
            try:
                # a run id journaled before (retention kept it) starts afresh; a thread
                # directory made just now holds no run, and is not looked into
                if not self._make_thread_dir(directory.parent) and directory.exists():
                    shutil.rmtree(directory, ignore_errors=True)
                if spare is None:
                    spare = self._make_fresh(directory.parent)
                fresh, writer = spare
                if meta is not None:
                    # the spare's run.json, or a fresh journal's, is empty on the first attempt
                    _write_private(fresh / RUN_META, json.dumps(meta).encode("utf-8"), empty=attempt == 0)
                os.rename(fresh, directory)
            except FileNotFoundError:  # a sweeper removed the empty thread directory meanwhile
                if attempt == 2:
                    raise
                if spare is not None and not spare[0].exists():
                    spare[1].close()
                    spare = None
                continue
            writer.moved_to(directory)
            return writer
        raise AssertionError("unreachable")

    def _make_fresh(self, parent: Path) -> tuple[Path, JournalWriter]:
        """A journal under a temporary name in ``parent``, its writer holding it."""
        fresh = parent / f"{_NEW}{process_local.random_hex(8)}"  # mkdtemp's job, in one call
        os.mkdir(fresh, 0o700)
        try:
            return fresh, JournalWriter(fresh, self.buffer_bytes)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise

    def _take_spare(self) -> tuple[Path, JournalWriter] | None:
        """The journal made ahead of need, if one is ready. When there was none, another is
        asked for at once; when there was, its run asks for the next one (``replenish``) once
        it is past its start, so that the maker does not compete with it on its way to its
        first events."""
        with self._spare_wanted:
            spare, self._spare = self._spare, None
            if spare is None:
                self._ask_for_spare()
        return spare

    def replenish(self) -> None:
        """Have the next journal made ahead of need, if none is ready or being made."""
        with self._spare_wanted:
            if self._spare is None:
                self._ask_for_spare()

    def _ask_for_spare(self) -> None:  # holding ``_spare_wanted``
        if self._making:  # the one being made is the next spare
            return
        self._wanted = True
        if self._spare_maker is None:
            self._spare_maker = threading.Thread(target=self._make_spares, name="journal-spare", daemon=True)
            self._spare_maker.start()
        self._spare_wanted.notify()

    def _make_spares(self) -> None:
        """The spare maker's thread: one journal ready at a time, in ``Spares`` under the
        root, its ``run.json`` already there (written, not created, when it is taken)."""
        while True:
            with self._spare_wanted:
                while not self._wanted:
                    self._spare_wanted.wait()
                self._wanted = False
                self._making = True
            try:
                parent = self.root / _SPARES
                self._make_thread_dir(parent)
                fresh, writer = self._make_fresh(parent)
                _write_private(fresh / RUN_META, b"")
            except OSError as exc:  # the runs make theirs as they start; the next one asks again
                log.warning("could not make a journal ahead of need: %s", exc)
                with self._spare_wanted:
                    self._spare_maker = None
                    self._making = False
                return
            with self._spare_wanted:
                self._spare = (fresh, writer)
                self._making = False

    def _make_thread_dir(self, directory: Path) -> bool:
        """The thread's journal directory, and the root's mode set to 0700 when the root is
        made (and once per process): one ``mkdir`` when both exist. Whether the thread's
        directory was made now (it then holds no run)."""
        made = True
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            made = False
        except FileNotFoundError:  # the root is made too (rare: looked into all the same)
            made = False
            self._root_private = False
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self._root_private:
            os.chmod(self.root, 0o700)
            self._root_private = True
        return made

    def open_reader(self, thread_id: str, run_id: str, after: int) -> JournalReader:
        """A reader of the run's events after id ``after`` (RunNotFound, ReplayUnavailable)."""
        directory = self.run_dir(thread_id, run_id)
        starts = _segments(directory)
        if not starts:
            raise RunNotFound(run_id)
        return JournalReader(directory, after, starts)

    def readers(self, thread_id: str, run_id: str) -> int:
        """How many clients follow the run now, in any process (its own client included)."""
        return count_readers(self.run_dir(thread_id, run_id))

    def progress(self, thread_id: str, run_id: str) -> tuple[bool, int | None, bool] | None:
        """What ``GET /threads/{threadId}`` says of a run from its journal, whichever process
        runs it: (whether its writer is alive, the last event id written, whether a client
        is attached); None without a journal."""
        directory = self.run_dir(thread_id, run_id)
        starts = _segments(directory)
        if not starts:
            return None
        return writer_alive(directory), last_written_id(directory, starts), count_readers(directory) > 0

    # ------------------------------------------------------------------ retention
    def sweep(self, now: float | None = None) -> int:
        """Delete the journals of runs that ended (or whose process died) more than
        ``retention_seconds`` ago; how many were deleted."""
        now = time.time() if now is None else now
        removed = 0
        try:
            threads = list(os.scandir(self.root))
        except FileNotFoundError:
            return 0
        for thread_entry in threads:
            try:
                runs = list(os.scandir(thread_entry.path))
            except OSError:
                continue
            for run_entry in runs:
                try:
                    if run_entry.name.startswith(_NEW) and now - run_entry.stat().st_mtime < _NEW_LIFETIME:
                        continue  # being made now (or left by a crash: swept an hour later)
                except FileNotFoundError:
                    continue
                if self._expired(Path(run_entry.path), now):
                    shutil.rmtree(run_entry.path, ignore_errors=True)
                    removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(thread_entry.path)  # only when empty
        return removed

    def _expired(self, directory: Path, now: float) -> bool:
        if writer_alive(directory):
            return False
        try:
            last = max(entry.stat().st_mtime for entry in os.scandir(directory))
        except (OSError, ValueError):  # gone meanwhile, or empty
            return True
        return now - last >= self.retention_seconds

    def _start_sweeper(self) -> None:
        with self._sweeper_lock:
            if self._sweeper is not None:
                return
            self._sweeper = threading.Thread(target=self._sweep_forever, name="journal-sweeper", daemon=True)
            self._sweeper.start()

    def _sweep_forever(self) -> None:
        interval = min(60.0, max(1.0, self.retention_seconds / 4))
        while True:
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweeper must outlive one bad directory
                log.exception("journal sweep failed")
            time.sleep(interval)


def writer_alive(directory: Path) -> bool:
    """Whether a process holds the run's directory lock (its run is live)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # releases a lock taken
    return False


def last_written_id(directory: Path, starts: list[int]) -> int | None:
    """The id of the last event in the run's journal (its newest segment read backwards)."""
    for first_id in reversed(starts):
        try:
            fd = os.open(directory / _segment_name(first_id), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            end = os.fstat(fd).st_size
            tail = b""
            while end > 0:
                start = max(0, end - _READ_SIZE)
                tail = os.pread(fd, end - start, start) + tail
                end = start
                at = tail.rfind(b"\n\nid: ")
                if at >= 0 or (end == 0 and tail.startswith(b"id: ")):
                    at = at + 2 if at >= 0 else 0
                    newline = tail.find(b"\n", at)
                    if newline > at:
                        return int(tail[at + 4 : newline])
        finally:
            os.close(fd)
        if first_id > 1:
            return first_id - 1
    return None


# ====================================================================== writing
class JournalWriter:
    """The run's side: append chunks, end, and see who is attached."""

    def __init__(self, directory: Path, buffer_bytes: int) -> None:
        self.directory = directory
        self._segment_limit = max(1, buffer_bytes // 4)
        self._buffer_bytes = buffer_bytes
        self._dir_fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._dir_fd, fcntl.LOCK_EX)
        self._own: tuple[int, Path] | None = join_readers(directory, fresh=True)  # the run's own client
        self._sizes: list[tuple[int, int]] = []  # (first id, bytes) per segment, oldest first
        self._fd: int | None = None
        self._open_segment(1)
        self._ended = False
        self._bell: journal_bell.Bell | None = None  # rung for followers here, once in place

    @classmethod
    def claim(cls, directory: Path, buffer_bytes: int, attempts: int = 20) -> JournalWriter | None:
        """Become the writer of a run whose writer is gone (``adoption``): the directory's
        lock taken without waiting (None while a live process holds it; a reader probing
        the lock for a moment is waited out), appends going on in its newest segment."""
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        for attempt in range(attempts):
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or attempt == attempts - 1:
                    os.close(dir_fd)
                    return None
                time.sleep(0.005)
        writer = cls.__new__(cls)
        writer.directory = directory
        writer._segment_limit = max(1, buffer_bytes // 4)
        writer._buffer_bytes = buffer_bytes
        writer._dir_fd = dir_fd
        writer._own = None  # an adopted run has no client of its own: its readers reattach
        writer._sizes = []
        for start in _segments(directory):
            with contextlib.suppress(FileNotFoundError):
                writer._sizes.append((start, (directory / _segment_name(start)).stat().st_size))
        writer._fd = None
        writer._ended = False
        writer._bell = journal_bell.hang(os.fspath(directory))
        if writer._sizes:
            path = directory / _segment_name(writer._sizes[-1][0])
            writer._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        else:
            writer._open_segment(1)
        with contextlib.suppress(OSError):
            os.unlink(directory / HANDED_OVER)
        return writer

    def note_pipeline(self, progress: dict[str, Any]) -> None:
        """Keep beside the events which pipeline envelopes they delivered (``pipeline.json``,
        replaced whole): an adopter asks the kernel's journal only for what follows."""
        temporary = self.directory / f".{PIPELINE_NOTE}"
        _write_private(temporary, json.dumps(progress).encode("utf-8"))
        os.replace(temporary, self.directory / PIPELINE_NOTE)

    def hand_over(self, when: float) -> None:
        """The process stops and leaves the run to the kernel: journal it, let go without an end."""
        mark_handed_over(self.directory, when)
        self.close()

    @property
    def holding(self) -> bool:
        """Whether this writer still holds its directory's lock (not closed, ended or handed over)."""
        return self._dir_fd is not None

    def moved_to(self, directory: Path) -> None:
        """The journal was renamed into place (``JournalStore.open_writer``)."""
        self.directory = directory
        if self._own is not None:
            fd, path = self._own
            self._own = (fd, directory / _READERS / path.name)
        self._bell = journal_bell.hang(os.fspath(directory))

    def _open_segment(self, first_id: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
        path = self.directory / _segment_name(first_id)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sizes.append((first_id, 0))

    def append(self, chunk: bytes, next_id: int) -> None:
        """Append one chunk of frames; ``next_id`` is the id after the chunk's last event.
        A chunk that would fill the current segment is split at frame boundaries, so that
        the buffer bound holds per event, however large one wake-up's chunk is: a segment
        takes frames while it holds less than its limit (the frame that reaches the limit
        included), the next frame starts a new segment. The cuts are found with ``find``
        and the pieces between them written whole (one write per segment, not per frame:
        a bulk wake-up carries thousands of events)."""
        if self._fd is None or self._ended:
            return
        first_id, size = self._sizes[-1]
        if size + len(chunk) < self._segment_limit:
            self._write(chunk)
            self._sizes[-1] = (first_id, size + len(chunk))
        else:
            self._append_split(chunk, next_id)
        if self._bell is not None:
            self._bell.ring()

    def _append_split(self, chunk: bytes, next_id: int) -> None:
        view = memoryview(chunk)
        frame_id = first_id_of(chunk, next_id)
        start = 0
        while start < len(chunk):
            first_id, size = self._sizes[-1]
            if size >= self._segment_limit:
                self._drop_old()
                self._open_segment(frame_id)
                first_id, size = frame_id, 0
            # the first frame end at least ``room`` bytes on (frames hold no blank line)
            room = self._segment_limit - size
            cut = chunk.find(b"\n\n", start + max(0, room - 2))
            end = len(chunk) if cut < 0 else cut + 2
            self._write(view[start:end])
            self._sizes[-1] = (first_id, size + end - start)
            frame_id += chunk.count(b"\n\n", start, end)
            start = end

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _drop_old(self) -> None:
        """Delete the oldest segments while they hold more than the buffer (the newest
        segment stays, even when one event alone is larger than the buffer)."""
        total = sum(size for _, size in self._sizes)
        while total > self._buffer_bytes and len(self._sizes) > 1:
            first_id, size = self._sizes.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / _segment_name(first_id))
            total -= size

    def end(self) -> None:
        """The run is over: mark the end and let go of the directory (idempotent)."""
        if self._ended:
            return
        self._ended = True
        try:
            if self._fd is not None:
                os.write(self._fd, END)
        finally:
            self.close()

    def close(self) -> None:
        """Stop writing (without an end mark if ``end`` was not called)."""
        self.client_left()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        bell, self._bell = self._bell, None
        if bell is not None:  # before the lock goes: the next holder's bell is its own
            journal_bell.take_down(os.fspath(self.directory), bell)
        dir_fd, self._dir_fd = self._dir_fd, None
        if dir_fd is not None:
            os.close(dir_fd)  # releases the directory lock

    def client_left(self) -> None:
        """The run's own client went away: it is no longer among the run's readers."""
        own, self._own = self._own, None
        leave_readers(own)

    def readers(self) -> int:
        """How many readers are attached now, in any process (the run's own client included)."""
        return count_readers(self.directory)

    def hear_readers(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (held weakly) when a reader in this process leaves."""
        if self._bell is not None:
            self._bell.hear_readers(wake)

    def readers_left(self) -> bool:
        """Whether a reader in this process left since the last call."""
        bell = self._bell
        if bell is None or not bell.readers_left:
            return False
        bell.readers_left = False
        return True


# ====================================================================== reading
class JournalReader:
    """Follows one run's journal from the event after ``after``; not thread-safe."""

    def __init__(self, directory: Path, after: int, starts: list[int]) -> None:
        self.directory = directory
        self.after = after
        self.last_id = after  # the last id sent to this reader (or skipped as already seen)
        candidates = [s for s in starts if s <= after + 1]
        if not candidates:
            raise ReplayUnavailable(after)
        self._start = candidates[-1]
        try:
            self._fd: int | None = os.open(directory / _segment_name(self._start), os.O_RDONLY)
        except FileNotFoundError:  # deleted since it was listed
            raise ReplayUnavailable(after) from None
        self._partial = b""
        self._held = b""  # frames read ahead by ``nothing_left``
        self.ended = False
        self.newest = 0  # the highest id the journal was seen to hold
        self._presence: tuple[int, Path] | None = None

    def attach(self) -> None:
        """Join the run's readers (no other reader ends: any number follow a run at once)."""
        if self._presence is None:
            self._presence = join_readers(self.directory)

    def detach(self) -> None:
        """Leave the run's readers (the last one out starts the run's grace period); a writer
        in this process is told at once (``journal_bell``)."""
        presence, self._presence = self._presence, None
        if presence is None:
            return
        leave_readers(presence)
        bell = journal_bell.of(os.fspath(self.directory))
        if bell is not None:
            bell.reader_left()

    def nothing_left(self) -> bool:
        """Whether the reader already has all of the run: it ended and no event follows
        ``after``, or its process died and the reader had the final event made up for that
        (``after`` past the journal's last id). Reads ahead (the next ``read`` returns it)."""
        data = self.read()
        self._held = data
        if data:
            return False
        if self.ended:
            return True
        return self.after > self.newest and not self.writer_alive()

    def writer_alive(self) -> bool:
        return writer_alive(self.directory)

    def read(self) -> bytes:
        """The complete frames appended since the last call, after ``last_id``; sets
        ``ended`` at the end mark. ReplayUnavailable if events fell out meanwhile."""
        out: list[bytes] = [self._held] if self._held else []
        self._held = b""
        while self._fd is not None and not self.ended:
            data = self._drain()
            if data:
                self._frames(data, out)
                continue
            # at the end of this segment: a newer one means this one is complete
            later = [s for s in _segments(self.directory) if s > self._start]
            if not later:
                break
            data = self._drain()  # what was appended before the writer moved on
            if data:
                self._frames(data, out)
            if later[0] > self.last_id + 1 and not self.ended:
                raise ReplayUnavailable(self.last_id)
            os.close(self._fd)
            self._fd = None
            self._partial = b""
            self._start = later[0]
            try:
                self._fd = os.open(self.directory / _segment_name(self._start), os.O_RDONLY)
            except FileNotFoundError:
                raise ReplayUnavailable(self.last_id) from None
        return b"".join(out)

    def _drain(self) -> bytes:
        assert self._fd is not None
        parts = []
        while True:
            data = os.read(self._fd, _READ_SIZE)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def _frames(self, data: bytes, out: list[bytes]) -> None:
        buffer = self._partial + data
        frames = buffer.split(b"\n\n")
        self._partial = frames.pop()
        for frame in frames:
            if frame.startswith(b"id: "):
                newline = frame.find(b"\n")
                frame_id = int(frame[4:newline])
                if frame_id > self.newest:
                    self.newest = frame_id
                if frame_id > self.last_id:
                    self.last_id = frame_id
                    out.append(frame + b"\n\n")
            elif frame + b"\n\n" == END:
                self.ended = True
                return

    def close(self) -> None:
        self.detach()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def sent_events(self) -> list[dict[str, Any]]:
        """The run's events this reader sent (the journal's complete frames up to
        ``last_id``, those still kept), parsed: what ``run.process_gone`` closes when the
        run's process died."""
        return scan_run(self.directory, up_to=self.last_id)[2]


class HangUp(Protocol):
    """The server's word on whether a follower's client hung up (``run.client_watch.ClientWatch``)."""

    pushed: bool  # the server tells (then it wakes the follower), else it is asked on ticks

    def hung_up(self, tick: float) -> bool: ...


def follow(
    reader: JournalReader,
    *,
    heartbeat_seconds: float,
    lost: Callable[[int], bytes] | None = None,
    poll_seconds: float | None = None,
    client: HangUp | None = None,
    wake: threading.Event | None = None,
    adopt: Callable[[], bool] | None = None,
) -> Iterator[bytes]:
    """The chunks a reattached client is sent: the journal after its id, then the run's
    new events as they come, a heartbeat while the run is silent, until the run's end, its
    client hanging up (``client``: the server tells, setting ``wake``, or is asked every
    ``CLIENT_CHECK_SECONDS``), or the run's process dying without an end: then ``adopt()``,
    when given, lets this process take the run over (or finds another did) and the reader
    goes on following; else ``lost(next id)``, a final event, if given. A reader so slow
    that the events it needs fell out of the journal meanwhile just ends: its client's next
    reattach is answered ``REPLAY_UNAVAILABLE``.

    While the run's writer is in this process, the follower waits for its bell
    (``journal_bell``) and reads as each chunk is appended; else it looks every
    ``poll_seconds`` (``POLL_SECONDS``), and every ``READER_REFRESH_SECONDS`` whether the
    writer is alive."""
    poll = POLL_SECONDS if poll_seconds is None else poll_seconds
    wake = threading.Event() if wake is None else wake
    directory = os.fspath(reader.directory)
    listening: journal_bell.Bell | None = None
    now = time.monotonic()
    last_write = next_refresh = now
    try:
        while True:
            bell = journal_bell.of(directory)
            if bell is not listening:
                if listening is not None:
                    listening.leave(wake)
                if bell is not None:
                    bell.listen(wake)
                listening = bell
            wake.clear()  # before the read: a ring after it wakes the wait below
            data = reader.read()
            now = time.monotonic()
            if data:
                last_write = now
                yield data
            if reader.ended:
                return
            if client is not None and client.hung_up(CLIENT_CHECK_SECONDS):
                return  # the client hung up: closing the response detaches the reader
            if bell is None and now >= next_refresh:
                next_refresh = now + READER_REFRESH_SECONDS
                if not data and not reader.writer_alive():
                    data = reader.read()  # the last appends before the process went
                    if data:
                        yield data
                    if reader.ended:
                        return
                    if adopt is not None and adopt():
                        continue  # a live writer again (this process, or another): follow it
                    if lost is not None:
                        yield lost(reader.last_id + 1)
                    return
            if not data:
                if now - last_write >= heartbeat_seconds:
                    last_write = now
                    yield HEARTBEAT
                if bell is None:
                    timeout = poll
                else:  # woken by the writer, or at the next heartbeat
                    timeout = max(0.001, last_write + heartbeat_seconds - now)
                if client is not None and not client.pushed:
                    timeout = min(timeout, CLIENT_CHECK_SECONDS)
                wake.wait(timeout)
    except ReplayUnavailable:
        log.info("a reattached reader fell behind the journal of %s", reader.directory.name)
    finally:
        if listening is not None:
            listening.leave(wake)
