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
* ``attach``: the reader generation and whether that reader is attached, rewritten in place
  under an OS lock; the attached reader refreshes its mtime every second. A new reader
  takes the next generation, and the older one (the run's own first client included)
  ends its response: one attached reader per run.
* The writer holds an OS lock on the run's directory for the run's life: a directory
  without an end and without a holder is a run whose process died.

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

from . import events as ev
from .events import HEARTBEAT, Event
from .store import thread_key

log = logging.getLogger("agui_adapter.journal")

END = b": end\n\n"
_SEGMENT_SUFFIX = ".sse"
_ATTACH = "attach"
_NEW, _NEW_LIFETIME = ".new-", 3600.0
_ATTACHED, _DETACHED = "attached", "detached"
#: An attached reader refreshes the attach file this often; one silent for STALE_READER is gone.
READER_REFRESH_SECONDS = 1.0
STALE_READER_SECONDS = 5.0
#: How often a reader looks for new events (readers poll: the writer may be another process).
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


# ====================================================================== attachment
def _read_attach(directory: Path) -> tuple[int, str, float]:
    """(generation, state, mtime) of the run's attach file; (0, detached, 0) if unreadable."""
    try:
        fd = os.open(directory / _ATTACH, os.O_RDONLY)
    except OSError:
        return 0, _DETACHED, 0.0
    try:
        text = os.read(fd, 64).decode("ascii", "replace").split()
        mtime = os.fstat(fd).st_mtime
    except OSError:
        return 0, _DETACHED, 0.0
    finally:
        os.close(fd)
    if len(text) != 2 or not text[0].isdigit():
        return 0, _DETACHED, 0.0
    return int(text[0]), text[1], mtime


def _write_attach(directory: Path, change: object) -> int:
    """Rewrite the attach file under its lock: ``change`` is "take" (the next generation,
    attached) or a generation to mark detached if it is still the current one."""
    fd = os.open(directory / _ATTACH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 64, 0).decode("ascii", "replace").split()
        generation = int(text[0]) if len(text) == 2 and text[0].isdigit() else 0
        if change == "take":
            generation, state = generation + 1, _ATTACHED
        elif change == generation:
            state = _DETACHED
        else:
            return generation
        os.pwrite(fd, f"{generation:012d} {state:<8}\n".encode("ascii"), 0)
        return generation
    finally:
        os.close(fd)  # releases the lock


# ====================================================================== the store
class JournalStore:
    """Where the journals of one state directory live; one per process."""

    def __init__(self, state_dir: Path, *, retention_seconds: float, buffer_bytes: int) -> None:
        self.root = Path(state_dir) / "journal"
        self.retention_seconds = retention_seconds
        self.buffer_bytes = buffer_bytes
        self._sweeper: threading.Thread | None = None
        self._sweeper_lock = threading.Lock()

    def run_dir(self, thread_id: str, run_id: str) -> Path:
        return self.root / thread_key(thread_id) / thread_key(run_id)

    def open_writer(self, thread_id: str, run_id: str) -> JournalWriter:
        """The journal of a run that starts now (OSError when the disk refuses).

        It is made under a temporary name and renamed into place once its writer holds it,
        so that a sweeper (of any process) never takes a new journal for a dead one."""
        self._start_sweeper()
        directory = self.run_dir(thread_id, run_id)
        if directory.exists():  # a run id journaled before (retention kept it): start afresh
            shutil.rmtree(directory, ignore_errors=True)
        for attempt in range(3):
            try:
                directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.root, 0o700)
                fresh = Path(tempfile.mkdtemp(prefix=_NEW, dir=directory.parent))
                writer = JournalWriter(fresh, self.buffer_bytes)
                os.rename(fresh, directory)
            except FileNotFoundError:  # a sweeper removed the empty thread directory meanwhile
                if attempt == 2:
                    raise
                continue
            writer.directory = directory
            return writer
        raise AssertionError("unreachable")

    def open_reader(self, thread_id: str, run_id: str, after: int) -> JournalReader:
        """A reader of the run's events after id ``after`` (RunNotFound, ReplayUnavailable)."""
        directory = self.run_dir(thread_id, run_id)
        starts = _segments(directory)
        if not starts:
            raise RunNotFound(run_id)
        return JournalReader(directory, after, starts)

    def progress(self, thread_id: str, run_id: str) -> tuple[bool, int | None, bool] | None:
        """What ``GET /threads/{threadId}`` says of a run from its journal, whichever process
        runs it: (whether its writer is alive, the last event id written, whether a client
        is attached); None without a journal."""
        directory = self.run_dir(thread_id, run_id)
        starts = _segments(directory)
        if not starts:
            return None
        return writer_alive(directory), last_written_id(directory, starts), client_attached(directory)

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


