"""Graceful shutdown of the live runs: let them end by themselves for a while, then end the
others with their final event, or (``--on-shutdown handover``) leave them running in the
kernel for the next process to adopt (``adoption``)."""

from __future__ import annotations

import time

from agui_adapter.run.registry import LiveRuns


def shut_down_runs(live: LiveRuns, grace_seconds: float, flush_seconds: float = 5.0, *, hand_over: bool = False) -> int:
    """Wait ``grace_seconds`` for the runs to end, then stop the others and wait
    ``flush_seconds`` for their last writes; how many had to be ended or handed over."""
    deadline = time.monotonic() + grace_seconds
    while live.count() and time.monotonic() < deadline:
        time.sleep(0.05)
    remaining = live.all()
    for driver in remaining:
        driver.shut_down(hand_over=hand_over)
    deadline = time.monotonic() + flush_seconds
    while live.count() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(remaining)
