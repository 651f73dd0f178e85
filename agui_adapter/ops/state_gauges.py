"""What the state directory holds, counted for ``/metrics`` when it is scraped.

Pending interrupts and journal bytes are facts of the shared state directory, not of one
process: every worker of a WSGI server (and any adapter sharing the directory) sees the same
files. So they are read from disk at scrape time (``metrics.Cached`` keeps a reading for a
few seconds), never counted as they change: a count kept in memory would miss what another
process, an expiry or the retention sweeper did. Both readings are a directory listing and
small reads; they never take a lock (a record being replaced is read whole or not at all,
since writes are atomic renames).
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _expired(expires_at: object, now: float) -> bool:
    if not isinstance(expires_at, str):
        return False
    from agui_adapter.protocol.timestamps import parse_rfc3339  # read at scrape time only

    try:
        return parse_rfc3339(expires_at) <= now
    except ValueError:
        return False


def pending_interrupts(threads_dir: Path, now: float) -> int:
    """Interrupts that can still be answered: pending in a live execution, not expired."""
    try:
        entries = list(os.scandir(threads_dir))
    except FileNotFoundError:
        return 0
    count = 0
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        try:
            with open(entry.path, "rb") as handle:
                execution = json.loads(handle.read()).get("execution") or {}
        except (OSError, ValueError, AttributeError):
            continue  # removed meanwhile, or not a record: not counted
        if not isinstance(execution, dict) or execution.get("terminal"):
            continue
        pending = execution.get("pending") or {}
        if not isinstance(pending, dict):
            continue
        for item in pending.values():
            interrupt = item.get("interrupt") if isinstance(item, dict) else None
            if isinstance(interrupt, dict) and not _expired(interrupt.get("expiresAt"), now):
                count += 1
    return count


def journal_bytes(journal_root: Path) -> int:
    """The size of every file under the journals' directory (``<state>/journal/<thread>/<run>/``)."""
    total = 0
    stack = [str(journal_root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # gone meanwhile (a sweep), or never made
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total