def client_attached(directory: Path) -> bool:
    """Whether a client reads the run now: its own (until it leaves) or a reattached
    reader that refreshed the attach file recently."""
    generation, state, mtime = _read_attach(directory)
    if state != _ATTACHED:
        return False
    return generation <= 1 or time.time() - mtime < STALE_READER_SECONDS


# ====================================================================== writing
class JournalWriter:
    """The run's side: append chunks, end, and see who is attached."""

    def __init__(self, directory: Path, buffer_bytes: int) -> None:
        self.directory = directory
        self._segment_limit = max(1, buffer_bytes // 4)
        self._buffer_bytes = buffer_bytes
        self._dir_fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._dir_fd, fcntl.LOCK_EX)
        _write_attach(directory, "take")  # generation 1: the run's own client
        self._sizes: list[tuple[int, int]] = []  # (first id, bytes) per segment, oldest first
        self._fd: int | None = None
        self._open_segment(1)
        self._ended = False

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
            return
        view = memoryview(chunk)
        frame_id = next_id - chunk.count(b"\n\n")  # the id of the chunk's first frame
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
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        dir_fd, self._dir_fd = self._dir_fd, None
        if dir_fd is not None:
            os.close(dir_fd)  # releases the directory lock

    def taken_over(self) -> bool:
        """Whether a reader reattached since the run's own client started (generation 1)."""
        return _read_attach(self.directory)[0] > 1

    def client_left(self) -> None:
        """The run's own client went away (unless a reader took over already)."""
        _write_attach(self.directory, 1)

    def reader_attached(self) -> bool:
        """Whether a reattached reader is there now (attached, and alive recently)."""
        generation, state, mtime = _read_attach(self.directory)
        return generation > 1 and state == _ATTACHED and time.time() - mtime < STALE_READER_SECONDS


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
        self.ended = False
        self.generation = 0

    def attach(self) -> None:
        """Take the run over: older readers (its own first client included) end."""
        self.generation = _write_attach(self.directory, "take")

    def still_attached(self) -> bool:
        return _read_attach(self.directory)[0] == self.generation

    def refresh(self) -> None:
        """Tell the run's writer this reader is alive (the attach file's mtime)."""
        with contextlib.suppress(OSError):
            os.utime(self.directory / _ATTACH)

    def detach(self) -> None:
        with contextlib.suppress(OSError):
            _write_attach(self.directory, self.generation)

    def writer_alive(self) -> bool:
        return writer_alive(self.directory)

    def read(self) -> bytes:
        """The complete frames appended since the last call, after ``last_id``; sets
        ``ended`` at the end mark. ReplayUnavailable if events fell out meanwhile."""
        out: list[bytes] = []
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
                if frame_id > self.last_id:
                    self.last_id = frame_id
                    out.append(frame + b"\n\n")
            elif frame + b"\n\n" == END:
                self.ended = True
                return

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def closing_events(self, ts: int) -> list[Event]:
        """The END events of the spans the journal left open (text, tool calls, reasoning,
        steps), in the order the run's translator closes them: what a run whose process died
        mid-span needs before its final ``RUN_ERROR`` to stay a valid run. Only the complete
        frames up to ``last_id`` count (those the reader sent); a span opened in events that
        fell out of the buffer is not known."""
        text: dict[str, None] = {}
        tools: dict[str, None] = {}
        reasoning: dict[str, None] = {}
        reasoning_messages: dict[str, None] = {}
        steps: dict[str, None] = {}
        opens = {
            "TEXT_MESSAGE_START": (text, "messageId"),
            "TOOL_CALL_START": (tools, "toolCallId"),
            "REASONING_START": (reasoning, "messageId"),
            "REASONING_MESSAGE_START": (reasoning_messages, "messageId"),
            "STEP_STARTED": (steps, "stepName"),
        }
        closes = {
            "TEXT_MESSAGE_END": (text, "messageId"),
            "TOOL_CALL_END": (tools, "toolCallId"),
            "REASONING_END": (reasoning, "messageId"),
            "REASONING_MESSAGE_END": (reasoning_messages, "messageId"),
            "STEP_FINISHED": (steps, "stepName"),
        }
        for start in _segments(self.directory):
            try:
                data = (self.directory / _segment_name(start)).read_bytes()
            except FileNotFoundError:
                continue
            for frame in data.split(b"\n\n")[:-1]:
                if not frame.startswith(b"id: "):
                    continue
                head, _, body = frame.partition(b"\ndata: ")
                if int(head[4:]) > self.last_id:
                    break
                try:
                    event = json.loads(body)
                except ValueError:
                    continue
                kind = event.get("type")
                if kind in opens:
                    spans, key = opens[kind]
                    spans[str(event.get(key))] = None
                elif kind in closes:
                    spans, key = closes[kind]
                    spans.pop(str(event.get(key)), None)
        out: list[Event] = []
        for rid in sorted(reasoning_messages.keys() | reasoning.keys()):
            if rid in reasoning_messages:
                out.append(ev.reasoning_message_end(ts, rid))
            if rid in reasoning:
                out.append(ev.reasoning_end(ts, rid))
        out += [ev.tool_end(ts, tool_id) for tool_id in sorted(tools)]
        out += [ev.text_end(ts, message_id) for message_id in sorted(text)]
        out += [ev.step_finished(ts, name) for name in sorted(steps)]
        return out


