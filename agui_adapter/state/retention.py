"""Retention: thread records idle for longer than ``--thread-retention-days`` are deleted.

Why this module exists: the adapter keeps one small record per AG-UI thread (plus, where
its locks are files, ``thread_locks.FileLocks``, its two lock files) and, left alone, keeps
them for ever. With ``thread_retention_days`` set (default 0: off, everything is kept), a
thread whose files have not changed for that long is forgotten: ``<key>.json`` is deleted,
and ``<key>.lock`` and ``<key>.run`` where there are such files (an adapter older than
``RangeLocks`` left them too). A later request on that thread starts it afresh.

Never deleted, whatever its age:

* a thread with a live run: its run lock is held by some process (tried, never waited for);
* a thread with a pending interrupt that has not expired yet (``expiresAt`` in the future,
  or unreadable, to be safe): its answer must still find the execution;
* a record the store cannot read (logged, left for a human).

Last activity is the newest modification time of the thread's files: every change of the
record replaces its file. The policy lives here; the store only lists threads and deletes a
thread's files under both of its locks (``ThreadStore.remove_if``), so pruning is safe
while other processes (gunicorn workers) use the same directory.

It runs at start-up and then every hour, on a daemon thread of the built-in server
(``server.main``) and of each WSGI worker (``wsgi.py``); concurrent prunes of one directory
are harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agui_adapter.config import Settings
from agui_adapter.protocol.timestamps import parse_rfc3339
from agui_adapter.state.record import PendingInterrupt
from agui_adapter.state.store import StoreError, ThreadStore

log = logging.getLogger("agui_adapter.state.retention")

DAY_SECONDS = 86400.0
DEFAULT_INTERVAL_SECONDS = 3600.0


@dataclass
class PruneReport:
    """What one pass did."""

    removed: int = 0
    kept_busy_or_recent: int = 0
    kept_pending: int = 0
    failed: int = 0


def has_live_interrupt(pending: Mapping[str, PendingInterrupt], now: float) -> bool:
    """Whether any pending interrupt can still be answered (``expiresAt`` not yet passed).

    An entry without a readable ``expiresAt`` counts as live: better kept than lost.
    """
    for entry in pending.values():
        expires_at = entry.expires_at
        if expires_at is None:
            return True
        try:
            if parse_rfc3339(expires_at) > now:
                return True
        except ValueError:
            return True
    return False


def prune(store: ThreadStore, max_age_seconds: float, *, now: float | None = None) -> PruneReport:
    """Delete every thread idle for more than ``max_age_seconds``, except the protected ones."""
    now = time.time() if now is None else now
    cutoff = now - max_age_seconds
    report = PruneReport()
    try:
        # a dead process's record log read first: a thread deleted now must not come back from it
        store.recover()
        keys = store.thread_keys()
    except StoreError as exc:
        log.warning("retention: %s", exc)
        report.failed += 1
        return report
    for key in keys:
        try:
            activity = store.last_activity(key)
            if activity is None or activity > cutoff:
                continue  # cheap pre-check without any lock; decided again under the locks
            verdict: list[str] = []

            def remove(record: Any, last_activity: float | None, verdict: list[str] = verdict) -> bool:
                if last_activity is not None and last_activity > cutoff:
                    verdict.append("recent")
                    return False
                if record is not None and has_live_interrupt(record.execution.pending, now):
                    verdict.append("pending")
                    return False
                return True

            if store.remove_if(key, remove):
                report.removed += 1
            elif verdict == ["pending"]:
                report.kept_pending += 1
            else:
                report.kept_busy_or_recent += 1
        except StoreError as exc:
            log.warning("retention: thread file %s kept: %s", key, exc)
            report.failed += 1
    if report.removed:
        log.info("retention: deleted %d idle thread record(s)", report.removed)
    return report


class RetentionJob:
    """Prunes at once, then every ``interval`` seconds, on a daemon thread, until stopped."""

    def __init__(
        self,
        store: ThreadStore,
        max_age_seconds: float,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.max_age_seconds = max_age_seconds
        self.interval = interval
        self.clock = clock
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agui-retention", daemon=True)

    def start(self) -> RetentionJob:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                prune(self.store, self.max_age_seconds, now=self.clock())
            except Exception:  # noqa: BLE001 - a failed pass must not end the job
                log.exception("retention: pass failed")
            self.passes += 1
            self._stop.wait(self.interval)


def start_retention(settings: Settings, *, interval: float = DEFAULT_INTERVAL_SECONDS) -> RetentionJob | None:
    """The running job for these settings, or None when retention is off (the default)."""
    if settings.thread_retention_days <= 0:
        return None
    store = ThreadStore(settings.resolved_state_dir())
    log.info("retention: thread records idle for %g day(s) are deleted", settings.thread_retention_days)
    return RetentionJob(store, settings.thread_retention_days * DAY_SECONDS, interval=interval).start()
