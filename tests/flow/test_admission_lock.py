"""No kernel call while a thread's record lock is held: admission asks the kernel outside it.

A new turn on a thread with unanswered interrupts asks the kernel whether it lost their task
(up to 5 s). Meanwhile every other request that needs the thread's record (here a Resume,
refused ``THREAD_BUSY`` under that lock) is answered at once, not after the kernel.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.agui_client import RunResult, resume, run_body
from tests.support.flow import interrupted


def test_a_slow_kernel_answer_does_not_hold_the_threads_record(
    make_adapter: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = make_adapter()
    client = adapter.client()
    body, result = interrupted(client, workspace)
    [interrupt] = result.terminal["outcome"]["interrupts"]
    kernel = adapter.app.engine.kernel
    get_task = kernel.get_task
    asked, answer = threading.Event(), threading.Event()

    def slow_get_task(task_id: str, history_length: int | None = None, *, timeout: float = 30.0) -> Any:
        asked.set()
        answer.wait(20)  # the kernel is slow to answer, until the test lets it
        return get_task(task_id, history_length, timeout=timeout)

    monkeypatch.setattr(kernel, "get_task", slow_get_task)
    turns: list[RunResult] = []
    nxt = run_body("next", thread_id=body["threadId"], cwd=str(workspace))
    turn = threading.Thread(target=lambda: turns.append(adapter.client().run(nxt)), daemon=True)
    turn.start()
    assert asked.wait(10)  # admission of the new turn waits for the kernel's word
    started = time.monotonic()
    answers = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    busy = client.run(resume(body, answers))
    waited = time.monotonic() - started
    answer.set()
    assert busy.status == 409 and busy.error and busy.error["code"] == "THREAD_BUSY"  # the turn holds the thread
    assert waited < 5.0, waited  # answered under the record lock while the kernel was still asked
    turn.join(30)
    [refused] = turns
    # the kernel still has the interrupted task: the turn is refused, decided under the lock again
    assert refused.status == 409 and refused.error and refused.error["code"] == "RESUME_REQUIRED"


def test_a_turn_on_a_known_thread_is_admitted_on_one_read_of_its_record(
    make_adapter: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check for a run to adopt (one that died with its process) and the admission's own
    checks share one read of the record, under its lock: a record holds up to 50 runs, and
    every turn of a conversation is admitted on it."""
    adapter = make_adapter()
    client = adapter.client()
    first = run_body(cwd=str(workspace))
    assert client.run(first).status == 200
    engine, store = adapter.app.engine, adapter.app.engine.store
    admitting = threading.Event()
    loads: list[str] = []
    load, admit = store.load, engine.admit

    def counted_load(thread_id: str) -> Any:
        if admitting.is_set():
            loads.append(thread_id)
        return load(thread_id)

    def watched_admit(*args: Any, **kwargs: Any) -> Any:
        admitting.set()
        try:
            return admit(*args, **kwargs)
        finally:
            admitting.clear()

    monkeypatch.setattr(store, "load", counted_load)
    monkeypatch.setattr(engine, "admit", watched_admit)
    for text in ("second", "third"):
        result = client.run(run_body(text, thread_id=first["threadId"], cwd=str(workspace)))
        assert result.status == 200 and result.types()[-1] == "RUN_FINISHED"
    assert loads == [first["threadId"]] * 2
