"""The optional "speedups" extra (orjson), imported where it is first needed.

Why it exists: two places parse JSON where orjson is several times faster than the standard
library, the kernel's frames (``kernel_client.a2a``: about 25% more events/s) and the
request bodies (``web.request_checks``: a run's 350-byte input in about 1.2 µs instead of
5). orjson is not a runtime dependency, and importing it costs about 1 MiB of an idle
process, so it is imported at the first parse rather than at start, and without the extra
the standard library does the job alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_loads: Callable[[bytes], Any] | None = None
_looked = False


def orjson_loads() -> Callable[[bytes], Any] | None:
    """``orjson.loads``, or None when the extra is not installed (looked for once)."""
    global _loads, _looked
    if not _looked:
        try:
            from orjson import loads
        except ImportError:
            loads = None
        _loads, _looked = loads, True
    return _loads
