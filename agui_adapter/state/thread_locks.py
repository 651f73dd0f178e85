"""The two OS locks of each thread, across the threads and processes sharing a state dir.

A thread has a *record lock*, held briefly around each read-modify-write of its record,
and a *run lock*, held for the whole life of its active run, so that "one active run per
thread" holds everywhere. Both must hold across processes sharing the directory (gunicorn
workers) and across threads of one process, and vanish with a crashed process.

``RangeLocks``, where the OS has them (Linux 3.15 and later): open-file-description
(``F_OFD_SETLK``) locks on two bytes of one shared file, ``threads/.locks``, at an
offset drawn from the thread's key. Like ``flock`` they belong to the open file, not to
the process (each acquisition opens the file anew, so two threads of one process exclude
each other), and they go when the file is closed or the process dies. The file is made
once and never deleted; a thread's first run makes no file for its locks.

``FileLocks`` elsewhere: an ``flock`` on a file per lock, ``<key>.lock`` and ``<key>.run``,
made on first use. They may be deleted (retention, ``ThreadStore.remove_if``), and only by
a holder of the lock; a process that opened a lock file just before it was unlinked would
otherwise lock a dead inode while a newcomer locks the new file; so every acquisition
checks, once the lock is held, that the path still names the inode it locked (``fstat``
against ``stat``), and starts over when it does not.

Why ranges first: the two files a thread's first run made were 0.76 ms of the 2.1 ms it
took to reach ``RUN_STARTED`` (ext4 allocating two inodes, timed in the app over 300
sequential runs against the benchmark's fast kernel); opening the shared file, locking a
byte of it and letting go took 5.4 us (2,000 times on one thread), against 53 us when the
lock's file had to be made.
Two keys whose 62-bit digests are equal share their locks: while one runs, the other is
busy. A lock taken while 10,000 others are held shares its byte with one of them with odds
of about one in 4 x 10^14.

Every process sharing a directory picks the same kind, as they run on one kernel; an
older adapter (``FileLocks`` only) must not share a directory with this one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import struct
import sys
from typing import Final, Protocol

#: The two locks of a thread.
RECORD: Final = 0
RUN: Final = 1

#: The name of ``RangeLocks``' file in the threads directory (a dot: not a thread's file).
RANGES_FILE: Final = ".locks"

#: ``struct flock`` on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid, padded to 32 bytes.
_FLOCK: Final = "@hhqqi0q"
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class LockError(OSError):
    """A lock could not be taken for a reason other than being held (``strerror`` says why)."""


def _open_lock_file(path: str) -> int:
    """``path`` open for locking, made (0600) when missing."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LockError(exc.errno, f"cannot open a lock file: {exc.strerror}") from exc


class ThreadLocks(Protocol):
    """Takes a thread's locks; each held lock is an fd, released by ``release``."""

    def acquire(self, key: str, which: int, *, blocking: bool) -> int | None:
        """An fd holding the thread's ``which`` lock (``RECORD`` or ``RUN``); None when it is
        held elsewhere and not ``blocking``. Raises ``LockError``."""
        ...

    def release(self, fd: int) -> None:
        """Let go of a lock ``acquire`` returned, and close its fd."""
        ...


def ranges_supported() -> bool:
    """Whether this platform has open-file-description locks with the layout ``RangeLocks`` packs."""
    return sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLK") and struct.calcsize(_FLOCK) == 32


def for_directory(threads_dir: str) -> ThreadLocks:
    """The locks of the threads in ``threads_dir`` (which exists): ranges where the OS has
    them and the file system takes them, else files."""
    if ranges_supported():
        locks = RangeLocks(threads_dir)
        if locks.usable():
            return locks
    return FileLocks(threads_dir)


class RangeLocks:
    """Two bytes per thread of one shared file, locked with ``F_OFD_SETLK``."""

    def __init__(self, threads_dir: str) -> None:
        self.path = os.path.join(threads_dir, RANGES_FILE)

    def usable(self) -> bool:
        """Whether the file can be made and the file system takes such locks (a query, no lock)."""
        try:
            fd = _open_lock_file(self.path)
        except LockError:
            return False
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    @staticmethod
    def offset(key: str, which: int) -> int:
        """The byte of the thread's ``which`` lock: twice a 62-bit digest of its key, plus one for the run lock."""
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return (int.from_bytes(digest, "big") >> 2) * 2 + which

    def acquire(self, key: str, which: int, *, blocking: bool) -> int | None:
        fd = _open_lock_file(self.path)
        request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, self.offset(key, which), 1, 0)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK, request)
        except OSError as exc:
            os.close(fd)
            if not blocking and exc.errno in _BUSY:
                return None
            raise LockError(exc.errno, f"cannot lock the thread: {exc.strerror}") from exc
        return fd

    def release(self, fd: int) -> None:
        # closing alone would do, unless a forked child shares the open file: unlock it first
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))
        finally:
            os.close(fd)


class FileLocks:
    """An ``flock`` on a file per lock, ``<key>.lock`` and ``<key>.run``."""

    SUFFIXES: Final = (".lock", ".run")

    def __init__(self, threads_dir: str) -> None:
        self._prefix = f"{threads_dir}{os.sep}"

    def path(self, key: str, which: int) -> str:
        return self._prefix + key + self.SUFFIXES[which]

    _open = staticmethod(_open_lock_file)  # an attribute, so that the tests can watch the opens

    @staticmethod
    def _still_named(fd: int, path: str) -> bool:
        """Whether ``path`` still names the file open as ``fd`` (it was not unlinked or replaced)."""
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise LockError(exc.errno, f"cannot check a lock file: {exc.strerror}") from exc
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)

    def acquire(self, key: str, which: int, *, blocking: bool) -> int | None:
        path = self.path(key, which)
        while True:
            fd = self._open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if not blocking and exc.errno in _BUSY:
                    return None
                raise LockError(exc.errno, f"cannot lock the thread: {exc.strerror}") from exc
            try:
                if self._still_named(fd, path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # we locked a file that was deleted meanwhile: lock the one the path names now

    def release(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
