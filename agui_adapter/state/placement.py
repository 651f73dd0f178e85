"""Where the state's directories land on the disk: ext4 is asked to spread them.

Each new thread makes files: its record and its journal's directory (and its two lock files
where its locks are files, ``thread_locks.FileLocks``). On
ext4 a new file takes an inode from its directory's block group, and a new directory from its
parent's group, unless that parent is the top of a hierarchy: the root directory, or one marked
``T`` (``chattr +T``, ``FS_TOPDIR_FL``). Then the Orlov allocator places the new directory in
the group with the fewest directories among those with more free inodes and blocks than the
average, as it does for a new home directory.

A state directory made in a busy group (under ``/tmp`` or ``/var/lib`` of a root file system
many programs write to) pays on every creation there: an ext4 without a journal does not hand
out an inode freed in the last minute (six while its inode table block is still dirty), and
each creation walks past every such inode of its group. Measured on the machine of the
benchmarks, medians of 300: a new file under ``/tmp`` 274 µs, a ``mkdir`` 290 µs, against 16
and 21 µs in subdirectories of a ``/tmp`` directory marked ``T``. A new thread made four of
them before its first delta while its locks were two files of its own. (A group a large
tree was just deleted from is as slow, and Orlov may pick it, since it has the fewest
directories: the mark helps where the state's neighbours churn, not against the state's own
lately deleted files.)

So ``spread`` marks the state directory ``T`` before its subdirectories (``threads``,
``journal``, ``record-log``) are made. The mark is a placement hint and nothing else: it
changes no permission and no content, and ``lsattr -d`` shows it. Subdirectories made before
it stay where they are. On any other file system, or where the ioctl is refused (a directory
owned by another user), nothing is done: the state works the same, at that file system's speed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import sys

log = logging.getLogger(__name__)

_LONG = struct.calcsize("l")  # the ioctls are declared with ``long`` but carry an ``int``
#: ``_IOR('f', 1, long)`` and ``_IOW('f', 2, long)`` from ``linux/fs.h``
FS_IOC_GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
FS_IOC_SETFLAGS = (1 << 30) | (_LONG << 16) | (ord("f") << 8) | 2
FS_TOPDIR_FL = 0x00020000

#: What a file system without these flags, or a refused caller, answers: nothing to do then.
_UNSUPPORTED = {errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, errno.EACCES, errno.EROFS}


def flags(directory: str) -> int:
    """The directory's inode flags (``lsattr -d``); OSError where the file system has none."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _flags(fd)
    finally:
        os.close(fd)


def _flags(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]


def spread(directory: str) -> bool:
    """Mark ``directory`` the top of a hierarchy, so that the directories made in it are
    placed in block groups with free inodes; whether it is marked now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        current = _flags(fd)
        if not current & FS_TOPDIR_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", current | FS_TOPDIR_FL))
        return True
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            log.debug("state: could not mark %s for spread placement: %s", directory, exc)
        return False
    finally:
        os.close(fd)
