"""The record log: a thread record's durable write as one in-place ``fdatasync``.

Why it exists: a record replaced durably the classic way (temporary file, ``fsync``,
rename, directory ``fsync``) costs two commits of the file system's journal, some 0.8 ms
on the way to every run's ``RUN_STARTED`` (a run is admitted with a durable write, and is
announced only once it is on disk). With the log, a durable save (``store.ThreadStore``)
writes the record's temporary file, appends the same bytes to this process's log, a file
filled with zeros ahead of need whose blocks exist already, ``fdatasync``s the log (data
only, no journal commit), then renames the temporary file into place unsynced (every process
reads it at once). What is announced is on disk either way; only where it is differs.
Concurrent saves share their syncs (group commit): a save appends under the log's lock and
syncs outside it, so that while one ``fdatasync`` is under way the others append, and the
next one covers them all (200 runs started at once wait for a few syncs, not 200 in turn).

Layout: ``<state-dir>/record-log/<pid>-<random>-<0|1>.log``, 0600 in a 0700 directory,
two files per process, each held with an exclusive ``flock`` for the process's life (so
that a file nobody holds is known to be a dead process's; a file is named ``*.log`` only once
it is locked, so that a file being made is never taken for one: a ``kill -9`` in that instant
leaves an empty ``*.log.making``, never read, and deleted by recovery once it is a minute old
and nobody holds it). One takes the appends; when it
is half full or its first entry is ``ROTATE_SECONDS`` old, the other takes over and the
log's thread checkpoints the first: every record it names is ``fsync``ed where it is now,
the threads directory is synced, and the file is reset (a new epoch in its header, so
that its entries no longer count). An entry is thus never older than about
``ROTATE_SECONDS`` while its process lives.

A file: a 16-byte header (``MAGIC``, then the epoch, 8 random bytes), then entries from
offset 16, each the epoch, the payload's length (4 bytes, little-endian), the CRC-32 of
epoch and payload (4 bytes), and the payload: the record's JSON exactly as written to its
file (it names its thread and carries its ``revision``, which every save increments). A
scan stops at the first entry that is not whole and of the file's epoch (a torn append,
the zeros past the end, or a previous epoch's leftovers).

Recovery (``ThreadStore.recover``), before anything reads the records (``cli.build_app``)
and before each retention pass: every log file whose lock can be taken (its process died)
is read, and for each thread its newest entry is written back the classic durable way when
the record on disk is missing, unreadable or of a lower revision; then the file is deleted.
After a ``kill -9`` the records in the page cache are as new as the log, so nothing is
written back; after a power cut, the entries bring back what the records lost. A thread
that retention deletes has been idle for days, far longer than an entry of a live log
lives, and the logs of dead processes are read before it deletes: a deleted thread does not
come back from a log.

What the log does not take, the store writes the classic way: the saves made while the
files are being made (on the log's thread, when the process starts), an entry over half a
file, one that finds both files full (the checkpoint behind), and every save once an append
or a checkpoint failed (the log turns itself off, with a warning). A forked child (gunicorn
``--preload``) makes files of its own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from agui_adapter.ops import start_gate

log = logging.getLogger("agui_adapter.state.record_log")

MAGIC = b"AGUIRLG1"
HEADER = struct.Struct("<8s8s")  # magic, epoch
ENTRY = struct.Struct("<8sII")  # epoch, payload length, crc32(epoch + payload)
#: Bytes of one log file (two per process), zero-filled when made.
FILE_BYTES = 512 * 1024
#: The oldest an entry gets before its file is checkpointed (while its process lives).
ROTATE_SECONDS = 10.0
DIRECTORY = "record-log"
#: The suffix a log file has while it is made, until it is locked (recovery reads ``*.log`` only).
MAKING = ".making"
#: How old a ``*.log.making`` nobody holds must be before recovery deletes it: its maker locks
#: it microseconds after creating it, so one this old and unlocked is a dead process's.
UNMADE_SECONDS = 60.0


def scan(data: bytes) -> Iterator[bytes]:
    """The payloads of a log file's entries of its current epoch, in order (sans-I/O)."""
    if len(data) < HEADER.size:
        return
    magic, epoch = HEADER.unpack_from(data)
    if magic != MAGIC:
        return
    offset = HEADER.size
    while offset + ENTRY.size <= len(data):
        entry_epoch, length, crc = ENTRY.unpack_from(data, offset)
        start = offset + ENTRY.size
        end = start + length
        if entry_epoch != epoch or length == 0 or end > len(data):
            return
        payload = data[start:end]
        if zlib.crc32(payload, zlib.crc32(epoch)) != crc:
            return
        yield payload
        offset = end