def follow(
    reader: JournalReader,
    *,
    heartbeat_seconds: float,
    lost: Callable[[int], bytes] | None = None,
    poll_seconds: float = POLL_SECONDS,
) -> Iterator[bytes]:
    """The chunks a reattached client is sent: the journal after its id, then the run's
    new events as they come (one chunk per poll that found some), a heartbeat while the
    run is silent, until the run's end, a newer reader taking over, or the run's process
    dying without an end (then ``lost(next id)``, a final event, if given). A reader so
    slow that the events it needs fell out of the journal meanwhile just ends: its client's
    next reattach is answered ``REPLAY_UNAVAILABLE``."""
    now = time.monotonic()
    last_write = next_refresh = now
    try:
        while True:
            data = reader.read()
            now = time.monotonic()
            if data:
                last_write = now
                yield data
            if reader.ended:
                return
            if now >= next_refresh:
                next_refresh = now + READER_REFRESH_SECONDS
                if not reader.still_attached():
                    return  # a newer reader took over
                reader.refresh()
                if not data and not reader.writer_alive():
                    data = reader.read()  # the last appends before the process went
                    if data:
                        yield data
                    if not reader.ended and lost is not None:
                        yield lost(reader.last_id + 1)
                    return
            if not data:
                if now - last_write >= heartbeat_seconds:
                    last_write = now
                    yield HEARTBEAT
                time.sleep(poll_seconds)
    except ReplayUnavailable:
        log.info("a reattached reader fell behind the journal of %s", reader.directory.name)
