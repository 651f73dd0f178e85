"""Timestamps as the adapter writes them: RFC 3339 in UTC, to the second (``...Z``).

Why a module: an interrupt's ``expiresAt`` (AG-UI), a run's start and end in the thread record
and retention's look at pending interrupts all read and write this one form; the rule lives
here once, below every layer that uses it.
"""

from __future__ import annotations

from datetime import datetime, timezone

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(epoch_seconds: float) -> str:
    """``1700000000.5`` -> ``"2023-11-14T22:13:20Z"`` (fractions dropped)."""
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc).strftime(_FORMAT)


def parse_rfc3339(value: str) -> float:
    """The inverse of ``rfc3339``; raises ``ValueError`` for any other form."""
    return datetime.strptime(value, _FORMAT).replace(tzinfo=timezone.utc).timestamp()
