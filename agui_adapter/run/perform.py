"""The world's side of a run's effects that ask something: the store and the kernel.

Moved out of ``RunDriver`` (``run.driver``), which keeps the pump and the stream: a ``Persist``
written to the thread store (a required one answers ``Persisted`` or ``Failed``, else a failure
is only logged), a kernel call answered as ``KernelAnswer``/``KernelRefused``/``Failed``, a task
stopped and waited for until the kernel no longer reports it working, the record of a run's end,
and the cancel-and-retire of an abandoned stream whose task id only its reader learns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.protocol.errors import Code
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.run import effects as fx
from agui_adapter.run.services import RunServices
from agui_adapter.run.translation import BUSY_STATES, inspect_frame
from agui_adapter.state.record import Mutation, RetireExecution, RunEnded, StaleExecution
from agui_adapter.state.store import StoreError

log = logging.getLogger("agui_adapter.run")


def persist(services: RunServices, thread_id: str, run_id: str, effect: fx.Persist) -> fx.Reply | None:
    try:
        record = services.store.update(thread_id, effect.mutation)
        if record is None:
            raise StoreError("the thread state disappeared")
    except (StoreError, StaleExecution) as exc:
        reason = str(exc) if isinstance(exc, StoreError) else "the execution ended while the run was live"
        if effect.required:
            return fx.Failed(reason)
        log.warning("run %s: could not record %s: %s", run_id, type(effect.mutation).__name__, reason)
        return None
    return fx.Persisted(record) if effect.required else None


def run_ended(finish: fx.Finish, machine: Any, run_id: str, now: float) -> fx.Persist:
    """The run's outcome in the thread's recent runs (``GET /threads/{threadId}``), written
    before its final events reach the client; a run whose client left ends ``CANCELLED``."""
    outcome, code = finish.outcome.value, finish.code
    if finish.outcome is fx.Outcome.ABANDONED:
        outcome, code = fx.Outcome.ERROR.value, code or Code.CANCELLED
    tool_calls: tuple[str, ...] = ()
    if finish.outcome is fx.Outcome.INTERRUPT:
        pending = machine.record.execution.pending.values()
        tool_calls = tuple(str(p.interrupt.get("toolCallId")) for p in pending if p.interrupt.get("toolCallId"))
    return fx.Persist(RunEnded(run_id, outcome, rfc3339(now), code, machine.task_id, tool_calls))


def ask(call: Callable[[], tuple[int, object]]) -> fx.Reply:
    try:
        status, body = call()
    except KernelRejected as exc:
        return fx.KernelRefused(exc)
    except KernelUnavailable as exc:
        return fx.Failed(str(exc))
    return fx.KernelAnswer(status, body)


def stop_task(services: RunServices, kernel: Any, task_id: str) -> object:
    """Cancel a task and wait until the kernel reports it no longer working (ended, or
    waiting for input, which does not block a new turn); its last snapshot."""
    services.cancel_task_quietly(task_id)
    deadline = time.monotonic() + services.settings.stale_task_timeout_seconds
    while True:
        task = kernel.get_task(task_id)
        if inspect_frame({"result": task}).state not in BUSY_STATES or time.monotonic() >= deadline:
            return task
        time.sleep(0.1)


def retire_later(services: RunServices, thread_id: str, execution_id: str) -> Callable[[str], None]:
    """For an abandoned stream whose task id only the reader will learn."""

    def cancel_and_retire(task_id: str) -> None:
        services.cancel_task_quietly(task_id)
        mutation: Mutation = RetireExecution(execution_id, task_id=task_id)
        try:
            services.store.update(thread_id, mutation)
        except StoreError as exc:
            log.warning("thread %s: could not retire an abandoned execution: %s", thread_id, exc)

    return cancel_and_retire
