"""The process-wide budget for decoding images: how many pixels may be decoded at once.

Why this module exists: one accepted image may cost up to about 200 MiB to shrink (see
``content``), and requests decode on their own threads, so without a shared bound the
only limit on concurrent decodes was ``--max-runs`` (256 runs, far more memory than any
host has). A decode first reserves its pixels here (``--image-decode-budget-pixels``,
default :data:`DEFAULT_BUDGET_PIXELS`: one worst-case image at a time); a request that does
not fit waits at most :data:`WAIT_SECONDS` for others to finish, then is refused with 503
``SERVER_BUSY`` and ``Retry-After`` before its stream starts, having touched nothing. An
image larger than the whole budget (possible only when the budget is set below the pixel
limit of one image) is decoded alone.

Memory goes back to the system afterwards (glibc only; elsewhere nothing is tuned): Pillow
allocates images in blocks of up to 16 MiB, and glibc keeps blocks of that size in its heaps
once its adaptive mmap threshold has grown past them, so a process that had decoded six
images at once stayed hundreds of MiB above idle. The server fixes the threshold at start
(:func:`map_large_allocations`: large blocks are mapped, and unmapped when freed), and when
the last decode in progress ends the heaps are trimmed (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code

__all__ = [
    "DECODES",
    "DEFAULT_BUDGET_PIXELS",
    "RETRY_AFTER_SECONDS",
    "WAIT_SECONDS",
    "DecodeBudget",
    "map_large_allocations",
    "release_memory",
]

log = logging.getLogger("agui_adapter.images")

#: Pixels decoded at once in one process by default: one image at the 40 MP limit, or
#: several smaller ones (every image the limits accept fits).
DEFAULT_BUDGET_PIXELS = 40_000_000
#: How long a decode waits for room before its request is refused.
WAIT_SECONDS = 10.0
#: What a refused request is told to wait (``Retry-After``, seconds).
RETRY_AFTER_SECONDS = 2


#: glibc's ``mallopt`` parameter for the size from which allocations are mapped on their own.
_M_MMAP_THRESHOLD = -3
#: Allocations of at least this size (decoded images, strips, request bodies) are mapped on
#: their own and unmapped when freed, instead of staying in a heap of the C library.
MMAP_THRESHOLD = 1024 * 1024


def _glibc_function(name: str, argtypes: list[Any]) -> Any:
    """A function of glibc, or None on any other C library (musl, macOS: nothing to tune)."""
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols, the C library's among them
        function = getattr(libc, name, None)
    except OSError:
        return None
    if function is None or not hasattr(libc, "gnu_get_libc_version"):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_malloc_trim = _glibc_function("malloc_trim", [ctypes.c_size_t])
_mallopt = _glibc_function("mallopt", [ctypes.c_int, ctypes.c_int])


def release_memory() -> None:
    """Give the C heap's free memory back to the system (glibc only; elsewhere nothing)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def map_large_allocations() -> bool:
    """Make glibc map every allocation of :data:`MMAP_THRESHOLD` or more on its own, for the
    whole process (its default threshold grows with the blocks freed, up to 32 MiB, after
    which Pillow's 16 MiB blocks stay in its heaps once freed). True if it was set."""
    return _mallopt is not None and _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


class DecodeBudget:
    """Pixels being decoded now, at most ``pixels`` together (see the module docstring)."""

    def __init__(
        self,
        pixels: int = DEFAULT_BUDGET_PIXELS,
        wait_seconds: float = WAIT_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_idle: Callable[[], None] = release_memory,
    ) -> None:
        self._capacity = pixels
        self._wait = wait_seconds
        self._clock = clock
        self._on_idle = on_idle
        self._used = 0
        self._waiting = 0
        self._changed = threading.Condition()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_use(self) -> int:
        return self._used

    @property
    def waiting(self) -> int:
        """Decodes waiting for room now."""
        return self._waiting

    def configure(self, pixels: int, wait_seconds: float | None = None) -> None:
        """Set the budget (``--image-decode-budget-pixels``); decodes in progress keep theirs."""
        with self._changed:
            self._capacity = pixels
            if wait_seconds is not None:
                self._wait = wait_seconds
            self._changed.notify_all()

    @contextmanager
    def reserve(self, pixels: int) -> Iterator[None]:
        """Hold ``pixels`` of the budget while the block runs; waits at most the budget's wait
        for room, then raises ``AguiError(SERVER_BUSY)`` with a ``retryAfter``."""
        with self._changed:
            cost = max(1, min(pixels, self._capacity))
            deadline = self._clock() + self._wait
            while self._used + cost > self._capacity:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    log.warning("image refused: %d of %d pixels already being decoded", self._used, self._capacity)
                    raise AguiError(
                        Code.SERVER_BUSY,
                        msg.IMAGE_DECODE_BUSY,
                        {"seconds": RETRY_AFTER_SECONDS, "retryAfter": RETRY_AFTER_SECONDS},
                    )
                self._waiting += 1
                try:
                    self._changed.wait(remaining)
                finally:
                    self._waiting -= 1
                cost = max(1, min(pixels, self._capacity))
            self._used += cost
        try:
            yield
        finally:
            with self._changed:
                self._used -= cost
                idle = self._used == 0
                self._changed.notify_all()
            if idle:
                self._on_idle()


#: The budget of this process (configured from the settings by ``server.build_app``).
DECODES = DecodeBudget()
