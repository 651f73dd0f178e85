"""Admission: the checks a new run passes before its first byte, and what it holds after.

A run first takes one of the process's ``max_runs`` slots (``slots``), or is refused
``SERVER_BUSY`` having touched nothing. Then it takes its thread's run lock (guidance never
does), and under the thread's record lock the record is read, the contract's checks run in
upstream's order (duplicate run id, busy thread, binding conflict, pending interrupts), and
the admitted run is written down before the first byte is sent.

No kernel call is made while the record lock is held. One check needs the kernel's word: a
new turn on a thread whose interrupts nobody answered, whose task the kernel may have lost
(then the turn starts and the interrupts are retired: no dead end). That check leaves the
lock (``_AskKernel``), asks the kernel (``ask_whether_lost``, up to 5 s), and runs all the
checks again under the lock with the answer: the record may have changed meanwhile, and an
answer about another task than the one the record now names is not used. The run lock,
held throughout, keeps other runs away; the record lock is only what every write of the
thread's record waits for (a run's progress, the cancel extension, a Resume refused
``THREAD_BUSY``), and none of them waits on the kernel.

A new run on a thread held by a run of this process whose client has just hung up (a Stop,
then the next message at once) waits a moment for that run to end and give the thread back,
instead of being refused ``THREAD_BUSY`` (``_lock_after_leaving_run``).

A new turn on a thread whose last run died with its process (its execution still live, no run
holding the thread) first has that run adopted (``adoption``): it holds the thread again and the
turn is ``THREAD_BUSY``, unless it ends at once (its task is gone). That is seen in the same read
of the record as the checks (``_Orphaned`` leaves the lock to adopt, then the checks run again):
one read per admission, not two.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.ops import process_local
from agui_adapter.ops.idle import IdleWatch
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.content import build_user_parts
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.protocol.validation import RunInput, request_digest
from agui_adapter.run import resume, task_lost
from agui_adapter.run.admitted import Admission, context_id_for, run_mode_name
from agui_adapter.run.adoption import Adoption
from agui_adapter.run.effects import Mode
from agui_adapter.run.registry import LiveRuns
from agui_adapter.run.slots import RunSlots
from agui_adapter.state.record import Execution, RunBegan, ThreadRecord
from agui_adapter.state.store import RunLock, StoreError, ThreadStore
from agui_adapter.state.workspace import Workspaces, ensure_workspace

log = logging.getLogger("agui_adapter.run.engine")

#: What a run refused with SERVER_BUSY is told to wait (``Retry-After``, seconds).
RETRY_AFTER_SECONDS = 2
#: How long a new run on a busy thread waits for the run holding it when that run's client
#: has just hung up (it is ending and giving the thread back), before THREAD_BUSY.
LEAVING_RUN_WAIT_SECONDS = 2.0
#: How long a new turn waits for a run it made adopt to end by itself (its task was gone).
ADOPTED_END_WAIT_SECONDS = 2.0
#: How long admission waits for the kernel's word on an interrupted task.
ASK_TIMEOUT_SECONDS = 5.0


def ask_whether_lost(kernel: KernelClient, task_id: str, timeout: float = ASK_TIMEOUT_SECONDS) -> bool:
    """Whether the kernel says the task is gone (``task_lost``); a kernel that does not
    answer has not lost anything. Never called holding a thread's record lock."""
    try:
        task = kernel.get_task(task_id, timeout=timeout)
    except KernelRejected as exc:
        return task_lost.refusal_says_lost(exc.rpc_code)
    except KernelUnavailable:
        return False
    return task_lost.snapshot_says_lost(task)


