"""A run without its own client: read on into its journal, until it ends or nobody came back.

When a run's client leaves while a disconnect grace period is set or other readers follow it
(``driver``), and when a process adopts a run whose process died (``adoption``), the run goes
on on a thread of its own. This module is that thread's loop: every chunk the run writes goes
to its journal, and every ``DETACHED_TICK_SECONDS`` it asks whether anybody follows the journal
(at once when a reader in this process leaves: it wakes the run). Once nobody has for the grace
period (counted from the last reader leaving, on the injectable monotonic clock
``RunServices.monotonic`` so that tests move it) the run is abandoned: the driver ends it with
the machine's ``abandoned``. However the loop ends, the driver winds the run up
(``DetachedRun.wind_up_detached``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from agui_adapter.protocol import events as ev

log = logging.getLogger("agui_adapter.run")

#: How often a detached run looks whether anybody follows it.
DETACHED_TICK_SECONDS = 0.25


class DetachedRun(Protocol):
    """What the loop needs of the run's driver."""

    run_id: str

    def chunks(self) -> Iterator[bytes]:
        """The run's chunks (heartbeats and idle wake-ups included)."""
        ...

    def journal_chunk(self, chunk: bytes) -> None: ...

    def going_on(self) -> bool:
        """Whether the run still goes on detached (not ended, abandoned, or told to stop)."""
        ...

    def followed(self) -> bool:
        """Whether any reader follows the run's journal now."""
        ...

    def readers_left(self) -> bool:
        """Whether a reader in this process left since the last look (it woke the run)."""
        ...

    def abandon(self) -> None:
        """Nobody came back within the grace period: end the run at its next wake-up."""
        ...

    def wind_up_detached(self) -> None:
        """The loop is over: end the run if it did not, and wind it up."""
        ...


class Unattended:
    """How long nobody has followed the run, on ``clock``; ``over`` once it is ``grace`` seconds."""

    __slots__ = ("_clock", "_grace", "_since")

    def __init__(self, grace: float, clock: Callable[[], float]) -> None:
        self._grace = grace
        self._clock = clock
        self._since: float | None = None

    def over(self, followed: bool) -> bool:
        now = self._clock()  # read at every look (tests wait on those reads)
        if followed:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= self._grace


def go_on(run: DetachedRun, grace: float, clock: Callable[[], float]) -> None:
    """Read the run into its journal until it ends, or until nobody has been attached for
    ``grace`` seconds (then ``abandon``); with no grace period, until the last reader leaves."""
    unattended = Unattended(grace, clock)
    next_check = 0.0
    try:
        for chunk in run.chunks():
            if chunk and chunk is not ev.HEARTBEAT:
                run.journal_chunk(chunk)
            now = time.monotonic()
            if not run.going_on() or (now < next_check and not run.readers_left()):
                continue
            next_check = now + DETACHED_TICK_SECONDS
            if unattended.over(run.followed()):
                log.info("run %s: nobody reattached within %gs; ending it", run.run_id, grace)
                run.abandon()
    except Exception:  # noqa: BLE001 - a detached run must still end cleanly
        log.exception("run %s: the detached run failed", run.run_id)
    finally:
        run.wind_up_detached()


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """``target`` on a daemon thread of its own, in a copy of the caller's context (the
    request's id stays on the run's log lines)."""
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(target,), name=name, daemon=True)
    thread.start()
    return thread
