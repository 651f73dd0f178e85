"""What this process would otherwise ask the kernel for on every run: its pid, and random bytes.

Why this module exists: a run's way to its first delta used to make four ``getrandom`` calls
(``uuid.uuid4`` for the execution id, the JSON-RPC id and the reader file's name, and
``os.urandom`` for the journal's temporary name) and two ``getpid`` calls (the log record of
its admission, the reader file's name). Each is a system call, and each system call made
while other threads wait for the interpreter's lock hands that lock over. With 200 runs
starting at once, these and the workspace's resolution (``state.workspace.Workspaces``),
twelve system calls a run in all, were 6% of the adapter's CPU until the last first delta
(0.48 against 0.51 s, medians of eight bursts on tmpfs). Here:

- :func:`random_bytes` hands out bytes of one ``os.urandom(4096)`` at a time, so the bytes are
  the kernel's CSPRNG's as before (ids stay unguessable, unlike those of ``random``'s
  Mersenne Twister), one call per 256 UUIDs;
- :func:`pid` is read once, like glibc did before 2.25.

Both are renewed in a forked child (``os.register_at_fork``): a child that went on handing
out its parent's buffered bytes would make the same ids as its parent.
"""

from __future__ import annotations

import os
import threading
import uuid

__all__ = ["pid", "random_bytes", "random_hex", "uuid4"]

#: How many bytes one ``os.urandom`` call buffers.
_CHUNK = 4096

_lock = threading.Lock()
_buffer = b""
_pid = os.getpid()


def pid() -> int:
    """This process's id (``os.getpid()``), without a system call."""
    return _pid


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the system's CSPRNG (as ``os.urandom(n)``), taken from a buffer."""
    global _buffer
    if n > _CHUNK:
        return os.urandom(n)
    with _lock:
        if len(_buffer) < n:
            _buffer = os.urandom(_CHUNK)
        taken, _buffer = _buffer[:n], _buffer[n:]
    return taken


def random_hex(n: int) -> str:
    """``n`` random bytes as ``2n`` hex digits (as ``os.urandom(n).hex()``)."""
    return random_bytes(n).hex()


def uuid4() -> uuid.UUID:
    """A random UUID (as ``uuid.uuid4()``, which reads its 16 bytes with ``os.urandom``)."""
    return uuid.UUID(bytes=random_bytes(16), version=4)


def _renew_in_child() -> None:
    global _buffer, _pid, _lock
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _buffer = b""
    _pid = os.getpid()


os.register_at_fork(after_in_child=_renew_in_child)
