"""Recycled record files: a record's save writes into a file an earlier save replaced.

Why this module exists: a record saved the classic way (a new temporary file renamed over the
old one) makes one inode and frees one at every save, three saves a run. ext4 does not hand
out a freed inode again for a while, and where the directory's block group has few inodes
left, every new file's allocation looks past each recently freed one: on this project's bench
machine, a state directory under ``/tmp`` made each temporary file cost 0.4 to 1.4 ms of
CPU (10 µs in a fresh group), twice on the way to every run's first delta. A recycled save
keeps the record it replaces under a spare name (a hard link made under the record's lock,
just before the rename) and the next save writes into that spare: after the first saves,
saves neither make nor free an inode. A durable save writes over the spare's old bytes and
cuts what is left, its blocks kept (no block freed and allocated again, which with a
``discard`` mount waits for the device); until the record log's checkpoint syncs it in place,
a power cut finds it in the log (``record_log``). Any other save empties the spare first, so
that ext4 writes the new record out before the rename, as it does for a new file renamed over
an old one (``auto_da_alloc``). What a reader sees is unchanged, one whole record or the
next, renamed into place; a reader that opened a record just before it was replaced may find
the file emptied or rewritten under it, and reads again (``ThreadStore.load``).

The spares are this process's, named ``.<stem>.<n>.spare`` in the threads directory after its
record log's files (``record_log``), whose locks say whether their process lives: the recovery
of a dead process's log deletes its spares too (``remove_spares``; unlinked, never written,
since a process that died between a link and its rename leaves a spare that is still a
record's second name). One save uses a spare at a time (``take``, then ``give``); a process
keeps at most ``MOST``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading

SUFFIX = ".spare"
#: The most spares a process keeps: as many as saves that found none at the same time, up to
#: this; a save that would keep one more replaces its record the classic way.
MOST = 64


class Spares:
    """This process's spare record files in one threads directory (``prefix`` ends with a separator)."""

    def __init__(self, prefix: str, stem: str) -> None:
        self.stem = stem
        self._prefix = f"{prefix}.{stem}."
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._free: list[str] = []

    def take(self) -> str | None:
        """A spare to write a record into, or None when there is none (a file is made)."""
        with self._lock:
            return self._free.pop() if self._free else None

    def name(self) -> str:
        """A name no spare has had, for the record a save is about to replace."""
        return f"{self._prefix}{next(self._numbers)}{SUFFIX}"

    def give(self, path: str) -> bool:
        """``path`` is a spare now (no record is named by it any more); False when the
        process keeps ``MOST`` already (the caller deletes it)."""
        with self._lock:
            if len(self._free) >= MOST:
                return False
            self._free.append(path)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._free)


def remove_spares(threads_dir: str, stem: str) -> int:
    """Delete the spares a dead process left (its log's ``stem``); how many were deleted."""
    start = f".{stem}."
    removed = 0
    try:
        names = os.listdir(threads_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(start) and name.endswith(SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(threads_dir, name))
                removed += 1
    return removed
