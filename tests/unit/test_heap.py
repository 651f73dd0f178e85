"""The heap trimmer: the C heap is trimmed once the process stays idle, not after every run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from agui_adapter.ops.heap import HEAP, HeapTrimmer
from tests.support.agui_client import run_body
from tests.support.flow import wait_for


def counting(quiet: float = 0.2) -> tuple[HeapTrimmer, list[float]]:
    trims: list[float] = []
    return HeapTrimmer(quiet_seconds=quiet, trim=lambda: trims.append(time.monotonic())), trims


def test_an_idle_spell_is_trimmed_once() -> None:
    trimmer, trims = counting()
    ended = time.monotonic()
    trimmer.idle()
    wait_for(lambda: trims)
    assert trims[0] - ended >= 0.2  # after the quiet time, not at once
    trimmer.idle()  # told again, still the same spell
    time.sleep(0.5)
    assert len(trims) == 1
    trimmer.busy()
    trimmer.idle()  # a new spell
    wait_for(lambda: len(trims) == 2)


def test_a_run_within_the_quiet_time_puts_the_trim_off() -> None:
    trimmer, trims = counting(quiet=0.5)  # ten times the gaps
    for _ in range(30):  # runs one after the other for 1.5 s, 0.05 s apart: never quiet for long
        trimmer.idle()
        time.sleep(0.05)
        trimmer.busy()
    assert trims == []
    trimmer.idle()
    wait_for(lambda: trims)


def test_a_busy_process_is_never_trimmed() -> None:
    trimmer, trims = counting(quiet=0.5)
    trimmer.idle()
    trimmer.busy()  # the next run, at once
    time.sleep(1.5)
    assert trims == []


def test_the_live_runs_tell_the_process_trimmer(make_adapter: Any, tmp_path: Path) -> None:
    """An adapter whose last run ended has its heaps trimmed a quiet second later."""
    adapter = make_adapter()
    before = HEAP.trims
    result = adapter.client().run(run_body("hello", cwd=str(tmp_path / "ws")))
    assert result.terminal["type"] == "RUN_FINISHED"
    wait_for(lambda: HEAP.trims > before)


class CountingCondition(threading.Condition):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_the_trimmers_thread_is_woken_only_to_begin_an_idle_spell() -> None:
    trimmer, trims = counting(quiet=0.3)
    trimmer._changed = changed = CountingCondition()  # before its thread starts (the first idle)
    trimmer.idle()
    trimmer.busy()  # a run started: seen when the quiet time is over, no wake-up
    trimmer.idle()  # a spell begun again while the thread times one: the same
    assert changed.notified == 0
    wait_for(lambda: trims)
    wait_for(lambda: trimmer._waiting)  # trimmed: the thread waits for the next spell
    trimmer.busy()
    assert changed.notified == 0
    trimmer.idle()  # the next spell: the waiting thread is woken for it
    assert changed.notified == 1
    wait_for(lambda: len(trims) == 2)