class _AskKernel(Exception):
    """The checks need the kernel's word on this task: asked outside the record lock."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id


def _orphan_possible(record: ThreadRecord) -> bool:
    """Whether the thread's execution is live although no run holds the thread (we do): the
    run of it died with its process, and may be adopted."""
    live = record.execution
    return bool(live.task_id) and not live.terminal and not live.waiting


class _Orphaned(Exception):
    """The record shows a live execution no run holds (its run died with its process): it is
    adopted outside the record lock, then the checks run again."""


class Admitter:
    """Admits runs; one per engine."""

    def __init__(
        self,
        store: ThreadStore,
        kernel: KernelClient,
        settings: Settings,
        clock: Callable[[], float],
        workspaces: Workspaces,
        slots: RunSlots,
        live: LiveRuns,
        adoption: Adoption,
        idle: IdleWatch,
    ) -> None:
        self.store = store
        self.kernel = kernel
        self.settings = settings
        self.clock = clock
        self.workspaces = workspaces
        self.slots = slots
        self.live = live
        self.adoption = adoption
        self.idle = idle

    def admit(self, run_input: RunInput, language: str) -> Admission:
        """Check and record a new run; raises AguiError (answered before the stream).

        The run first takes a slot among the ``max_runs`` concurrent runs, or is refused
        with ``SERVER_BUSY`` before anything is written or sent; the run's driver gives the
        slot back when its body is closed (``LiveRuns.ended``).
        """
        if not self.slots.take():
            log.warning("run %s refused: %d runs already active", run_input.run_id, self.settings.max_runs)
            raise AguiError(
                Code.SERVER_BUSY, msg.SERVER_BUSY, {"seconds": RETRY_AFTER_SECONDS, "retryAfter": RETRY_AFTER_SECONDS}
            )
        try:
            admission = self._admit(run_input, language)
        except BaseException:
            self.slots.give()
            raise
        self.idle.touch(run_input.thread_id)
        return admission

    def _admit(self, run_input: RunInput, language: str) -> Admission:
        props = run_input.props
        cwd = self.workspaces.resolve(props.cwd)
        if props.active_guidance:
            mode = Mode.GUIDANCE
        else:
            mode = Mode.TURN if run_input.resume is None else Mode.RESUME
        parts: list[dict[str, Any]] = []
        if mode is not Mode.RESUME:
            _, parts = build_user_parts(run_input.messages)
        digest = request_digest(run_input.raw)
        thread_id = run_input.thread_id
        try:
            run_lock = None if mode is Mode.GUIDANCE else self.store.try_lock_run(thread_id)
            if run_lock is None and mode is not Mode.GUIDANCE:
                run_lock = self._lock_after_leaving_run(thread_id)
        except StoreError as exc:
            log.error("thread %s: %s", thread_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        try:
            # a new turn with the thread in hand first adopts a run that died with its process
            adopt = mode is Mode.TURN and run_lock is not None
            lost: dict[str, bool] = {}  # the kernel's word on interrupted tasks, asked outside the lock
            while True:
                try:
                    with self.store.locked(thread_id):
                        record, stale_task_id = self._write_down(run_input, digest, run_lock, cwd, mode, lost, adopt)
                    break
                except _AskKernel as ask:
                    lost[ask.task_id] = ask_whether_lost(self.kernel, ask.task_id)
                except _Orphaned:
                    adopt = False
                    assert run_lock is not None
                    run_lock = self._after_adopting(thread_id, run_lock)
        except BaseException as exc:  # refused: the thread is given back at once
            if run_lock is not None:
                run_lock.release()
            if isinstance(exc, StoreError):
                log.error("thread %s: state unavailable: %s", thread_id, exc)
                raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
            raise
        return Admission(run_input, language, record, run_lock, mode, parts=parts, stale_task_id=stale_task_id)

    def _write_down(
        self,
        run_input: RunInput,
        digest: str,
        run_lock: RunLock | None,
        cwd: Any,
        mode: Mode,
        lost: dict[str, bool],
        adopt: bool = False,
    ) -> tuple[ThreadRecord, str | None]:
        """Under the record lock: the checks, then the admitted run written down; the record,
        and the task of the previous execution that may still run. Raises ``_AskKernel``
        when a check needs the kernel's word that ``lost`` does not have yet, and, with
        ``adopt``, ``_Orphaned`` when the record shows a run to adopt first (one read of the
        record serves both)."""
        props = run_input.props
        thread_id = run_input.thread_id
        record = self.store.load(thread_id)
        if adopt and record is not None and _orphan_possible(record):
            raise _Orphaned
        if record is None:
            if mode is not Mode.TURN:
                raise AguiError(Code.EXECUTION_LOST, msg.EXECUTION_LOST_NO_THREAD)
            record = ThreadRecord(
                thread_id=thread_id,
                context_id=context_id_for(thread_id),
                cwd=str(cwd),
                user_id=props.user_id,
                execution=Execution(
                    execution_id=str(process_local.uuid4()),
                    ros_invocation_id=props.ros_invocation_id,
                ),
            )
            fresh = True
        else:
            fresh = False
        self._check_admission(record, run_input, digest, run_lock, str(cwd), mode, lost)
        stale_task_id = None
        if mode is Mode.TURN and not fresh:
            if not record.execution.terminal:  # expired interrupts, or a run whose adapter died
                stale_task_id = record.execution.task_id
            record.start_execution(str(process_local.uuid4()), props.ros_invocation_id)
        record.remember_run(run_input.run_id, digest)
        RunBegan(run_input.run_id, rfc3339(self.clock()), run_mode_name(mode, props.run_mode)).apply(record)
        ensure_workspace(cwd)
        self.store.save(record)
        return record, stale_task_id

    def _after_adopting(self, thread_id: str, run_lock: RunLock) -> RunLock | None:
        """A new turn on a thread whose last execution is still live while no run holds the
        thread: its run's process died. The run is adopted (``adoption``) and holds the thread
        again, so the turn is THREAD_BUSY; if it ends at once (the kernel lost its task), or
        there was nothing to adopt, the turn goes on with the thread's run lock."""
        run_lock.release()
        if self.adoption.thread(thread_id):
            deadline = time.monotonic() + ADOPTED_END_WAIT_SECONDS
            while time.monotonic() < deadline:
                again = self.store.try_lock_run(thread_id)
                if again is not None:
                    return again
                time.sleep(0.02)
            return None
        return self.store.try_lock_run(thread_id)

    def _lock_after_leaving_run(self, thread_id: str) -> RunLock | None:
        """The thread's run lock, when the run holding it here is one whose client just hung
        up (a Stop, then a new message at once): that run ends and gives the thread back
        within moments, so the new run waits for it rather than being refused THREAD_BUSY.
        None at once when the holder's client is still there (or it runs in another process),
        or when the holder would go on without its client (a grace period, other readers)."""
        holders = self.live.holders(thread_id)

        def adopting() -> bool:  # adopted, the kernel not heard yet: the run may end at once
            return self.adoption.taking_over(thread_id) or any(d.settling() for d in holders)

        settling = adopting()
        if not settling and self.settings.disconnect_grace_seconds > 0:
            return self.store.try_lock_run(thread_id)  # the holder may have given it back since
        if not settling and not any([d.hung_up_now() for d in holders]):
            # a holder that gave the thread back since the first try is not listed any more
            return self.store.try_lock_run(thread_id)
        deadline = time.monotonic() + LEAVING_RUN_WAIT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.01)
            run_lock = self.store.try_lock_run(thread_id)
            if run_lock is not None:
                log.info("thread %s: the run holding it ended as its client left; admitting the next", thread_id)
                return run_lock
            if settling and not adopting():
                holders = self.live.holders(thread_id)
                if not adopting():
                    return None  # the adopted run heard from the kernel: it goes on, the thread is busy
        return None

    def _check_admission(
        self,
        record: ThreadRecord,
        run_input: RunInput,
        digest: str,
        run_lock: RunLock | None,
        cwd: str,
        mode: Mode,
        lost: dict[str, bool],
    ) -> None:
        props = run_input.props
        known = record.run_digests.get(run_input.run_id)
        if known is not None:
            if known == digest:
                raise AguiError(Code.DUPLICATE_RUN_ID, msg.DUPLICATE_RUN_ID)
            raise AguiError(Code.RUN_ID_CONFLICT, msg.RUN_ID_CONFLICT)
        if run_lock is None and mode is not Mode.GUIDANCE:
            raise AguiError(Code.THREAD_BUSY, msg.THREAD_BUSY)
        if cwd != record.cwd or props.user_id != record.user_id:
            raise AguiError(Code.THREAD_BINDING_CONFLICT, msg.THREAD_BINDING_CONFLICT)
        execution = record.execution
        if mode is Mode.TURN:
            if execution.waiting:
                if resume.first_expiry(execution.pending, self.clock()) is not None:
                    # Expired interrupts no longer hold the thread: the new turn replaces them.
                    log.info("thread %s: pending interrupts expired; starting a new turn", record.thread_id)
                elif _lost(execution.task_id, lost):
                    # Nobody can answer them any more (the kernel restarted): no dead end.
                    log.info("thread %s: the kernel lost the interrupted task; starting a new turn", record.thread_id)
                    record.retire_execution()
                else:
                    raise AguiError(Code.RESUME_REQUIRED, msg.RESUME_REQUIRED)
        elif mode is Mode.GUIDANCE:
            # Guidance steers a running pipeline: it needs one, and no interrupt may be waiting.
            if run_input.resume is not None or props.run_mode != "pipeline":
                raise AguiError(Code.EXECUTION_LOST, msg.EXECUTION_LOST_NO_THREAD)
            if not execution.task_id or execution.terminal:
                raise AguiError(Code.EXECUTION_LOST, msg.EXECUTION_LOST_NO_THREAD)
            if execution.pending:
                raise AguiError(Code.RESUME_REQUIRED, msg.RESUME_REQUIRED)
        elif props.ros_invocation_id != execution.ros_invocation_id:
            raise AguiError(Code.EXECUTION_LOST, msg.EXECUTION_LOST_MISMATCH)


def _lost(task_id: str | None, known: dict[str, bool]) -> bool:
    """The kernel's word on the task, asked outside the record lock (``_AskKernel``); a
    waiting execution without a task has nobody to answer it."""
    if not task_id:
        return True
    if task_id not in known:
        raise _AskKernel(task_id)
    return known[task_id]
