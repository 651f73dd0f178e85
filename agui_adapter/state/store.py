"""Durable per-thread state: one small JSON file per AG-UI thread.

``<state-dir>/threads/<key>.json`` holds the thread's ``ThreadRecord`` (see ``record``).
Files are read lazily, on the first request that names the thread, and replaced
atomically (temp file, rename); they are 0600 in 0700 directories and never hold a secret.
Under the record's lock, the temp file is one of the process's spare record files, the
records earlier saves replaced, kept under a second name (``recycled``): no inode is made or
freed per save, and a read that catches a recycled file reads again.
A durable save is on disk when it returns: the classic way (the temp file fsynced before
the rename, the directory after it), or, once ``use_log`` gave the store this process's
``record_log``, by the same bytes appended to that log and synced there (one in-place
``fdatasync`` instead of two commits of the file system's journal). ``recover`` writes
back, the classic way, what a dead process's log holds and its records lost.

Each thread has two OS locks (``thread_locks``), which hold across processes sharing the
directory (gunicorn workers) and vanish with a crashed process: the record lock, held
briefly around each read-modify-write of the record, and the run lock, held for the whole
life of the thread's active run, so that "one active run per thread" holds everywhere.

Each successful write's duration is handed to ``on_write`` when one is set (the state-write
latency of ``/metrics`` and, with tracing, a span): the writes dominate a run's time to its
first event, so operators see them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agui_adapter.state import placement, record_log, recycled, thread_locks
from agui_adapter.state.record import Execution, Mutation, RecordError, StaleExecution, ThreadRecord
from agui_adapter.state.record_log import RecordLog

__all__ = [
    "Execution",
    "RunLock",
    "StaleExecution",
    "StoreError",
    "ThreadRecord",
    "ThreadStore",
    "thread_key",
]

log = logging.getLogger("agui_adapter.state.store")

#: The temporary files' random names: a generator of the store's own, so that saving a record
#: draws nothing from the process's ``random`` (an embedding application's seeded sequence, or
#: a test framework watching it, would see its state move); reseeded in a forked child, so that
#: forked workers do not all pick the same names.
_TEMP_NAMES = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _TEMP_NAMES.seed(os.urandom(32)))
_SAFE_KEY = re.compile(r"^[a-z0-9_.-]{1,100}$")
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


class StoreError(Exception):
    """The thread state could not be read or written."""


def thread_key(thread_id: str) -> str:
    """A file stem for a threadId that cannot name a path outside the directory."""
    if not thread_id:
        raise StoreError("empty thread id")
    if _SAFE_KEY.match(thread_id) and thread_id not in (".", "..") and not thread_id.endswith("."):
        base = thread_id.rstrip(".").split(".")[0].upper()
        if base not in _RESERVED:
            return thread_id
    hex_id = thread_id.encode("utf-8").hex()
    if len(hex_id) <= 200:
        return f"aguiid~{hex_id}"
    return "aguihash~" + hashlib.sha256(thread_id.encode("utf-8")).hexdigest()


def _read_all(fd: int) -> bytes:
    """All of the regular file open as ``fd``, from its start: one ``read`` of its size and
    one byte more, so that a read that comes back short says the end was reached (a regular
    file's read is short only there); a file that grew meanwhile is read on to its end."""
    size = os.fstat(fd).st_size
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    parts = [data]
    while True:
        more = os.read(fd, 65536)
        if not more:
            return b"".join(parts)
        parts.append(more)


def _umask_keeps_owner_bits() -> bool:
    """Whether this process's umask leaves the owner's read and write bits of a new file
    alone, so that a file created with mode 0600 is 0600 without an ``fchmod``; read from
    ``/proc/self/status`` (the umask cannot be read elsewhere without setting it, which
    other threads would see); False when it cannot be read, and then every new record
    file is ``fchmod``-ed as before."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o600 == 0
    except (OSError, ValueError, IndexError):
        pass
    return False


class RunLock:
    """One of a thread's OS locks, held until ``release``; its run lock is what makes a run
    the thread's only active one."""

    def __init__(self, fd: int, locks: thread_locks.ThreadLocks) -> None:
        self._fd: int | None = fd
        self._locks = locks

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._locks.release(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


class ThreadStore:
    """Reads and writes thread records under ``<root>/threads``."""

    _STRIPES = 64
    #: Reads of a record before it is called unreadable (``load``).
    _READS = 5

    def __init__(
        self, root: Path, *, locks: Callable[[str], thread_locks.ThreadLocks] = thread_locks.for_directory
    ) -> None:
        """``locks`` makes the threads' locks once the directory exists; all processes sharing
        it must use the same kind (the default picks by platform; tests pick one)."""
        self.root = Path(root)
        self.threads_dir = self.root / "threads"
        # the files' names are strings made by concatenation: a record's read-modify-write
        # names its lock, record and temporary files, and ``pathlib`` spent some 40 us of
        # its 230 us making and printing ``Path`` objects
        self._prefix = f"{self.threads_dir}{os.sep}"
        self._stripes = [threading.Lock() for _ in range(self._STRIPES)]
        self._ready = False
        self._make_locks = locks
        self._locks: thread_locks.ThreadLocks | None = None  # made with the directories
        #: Told how long each successful write took, and whether it was durable (metrics, tracing).
        self.on_write: Callable[[float, bool], None] | None = None
        #: This process's record log (``use_log``), None for the classic durable writes only.
        self.log: RecordLog | None = None
        #: Whether new files are 0600 as created (``_umask_keeps_owner_bits``): no ``fchmod``.
        self._umask_is_owner_rw = _umask_keeps_owner_bits()
        #: The spare record files saves write into (``recycled``), once the log has files.
        self._spares: recycled.Spares | None = None
        #: The record lock's key this thread holds (``_locked_key``): only a save under its
        #: record's lock recycles, so that no two saves link the same record as a spare.
        self._holding = threading.local()

    def use_log(self) -> None:
        """Make durable saves through a record log of this process (``record_log``), its files
        made now on a thread of its own; one store per process and state directory should,
        the one that serves the runs."""
        if self.log is None:
            # the root first, spread (``placement``) before the log's directory is made in it;
            # a root that cannot be made is the saves' error to report (STATE_UNAVAILABLE)
            with contextlib.suppress(StoreError):
                self._ensure_dirs()
            store = weakref.ref(self)  # the log's thread must not keep a dropped store alive

            def sweep() -> None:
                alive = store()
                if alive is not None:
                    alive._recover_quietly()

            self.log = RecordLog(self.root / record_log.DIRECTORY, self.threads_dir, sweep=sweep)
            self.log.start()

    def _recover_quietly(self) -> None:
        """``recover`` on the log's thread: a failure is told, and tried again next time."""
        try:
            self.recover()
        except StoreError as exc:
            log.warning("state: the record logs of dead processes could not be read: %s", exc)

    def recover(self) -> int:
        """Write back what the logs of dead processes hold and the records lost (a power cut
        after a durable save); how many records were written back. Each log is deleted once
        read, and so is a file a dead process left half made; a live process's are left alone."""
        restored = 0
        dead: set[str] = set()  # the stems of dead processes whose spares are deleted (two logs each)
        directory = self.root / record_log.DIRECTORY
        try:
            record_log.remove_unmade(directory)
            # each log is deleted when the next is asked for: once its records are written back
            for path, entries in record_log.orphaned_entries(directory):
                restored += self._write_back(entries)
                stem = record_log.file_stem(path)
                if stem not in dead:
                    dead.add(stem)
                    recycled.remove_spares(str(self.threads_dir), stem)
        except OSError as exc:
            raise StoreError(f"cannot read the record logs: {exc.strerror}") from exc
        if restored:
            log.warning("state: %d thread record(s) written back from a dead process's record log", restored)
        return restored

    def _write_back(self, entries: list[bytes]) -> int:
        """Each thread's newest entry to its file, the classic durable way, where the file is
        missing, unreadable or older; how many were written."""
        newest: dict[str, tuple[int, bytes]] = {}
        for payload in entries:
            named = record_log.entry_thread(payload)
            if named is not None and named[1] >= newest.get(named[0], (-1, b""))[0]:
                newest[named[0]] = (named[1], payload)
        written = 0
        for thread_id, (revision, payload) in newest.items():
            with self.locked(thread_id):
                try:
                    current = self.load(thread_id)
                except StoreError:
                    current = None  # unreadable: the log's copy is the one to keep
                if current is None or current.revision < revision:
                    self._ensure_dirs()
                    self._replace(self._record_file(thread_id), payload, sync=True)
                    written += 1
        return written

    def _ensure_dirs(self) -> None:
        if self._ready:
            return
        try:
            for directory in (self.root, self.threads_dir):
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(directory, 0o700)
                if directory is self.root:  # before the subdirectories are made
                    placement.spread(str(directory))
        except OSError as exc:
            raise StoreError(f"cannot create the state directory: {exc.strerror}") from exc
        self._locks = self._make_locks(str(self.threads_dir))
        self._ready = True

    def path_for(self, thread_id: str) -> Path:
        return Path(self._record_file(thread_id))

    def _record_file(self, thread_id: str) -> str:
        return self._prefix + thread_key(thread_id) + ".json"

    def _thread_file(self, key: str, suffix: str) -> str:
        return self._prefix + key + suffix

    def _acquire(self, key: str, which: int, *, blocking: bool) -> RunLock | None:
        """The thread's ``which`` lock, held; None when busy and not ``blocking``."""
        self._ensure_dirs()
        locks = self._locks
        assert locks is not None
        try:
            fd = locks.acquire(key, which, blocking=blocking)
        except thread_locks.LockError as exc:
            raise StoreError(exc.strerror) from exc
        return None if fd is None else RunLock(fd, locks)

    # --- locks ------------------------------------------------------------------------
    def try_lock_run(self, thread_id: str) -> RunLock | None:
        """The thread's run lock, or None when another run (any process) holds it."""
        return self._acquire(thread_key(thread_id), thread_locks.RUN, blocking=False)

    @contextlib.contextmanager
    def _locked_key(self, key: str) -> Iterator[None]:
        stripe = self._stripes[zlib.crc32(key.encode("utf-8")) % self._STRIPES]
        with stripe:
            held = self._acquire(key, thread_locks.RECORD, blocking=True)
            assert held is not None
            holding = self._holding
            outer = getattr(holding, "key", None)
            holding.key = key
            try:
                yield
            finally:
                holding.key = outer
                held.release()

    @contextlib.contextmanager
    def locked(self, thread_id: str) -> Iterator[None]:
        """Exclusive access to the thread's record, across threads and processes."""
        with self._locked_key(thread_key(thread_id)):
            yield

    # --- records ----------------------------------------------------------------------
    def load(self, thread_id: str) -> ThreadRecord | None:
        """The thread's record, None when it has none. A read that finds no whole record of
        the thread reads again, up to ``_READS`` reads: a file opened just before a save
        replaced it may be a recycled one (``recycled``), emptied or rewritten meanwhile
        (each read opens the file the name has then; only a reader held up for two saves of
        the thread, at each of its reads, finds none)."""
        path = self._record_file(thread_id)
        for left in range(self._READS - 1, -1, -1):
            try:
                data = self._read(path)
                return None if data is None else self._record(data, thread_id)
            except StoreError:
                if not left:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _record(data: Any, thread_id: str) -> ThreadRecord:
        try:
            return ThreadRecord.from_json(data, thread_id)
        except RecordError as exc:
            raise StoreError(str(exc)) from exc

    @staticmethod
    def _read(path: str) -> Any:
        """The parsed JSON at ``path``, or None when there is no such file.

        Read with ``os.read`` sized by ``fstat`` (open, fstat, read, close), not through a
        buffered file object, whose set-up costs five more system calls (``isatty``, two
        ``lseek``, a second ``fstat``, the read that finds the end): every write of a
        record reads it first, under its lock."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the thread state: {exc.strerror}") from exc
        try:
            raw = _read_all(fd)
        except OSError as exc:
            raise StoreError(f"cannot read the thread state: {exc.strerror}") from exc
        finally:
            os.close(fd)
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise StoreError("the thread state is not valid JSON") from exc

    def save(self, record: ThreadRecord, *, durable: bool = True) -> None:
        """Replace the record atomically, its ``revision`` one up; ``durable`` also has it on
        disk when this returns (it then survives a crash of the machine, not only of the
        process): through the record log when there is one and it takes the write (the
        entry synced once the temporary file is written, before the rename), else the
        classic way."""
        self._ensure_dirs()
        key = thread_key(record.thread_id)
        path = self._thread_file(key, ".json")
        record.revision += 1
        # compact: the indenting encoder is pure Python, and a record holds its last 50 runs
        payload = (
            json.dumps(
                record.to_json(), ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
            ).encode("utf-8")
            + b"\n"
        )
        started = time.perf_counter()
        the_log = self.log if durable else None
        spares = self._current_spares() if getattr(self._holding, "key", None) == key else None
        self._replace(path, payload, sync=durable, log=the_log, spares=spares)
        if self.on_write is not None:
            self.on_write(time.perf_counter() - started, durable)

    def _current_spares(self) -> recycled.Spares | None:
        """This process's spares, None until its record log has files (their stem)."""
        stem = None if self.log is None else self.log.stem
        if stem is None:
            return None
        spares = self._spares
        if spares is None or spares.stem != stem:  # the first, or a forked child's own
            spares = self._spares = recycled.Spares(self._prefix, stem)
        return spares

    def _replace(
        self,
        path: str,
        payload: bytes,
        *,
        sync: bool,
        log: RecordLog | None = None,
        spares: recycled.Spares | None = None,
    ) -> None:
        """``payload`` atomically at ``path`` (temp file, rename); ``sync``: on disk when this
        returns, in ``log`` when it takes the entry, else the classic way (the temp file
        fsynced before the rename, the directory after). Nothing is logged for a temp file
        that could not be written. With ``spares`` (the caller holds the record's lock), the
        temp file is a spare when there is one, and the record replaced becomes one."""
        tmp_made = False
        logged = None
        kept: str | None = None
        try:
            # a durable save writes over the spare's old record, its blocks kept (a power cut
            # before the record is synced in place finds it in the log, ``record_log``);
            # another empties it first, so that ext4 writes the new record out before the
            # rename, as it does for a new file renamed over an old one (``auto_da_alloc``)
            opened = self._open_spare(spares, empty=not sync)
            in_place = opened is not None and sync
            if opened is None:
                # a name no other writer picks (64 random bits; ``_TEMP_NAMES`` is reseeded in
                # a forked child, and O_EXCL refuses a name taken) without a ``getrandom`` call
                tmp_path = f"{self._prefix}.{os.path.basename(path)}.{_TEMP_NAMES.getrandbits(64):016x}.tmp"
                # mkstemp's job in one call: a random name, created exclusively
                fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            else:
                fd, tmp_path = opened
            tmp_made = True
            try:
                if not self._umask_is_owner_rw:
                    os.fchmod(fd, 0o600)  # whatever the umask
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                if in_place:
                    os.ftruncate(fd, len(payload))  # the end of a longer record it held
                if log is not None:
                    logged = log.append(payload, path)
                if sync and logged is None:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if spares is not None:
                kept = spares.name()
                try:
                    os.link(path, kept, follow_symlinks=False)
                except OSError:  # a new record (or no hard links here): nothing to keep
                    kept = None
            os.replace(tmp_path, path)
            tmp_made = False
            if kept is not None and spares.give(kept):  # type: ignore[union-attr]
                kept = None  # else deleted below, as a classic rename would have
            if sync and logged is None:
                self._sync_directory()
        except OSError as exc:
            raise StoreError(f"cannot write the thread state: {exc.strerror}") from exc
        finally:
            if logged is not None:
                log.written(logged)  # type: ignore[union-attr]
            for leftover in (tmp_path, kept) if tmp_made else (kept,):
                if leftover is not None:  # the record stays as it was; its second name goes
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)

    @staticmethod
    def _open_spare(spares: recycled.Spares | None, *, empty: bool) -> tuple[int, str] | None:
        """A spare open for writing (``empty``: truncated) and its name; None when there is none."""
        spare = None if spares is None else spares.take()
        if spare is None:
            return None
        try:
            flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if empty else 0)
            return os.open(spare, flags), spare
        except OSError:  # gone, or not a file of ours: dropped, and a file is made instead
            with contextlib.suppress(OSError):
                os.unlink(spare)
            return None

    def _sync_directory(self) -> None:
        """Make renames and deletions in the threads directory durable."""
        dir_fd = os.open(self.threads_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def update(self, thread_id: str, mutation: Mutation) -> ThreadRecord | None:
        """Read-modify-write under the record lock; None when the thread is unknown.

        ``StaleExecution`` from the mutation propagates, and nothing is written."""
        with self.locked(thread_id):
            record = self.load(thread_id)
            if record is None:
                return None
            mutation.apply(record)
            self.save(record, durable=mutation.durable)
            return record

    # --- listing and removal (retention) ----------------------------------------------
    #: A thread's files: its record, and the lock files of ``FileLocks`` (with ``RangeLocks``,
    #: those an older adapter left, listed and deleted by retention all the same).
    _SUFFIXES = (".json", *thread_locks.FileLocks.SUFFIXES)

    def thread_keys(self) -> list[str]:
        """The key (file stem) of every thread with a file in the directory, sorted."""
        try:
            names = os.listdir(self.threads_dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list the thread states: {exc.strerror}") from exc
        keys = {
            name[: -len(suffix)]
            for name in names
            if not name.startswith(".")
            for suffix in self._SUFFIXES
            if name.endswith(suffix)
        }
        return sorted(key for key in keys if key)

    def last_activity(self, key: str) -> float | None:
        """When the thread's files last changed (newest mtime, epoch seconds); None without files."""
        times = []
        for suffix in self._SUFFIXES:
            try:
                times.append(os.stat(self._thread_file(key, suffix), follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(f"cannot inspect the thread state: {exc.strerror}") from exc
        return max(times) if times else None

    def remove_if(self, key: str, remove: Callable[[ThreadRecord | None, float | None], bool]) -> bool:
        """Delete the thread's files when ``remove(record, last_activity)`` says so; True if deleted.

        Never while a run holds the thread (its run lock is tried, not waited for). The
        decision is taken, and the files deleted, holding both the run lock and the record
        lock, so that nobody reads or writes the record meanwhile and lock files are unlinked
        only by their holder (``thread_locks.FileLocks``). ``record`` is None when only lock
        files are left (a refused request leaves them with ``FileLocks``). Raises StoreError
        for an unreadable record.
        """
        run_lock = self._acquire(key, thread_locks.RUN, blocking=False)
        if run_lock is None:
            return False
        try:
            with self._locked_key(key):
                data = self._read(self._thread_file(key, ".json"))
                record = None
                if data is not None:
                    thread_id = data.get("threadId") if isinstance(data, dict) else None
                    if not isinstance(thread_id, str) or thread_key(thread_id) != key:
                        raise StoreError("state file belongs to another thread")
                    record = self._record(data, thread_id)
                if not remove(record, self.last_activity(key)):
                    return False
                try:
                    for suffix in self._SUFFIXES:  # the record first, the lock files (held) last
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._thread_file(key, suffix))
                    self._sync_directory()
                except OSError as exc:
                    raise StoreError(f"cannot delete the thread state: {exc.strerror}") from exc
                return True
        finally:
            run_lock.release()
