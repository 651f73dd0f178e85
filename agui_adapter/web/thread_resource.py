"""The thread as a resource: ``GET /threads/{threadId}`` and ``GET /threads/{threadId}/messages``.

A client that lost everything but a thread id (a reload, another device) must be able to
rebuild its view: whether a run is live and where its stream is (to follow it from
``lastEventId``), which questions wait for an answer (exactly the interrupt objects the
``RUN_FINISHED`` carried, for as long as they can be answered: they come from the thread
record, not from the run's journal, whose retention is minutes), the execution a cancel
names, the recent runs and their outcomes, and the conversation itself.

Where each answer comes from:

* ``pendingInterrupts``, ``execution``, ``runs``: the thread record (``record``), read
  without its locks (it is replaced atomically);
* ``activeRun``: this process's live runs (``RunEngine.live_driver``), else, for a run
  carried out by another worker process, the runs of the record still without an outcome
  whose journal's writer is alive; ``lastEventId`` and ``clientAttached`` from the journal
  (``JournalStore.progress``);
* the messages: the kernel (``run.history``), never the state directory.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.timestamps import parse_rfc3339
from agui_adapter.run import history
from agui_adapter.run.engine import RunEngine
from agui_adapter.state.record import PendingInterrupt, RunEntry, ThreadRecord
from agui_adapter.state.store import StoreError

log = logging.getLogger("agui_adapter.web.thread_resource")


def check_path_header(header: str | None, thread_id: str) -> None:
    """``X-AGUI-Thread-Id``, when sent, must name the thread of the path."""
    if header is not None and header != thread_id:
        raise AguiError(Code.INVALID_INPUT, msg.THREAD_PATH_HEADER_MISMATCH)


def answerable(pending: PendingInterrupt, now: float) -> bool:
    """Whether a pending interrupt can still be answered (it has not expired)."""
    expires_at = pending.expires_at
    if expires_at is None:
        return True
    try:
        return parse_rfc3339(expires_at) > now
    except ValueError:
        return True


def thread_view(
    record: ThreadRecord, active_run: dict[str, Any] | None, now: float, lost: Collection[str] = ()
) -> dict[str, Any]:
    """The JSON of ``GET /threads/{threadId}`` (sans-I/O). ``lost``: runs without an outcome
    whose process died (their journal has no live writer): shown as ``EXECUTION_LOST``, what a
    reader of their journal is told."""
    execution = record.execution
    pending = [] if execution.terminal else [p.interrupt for p in execution.pending.values() if answerable(p, now)]
    current = None
    if not execution.terminal:
        current = {"executionId": execution.execution_id, "rosInvocationId": execution.ros_invocation_id}
    runs = []
    for entry in record.runs:
        shown = entry.public()
        if entry.outcome is None and entry.run_id in lost:
            shown.update(outcome="error", errorCode=Code.EXECUTION_LOST)
        runs.append(shown)
    return {
        "threadId": record.thread_id,
        "activeRun": active_run,
        "pendingInterrupts": pending,
        "execution": current,
        "runs": runs,
    }


class ThreadViews:
    """Reads a thread for the two routes; one per adapter process."""

    def __init__(self, engine: RunEngine) -> None:
        self.engine = engine

    def _record(self, thread_id: str) -> ThreadRecord:
        try:
            record = self.engine.store.load(thread_id)
        except StoreError as exc:
            log.error("thread %s: %s", thread_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        if record is None:
            raise AguiError(Code.THREAD_NOT_FOUND, msg.THREAD_NOT_FOUND)
        return record

    # ------------------------------------------------------------------ GET /threads/{id}
    def show(self, thread_id: str) -> dict[str, Any]:
        record = self._record(thread_id)
        active, lost = self._runs_in_progress(record)
        return thread_view(record, active, self.engine.clock(), lost)

    def _runs_in_progress(self, record: ThreadRecord) -> tuple[dict[str, Any] | None, set[str]]:
        """The thread's active run, and its runs without an outcome whose process died."""
        journals = self.engine.journals
        entries = {entry.run_id: entry for entry in record.runs}
        driver = self.engine.live_driver(record.thread_id)
        active: dict[str, Any] | None = None
        if driver is not None:
            entry = entries.get(driver.run_id)
            progress = journals.progress(record.thread_id, driver.run_id)
            attached = progress[2] if progress is not None else driver.client_attached
            started = entry.started_at if entry is not None else None
            mode = entry.mode if entry is not None else driver.machine.mode.value
            active = _active(driver.run_id, progress[1] if progress else None, attached, started, mode)
        # runs of other worker processes: still without an outcome, their journal's writer alive
        mine = driver.run_id if driver is not None else None
        running = [e for e in reversed(record.runs) if e.outcome is None and e.run_id != mine]
        running.sort(key=lambda entry: entry.mode == "guidance")  # the run holding the thread first
        lost: set[str] = set()
        for entry in running:
            progress = journals.progress(record.thread_id, entry.run_id)
            if progress is None:
                continue  # no journal (yet, or any more): nothing to tell
            if not progress[0]:
                lost.add(entry.run_id)
            elif active is None:
                active = _active(entry.run_id, progress[1], progress[2], entry.started_at, entry.mode)
        return active, lost

    # ------------------------------------------------------------------ GET /threads/{id}/messages
    def messages(self, thread_id: str, limit: str | None, before: str | None) -> dict[str, Any]:
        try:
            count, end = history.parse_page(limit, before)
        except history.BadPage as exc:
            if exc.args[0] == "limit":
                raise AguiError(Code.INVALID_INPUT, msg.HISTORY_LIMIT_INVALID, {"limit": history.MAX_LIMIT}) from None
            raise AguiError(Code.INVALID_INPUT, msg.HISTORY_CURSOR_INVALID) from None
        record = self._record(thread_id)
        conversation = history.agui_messages(self._kernel_conversation(record), record.runs)
        items, next_cursor = history.page(conversation, count, end)
        return {"threadId": thread_id, "messages": items, "nextCursor": next_cursor}

    def _kernel_conversation(self, record: ThreadRecord) -> list[Any]:
        """The session's conversation as the kernel keeps it ([] when it has none). The
        kernel answers it for the context's current execution only (409 for another): that
        of the thread's latest task, else of the context's most recently updated task."""
        kernel = self.engine.kernel
        try:
            task_id = record.execution.task_id or _latest_task(record.runs)
            status, body = self._recovery(record, task_id) if task_id else (404, None)
            if status == 409 or not task_id:
                listed = kernel.call("ListTasks", {"contextId": record.context_id, "pageSize": 100}, timeout=10.0)
                tasks = [t for t in (listed or {}).get("tasks") or [] if isinstance(t, dict)]
                tasks.sort(key=lambda t: str((t.get("status") or {}).get("timestamp") or ""), reverse=True)
                if tasks and tasks[0].get("id") != task_id:
                    status, body = self._recovery(record, str(tasks[0].get("id")), tasks[0])
        except KernelRejected as exc:  # the kernel no longer knows the task (it lost it)
            log.info("thread %s: no conversation from the kernel: %s", record.thread_id, exc.detail)
            return []
        except KernelUnavailable as exc:
            log.warning("thread %s: the kernel is unavailable: %s", record.thread_id, exc)
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE) from None
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            log.info("thread %s: the kernel's session recovery answered %s", record.thread_id, status)
            return []
        return list(body["messages"])

    def _recovery(self, record: ThreadRecord, task_id: str, task: Any = None) -> tuple[int, Any]:
        """The kernel's session recovery for the execution of ``task_id``."""
        kernel = self.engine.kernel
        if task is None:
            task = kernel.get_task(task_id, timeout=10.0)
        control = ((task.get("metadata") or {}).get("iac_code") or {}).get("executionControl") or {}
        execution_id = control.get("executionId")
        if not isinstance(execution_id, str) or not execution_id:
            return 404, None
        return kernel.session_recovery(record.context_id, execution_id)


def _latest_task(runs: list[RunEntry]) -> str | None:
    for entry in reversed(runs):
        if entry.task_id:
            return entry.task_id
    return None


def _active(
    run_id: str, last_event_id: int | None, attached: bool, started_at: str | None, mode: str
) -> dict[str, Any]:
    return {
        "runId": run_id,
        "lastEventId": last_event_id,
        "clientAttached": attached,
        "startedAt": started_at,
        "mode": mode,
    }
