"""The cancel extension (``POST /agui/executions/cancel``), and cancelling a kernel task quietly.

An execution is cancelled in the kernel first (a task that no longer runs is nothing to
stop), then retired in the thread's record, and a live run of it here gives its thread back
at once (``RunDriver.release_now``), whatever its writer is blocked on.
"""

from __future__ import annotations

import logging

from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.run.registry import LiveRuns
from agui_adapter.state.record import RetireExecution
from agui_adapter.state.store import StoreError, ThreadStore

log = logging.getLogger("agui_adapter.run.engine")


class Cancellation:
    def __init__(self, store: ThreadStore, kernel: KernelClient, live: LiveRuns) -> None:
        self.store = store
        self.kernel = kernel
        self.live = live

    def cancel_execution(self, thread_id: str, ros_invocation_id: str, execution_id: str) -> str:
        """The cancel extension: ``cancelled`` or ``already_terminal``; else EXECUTION_NOT_FOUND."""
        not_found = AguiError(Code.EXECUTION_NOT_FOUND, msg.EXECUTION_NOT_FOUND)
        try:
            record = self.store.load(thread_id)
        except StoreError as exc:
            log.error("cancel on thread %s: %s", thread_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        if record is None:
            raise not_found
        execution = record.execution
        if execution.execution_id != execution_id:
            if record.terminal_executions.get(execution_id) == ros_invocation_id:
                return "already_terminal"
            raise not_found
        if execution.ros_invocation_id != ros_invocation_id:
            raise not_found
        if execution.terminal:
            return "already_terminal"
        if execution.task_id:
            try:
                self.kernel.cancel_task(execution.task_id)
            except KernelRejected as exc:  # e.g. not running any more: nothing to stop
                log.info("CancelTask %s: %s", execution.task_id, exc.detail)
            except KernelUnavailable as exc:
                log.warning("CancelTask %s failed: %s", execution.task_id, exc)
                raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE) from None

        try:
            self.store.update(thread_id, RetireExecution(execution_id))
        except StoreError as exc:
            log.error("cancel on thread %s: %s", thread_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        for driver in self.live.of_execution(execution_id):  # a live run of it gives its thread back now
            driver.release_now()
        log.info("execution %s on thread %s cancelled", execution_id, thread_id)
        return "cancelled"