def frame(epoch: bytes, payload: bytes) -> bytes:
    """One entry, as appended (sans-I/O)."""
    return ENTRY.pack(epoch, len(payload), zlib.crc32(payload, zlib.crc32(epoch))) + payload


class _LogFile:
    """One of a process's two log files, held with its lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.epoch = b""
        self.offset = HEADER.size
        self.first_at: float | None = None  # when its first entry of the epoch was appended
        self.paths: set[str] = set()  # the records its entries are of
        self.writing = 0  # entries logged whose record file is not renamed into place yet
        # group commit (``RecordLog.append``): entries appended and synced, counted for ever
        self.appended = 0
        self.synced = 0
        self.sync_failed = False
        self.sync_lock = threading.Lock()  # one ``fdatasync`` at a time; the next covers all behind it
        # made under a name recovery does not read, and named ``*.log`` only once locked: else
        # another process's recovery could take the new file for a dead process's (no lock yet)
        # and delete it under its maker (``orphaned_entries``)
        making = path.with_name(path.name + MAKING)
        self.fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        named = making
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(making, path)
            named = path
            view = memoryview(bytes(FILE_BYTES))
            while view:
                view = view[os.write(self.fd, view) :]
            self.reset()  # synced with its size and blocks: appends then change data only
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(named)  # before the lock goes with the descriptor
            os.close(self.fd)
            raise
        # closed (its lock released) when the log is dropped; a dead process's file then
        self._closer = weakref.finalize(self, _close_quietly, self.fd)

    def reset(self) -> None:
        """A new epoch: the entries written so far no longer count."""
        self.epoch = os.urandom(8)
        os.pwrite(self.fd, HEADER.pack(MAGIC, self.epoch), 0)
        os.fdatasync(self.fd)
        self.offset = HEADER.size
        self.first_at = None
        self.paths = set()

    def close(self) -> None:
        self._closer()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class RecordLog:
    """This process's log for one threads directory (``store.ThreadStore.log``)."""

    def __init__(
        self,
        directory: Path,
        threads_dir: Path,
        *,
        sweep: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.threads_dir = threads_dir
        #: Called on the log's thread every ``ROTATE_SECONDS``: the dead processes' logs read
        #: (``ThreadStore.recover``), so that a gunicorn worker that died does not leave its files.
        self._sweep = sweep
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active: _LogFile | None = None
        self._standby: _LogFile | None = None  # clean, or being checkpointed (``_dirty``)
        self._dirty = False
        self._thread: threading.Thread | None = None
        self._off = False
        #: ``<pid>-<random>``, the name of this process's files once made (None before, and in a
        #: forked child until it makes its own): the process's spare record files are named
        #: after it (``recycled``), so that they are known as a dead process's with its log.
        self.stem: str | None = None
        _LOGS.add(self)

    def _forget_files(self) -> None:
        """In a forked child (gunicorn ``--preload``): the parent's files and thread are not
        its own; it makes its files on its first append."""
        for held in (self._active, self._standby):
            if held is not None:
                held.close()  # the parent's descriptions, and their locks, stay the parent's
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active = self._standby = None
        self._dirty = False
        self._thread = None
        self.stem = None

    @property
    def ready(self) -> bool:
        """Whether appends go to the log now (its files are made and it is not off)."""
        with self._lock:
            return self._active is not None and not self._off

    def start(self) -> None:
        """Have the files made now, on the log's thread (else the first ``append`` does)."""
        with self._lock:
            self._start()

    def _start(self) -> None:  # holding the lock
        if self._thread is None and not self._off:
            self._thread = threading.Thread(target=_work, args=(weakref.ref(self),), name="record-log", daemon=True)
            self._thread.start()

    # --- the store's side -----------------------------------------------------------
    def append(self, payload: bytes, record_path: str | Path) -> _LogFile | None:
        """Log ``payload``, the record about to be renamed into ``record_path``, and sync it;
        None when the log does not take it (the store writes the record the classic way).
        The caller writes the record file and then calls ``written`` with what this returned,
        whether the write succeeded or not. The first call has the files made on the log's
        thread."""
        with self._lock:
            active = self._active
            if active is None or self._off:
                self._start()
                return None
            size = ENTRY.size + len(payload)
            if size > FILE_BYTES // 2:
                return None
            if active.offset + size > FILE_BYTES:
                if self._dirty:
                    return None  # both files are full: the checkpoint is behind
                active = self._rotate()
            entry = frame(active.epoch, payload)
            try:
                os.pwrite(active.fd, entry, active.offset)
            except OSError as exc:
                self._fail(exc)
                return None
            active.offset += len(entry)
            active.paths.add(str(record_path))
            active.writing += 1
            active.appended += 1
            mine = active.appended
            if active.first_at is None:
                active.first_at = self._clock()
            if active.offset > FILE_BYTES // 2 and not self._dirty:
                self._rotate()
        if self._sync(active, mine):
            return active
        self.written(active)
        return None

    def _sync(self, active: _LogFile, mine: int) -> bool:
        """Whether the entry ``mine`` of ``active`` is on disk: synced here, or by a sync of
        another thread that began after it was appended (group commit: the saves of
        concurrent runs share one ``fdatasync``, not one each in turn). Not held under the
        log's lock, so that appends go on meanwhile; the file cannot be reset meanwhile
        (``writing`` counts this entry). After a failed sync nothing it may have covered is
        trusted (a second ``fdatasync`` can succeed on pages the first lost)."""
        if active.sync_lock.acquire(blocking=False):
            try:
                return self._synced(active, mine)
            finally:
                active.sync_lock.release()
        # another save's sync is under way: while this one waits for it (and maybe syncs after
        # it), the next run's start goes on, and its save shares the next sync
        with start_gate.waiting(), active.sync_lock:
            return self._synced(active, mine)

    def _synced(self, active: _LogFile, mine: int) -> bool:  # holding ``active.sync_lock``
        if active.synced >= mine:
            return True
        if active.sync_failed:
            return False
        with self._lock:
            covered = active.appended
        try:
            os.fdatasync(active.fd)
        except OSError as exc:
            active.sync_failed = True
            with self._lock:
                self._fail(exc)
            return False
        active.synced = covered
        return True

    def _fail(self, exc: OSError) -> None:  # holding the lock
        self._off = True
        log.warning("the record log failed (%s): thread records are written the classic way", exc)

    def written(self, ticket: _LogFile) -> None:
        """The record file an ``append`` was for is written (or failed): its log file may be
        checkpointed now. The log's thread is woken only when it waits for that: the standby
        file, due for its checkpoint (``_step``); not after every durable save."""
        with self._lock:
            ticket.writing -= 1
            if ticket.writing == 0 and self._dirty and ticket is self._standby:
                self._wake.notify_all()

    def _rotate(self) -> _LogFile:  # holding the lock, the standby clean
        assert self._active is not None and self._standby is not None
        self._active, self._standby = self._standby, self._active
        self._dirty = True
        self._wake.notify_all()
        return self._active

    # --- the log's thread (``_work``) ---------------------------------------------------
    def _step(self, swept: float) -> float | None:
        """One turn of the log's thread: rotate an old file, checkpoint the standby when it
        is due, sweep when ``swept`` is ``ROTATE_SECONDS`` old; when it swept last, or None
        when the log is off."""
        old = None
        with self._lock:
            active = self._active
            assert active is not None
            if not self._dirty:
                if active.first_at is not None and self._clock() - active.first_at >= ROTATE_SECONDS:
                    self._rotate()
                else:
                    self._wake.wait(ROTATE_SECONDS / 2)
            if self._dirty:
                old = self._standby
                assert old is not None
                while old.writing:  # its entries' records are being written: after them
                    self._wake.wait()
        if old is not None:
            try:
                self._checkpoint(old)
            except OSError as exc:
                log.warning("the record log could not be checkpointed (%s): classic writes from now on", exc)
                with self._lock:
                    self._off = True
                return None
            with self._lock:
                self._dirty = False
        if self._sweep is not None and self._clock() - swept >= ROTATE_SECONDS:
            swept = self._clock()
            self._sweep()
        return swept

    def _make_files(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        stem = f"{os.getpid()}-{os.urandom(6).hex()}"
        first = _LogFile(self.directory / f"{stem}-0.log")
        try:
            second = _LogFile(self.directory / f"{stem}-1.log")
        except BaseException:
            os.unlink(first.path)  # while its lock is held: nobody takes it for a dead process's
            first.close()
            raise
        _sync_directory(self.directory)
        _sync_directory(self.directory.parent)  # the log's directory, made just now maybe
        with self._lock:
            self._active, self._standby = first, second
            self.stem = stem

    def _checkpoint(self, old: _LogFile) -> None:
        """Make durable where they are now the records ``old`` names, then reset it."""
        for name in sorted(old.paths):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:  # deleted since (retention)
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if old.paths:
            _sync_directory(self.threads_dir)
        old.reset()


def _work(ref: weakref.ReferenceType[RecordLog]) -> None:
    """The log's thread: its files made, then turn after turn (``RecordLog._step``). It holds
    the log only during a turn, and ends once nobody else holds it (an app built and dropped,
    in tests or in an embedding process), its files then closed (``_LogFile`` finalizer)."""
    the_log = ref()
    if the_log is None:
        return
    try:
        the_log._make_files()
    except OSError as exc:
        log.warning("could not make the record log (%s): thread records are written the classic way", exc)
        with the_log._lock:
            the_log._off = True
        return
    swept: float | None = the_log._clock()
    del the_log
    while swept is not None:
        the_log = ref()
        if the_log is None:
            return
        swept = the_log._step(swept)
        del the_log


_LOGS: weakref.WeakSet[RecordLog] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for each in list(_LOGS):
        each._forget_files()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unheld(directory: Path, suffix: str) -> Iterator[tuple[Path, int]]:
    """Each file of ``directory`` named ``*<suffix>`` that no process holds, with its fd,
    locked by us while the caller handles it (recovery); one deleted meanwhile by another
    process's recovery is skipped."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(suffix):
            continue
        path = directory / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue  # a live process's
                raise
            if _still_named(fd, path):
                yield path, fd
        finally:
            os.close(fd)


def orphaned_entries(directory: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """Each log file of a dead process (its lock free) and its entries, held while the caller
    handles them; the file is deleted once the caller is done with it (recovery)."""
    for path, fd in _unheld(directory, ".log"):
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read()
        yield path, list(scan(data))
        os.unlink(path)


def remove_unmade(directory: Path, now: float | None = None) -> int:
    """Delete the ``*.log.making`` files a process killed while making its log left behind
    (none holds entries: a file is renamed ``*.log`` before its first byte is written); how
    many. Only a file nobody holds that is ``UNMADE_SECONDS`` old goes: a younger unlocked
    one may be in the instant between its creation and its maker's lock."""
    now = time.time() if now is None else now
    removed = 0
    for path, fd in _unheld(directory, ".log" + MAKING):
        if now - os.fstat(fd).st_mtime >= UNMADE_SECONDS:
            os.unlink(path)
            removed += 1
    return removed


def _still_named(fd: int, path: Path) -> bool:
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)


def file_stem(path: Path) -> str:
    """The ``<pid>-<random>`` a log file is named after (``RecordLog.stem``)."""
    return path.name.rsplit("-", 1)[0]


def entry_thread(payload: bytes) -> tuple[str, int] | None:
    """The thread id and revision an entry is of; None for an entry that is not a record."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("threadId"), str) or not data["threadId"]:
        return None
    revision = data.get("revision", 0)
    return data["threadId"], revision if isinstance(revision, int) else 0
