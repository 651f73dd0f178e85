"""Durable per-thread state: one small JSON file per AG-UI thread.

``<state-dir>/threads/<key>.json`` holds the thread's ``ThreadRecord`` (see ``record``).
Files are read lazily, on the first request that names the thread, and replaced
atomically (temp file, fsync, rename, directory fsync); they are 0600 in 0700
directories and never hold a secret.

Two kinds of lock, both OS file locks so that they hold across processes sharing
the directory (gunicorn workers) and vanish with a crashed process:

* ``<key>.lock`` is held briefly around each read-modify-write of the record;
* ``<key>.run`` is held for the whole life of the thread's active run, so "one
  active run per thread" holds everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

from .record import Execution, Mutation, RecordError, StaleExecution, ThreadRecord

__all__ = [
    "Execution",
    "RunLock",
    "StaleExecution",
    "StoreError",
    "ThreadRecord",
    "ThreadStore",
    "thread_key",
]

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


class RunLock:
    """The OS lock that makes a run the thread's only active one."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


class ThreadStore:
    """Reads and writes thread records under ``<root>/threads``."""

    _STRIPES = 64

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.threads_dir = self.root / "threads"
        self._stripes = [threading.Lock() for _ in range(self._STRIPES)]
        self._ready = False

    def _ensure_dirs(self) -> None:
        if self._ready:
            return
        try:
            for directory in (self.root, self.threads_dir):
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(directory, 0o700)
        except OSError as exc:
            raise StoreError(f"cannot create the state directory: {exc.strerror}") from exc
        self._ready = True

    def path_for(self, thread_id: str) -> Path:
        return self.threads_dir / f"{thread_key(thread_id)}.json"

    def _open_lock_file(self, thread_id: str, suffix: str) -> int:
        self._ensure_dirs()
        path = self.threads_dir / f"{thread_key(thread_id)}{suffix}"
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open a lock file: {exc.strerror}") from exc

    # --- locks ------------------------------------------------------------------------
    def try_lock_run(self, thread_id: str) -> RunLock | None:
        """The thread's run lock, or None when another run (any process) holds it."""
        fd = self._open_lock_file(thread_id, ".run")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise StoreError(f"cannot lock the thread: {exc.strerror}") from exc
        return RunLock(fd)

    @contextlib.contextmanager
    def locked(self, thread_id: str) -> Iterator[None]:
        """Exclusive access to the thread's record, across threads and processes."""
        stripe = self._stripes[zlib.crc32(thread_id.encode("utf-8")) % self._STRIPES]
        with stripe:
            fd = self._open_lock_file(thread_id, ".lock")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    # --- records ----------------------------------------------------------------------
    def load(self, thread_id: str) -> ThreadRecord | None:
        path = self.path_for(thread_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the thread state: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise StoreError(f"cannot read the thread state: {exc.strerror}") from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise StoreError("the thread state is not valid JSON") from exc
        try:
            return ThreadRecord.from_json(data, thread_id)
        except RecordError as exc:
            raise StoreError(str(exc)) from exc

    def save(self, record: ThreadRecord) -> None:
        self._ensure_dirs()
        path = self.path_for(record.thread_id)
        payload = (
            json.dumps(record.to_json(), ensure_ascii=False, sort_keys=True, indent=1, allow_nan=False).encode("utf-8")
            + b"\n"
        )
        tmp_name = None
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.threads_dir)
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp_name, 0o600)
            os.replace(tmp_name, path)
            tmp_name = None
            dir_fd = os.open(self.threads_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise StoreError(f"cannot write the thread state: {exc.strerror}") from exc
        finally:
            if tmp_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)

    def update(self, thread_id: str, mutation: Mutation) -> ThreadRecord | None:
        """Read-modify-write under the record lock; None when the thread is unknown.

        ``StaleExecution`` from the mutation propagates, and nothing is written."""
        with self.locked(thread_id):
            record = self.load(thread_id)
            if record is None:
                return None
            mutation.apply(record)
            self.save(record)
            return record
