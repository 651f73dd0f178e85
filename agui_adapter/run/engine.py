"""Runs: admitting a run, handing it to its machine and driver, and the cancel extension.

Admission happens under the thread's record lock: the run lock is taken, the record
is read from disk, the contract's checks run in upstream's order (duplicate run id,
busy thread, binding conflict, pending interrupts), and the admitted run is written
down before the first byte is sent. What the run then does is decided by
``run_machine`` (the order rules live there) and carried out by ``run_driver``.

Before any of that, a run takes one of the process's ``max_runs`` slots (turns, resumes
and guidance alike), or is refused with ``SERVER_BUSY`` having touched nothing; the slot
is given back when the run's body is closed. The count is per process.

A new run on a thread held by a run of this process whose client has just hung up (a Stop,
then the next message at once) waits a moment for that run to end and give the thread back,
instead of being refused ``THREAD_BUSY`` (``_lock_after_leaving_run``).

A new turn on a thread whose last run died with its process (its execution still live, no run
holding the thread) first has that run adopted (``adoption``): it holds the thread again and the
turn is ``THREAD_BUSY``, unless it ends at once (its task is gone). A reattach adopts the run it
names when its process is gone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.config import Settings
from agui_adapter.kernel_client.a2a import KernelClient, KernelRejected, KernelUnavailable
from agui_adapter.ops.idle import IdleWatch
from agui_adapter.ops.metrics import Metrics
from agui_adapter.ops.tracing import Tracing
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.content import build_user_parts
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.validation import RunInput, request_digest
from agui_adapter.run import resume
from agui_adapter.run.adoption import Adoption
from agui_adapter.run.driver import RunDriver
from agui_adapter.run.effects import Mode
from agui_adapter.run.interrupts import rfc3339
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.translation import TERMINAL_STATES, inspect_frame
from agui_adapter.state.journal import JournalReader, JournalStore, ReplayUnavailable, RunNotFound
from agui_adapter.state.record import Execution, RetireExecution, RunBegan, ThreadRecord
from agui_adapter.state.store import RunLock, StoreError, ThreadStore
from agui_adapter.state.workspace import Workspaces, ensure_workspace

log = logging.getLogger("agui_adapter.run.engine")

#: How long a reattach waits for the journal of a run of this process that has just started.
JOURNAL_WAIT_SECONDS = 2.0
#: What a run refused with SERVER_BUSY is told to wait (``Retry-After``, seconds).
RETRY_AFTER_SECONDS = 2
#: How long a new run on a busy thread waits for the run holding it when that run's client
#: has just hung up (it is ending and giving the thread back), before THREAD_BUSY.
LEAVING_RUN_WAIT_SECONDS = 2.0
#: How long a new turn waits for a run it made adopt to end by itself (its task was gone).
ADOPTED_END_WAIT_SECONDS = 2.0


def context_id_for(thread_id: str) -> str:
    return "agui-" + hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:40]


def run_mode_name(mode: Mode, run_mode: str | None) -> str:
    """What ``GET /threads/{threadId}`` calls a run: turn, resume, guidance or pipeline."""
    return "pipeline" if mode is Mode.TURN and run_mode == "pipeline" else mode.value


@dataclass
class Admission:
    """An admitted run, holding its thread's run lock until it ends."""

    run_input: RunInput
    language: str
    record: ThreadRecord
    run_lock: RunLock | None  # None for guidance, which never holds the thread
    mode: Mode
    parts: list[dict[str, Any]] = field(default_factory=list)
    stale_task_id: str | None = None  # a task of the thread's previous execution that may still run
    trace: Any = None  # the run's span (``tracing``), set by the HTTP edge

    @property
    def run_mode(self) -> str:
        """The run's mode as operators see it: turn, resume, guidance, or pipeline (a pipeline's turn)."""
        if self.mode is Mode.TURN and self.run_input.props.run_mode == "pipeline":
            return "pipeline"
        return self.mode.value

    @property
    def thread_id(self) -> str:
        return self.run_input.thread_id

    @property
    def run_id(self) -> str:
        return self.run_input.run_id


class RunEngine:
    """Admits runs and streams them; one instance per adapter process."""

    def __init__(
        self,
        store: ThreadStore,
        kernel: KernelClient,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        env: dict[str, str] | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
        adopt_orphans: bool = True,
    ) -> None:
        self.store = store
        self.kernel = kernel
        self.settings = settings
        self.clock = clock
        self.metrics = metrics if metrics is not None else Metrics()
        self.tracing = tracing if tracing is not None else Tracing()
        self._env = dict(os.environ if env is None else env)
        self._live: set[RunDriver] = set()  # runs whose body is open; each holds a run slot
        self._live_lock = threading.Lock()
        if settings.allowed_cwds:
            self._env["IAC_CODE_AGUI_ALLOWED_CWDS"] = settings.allowed_cwds
        self._run_slots = threading.BoundedSemaphore(settings.max_runs)
        self.idle = IdleWatch()  # runs admitted and ended, for --idle-shutdown (``idle.py``)
        self.workspaces = Workspaces(self._env, reserved=(store.root,))
        self.journals = JournalStore(
            store.root,
            retention_seconds=settings.replay_retention_seconds,
            buffer_bytes=settings.replay_buffer_bytes,
        )
        self.adoption = Adoption(self)
        if adopt_orphans:  # runs whose process died or handed them over: adopted here (``adoption``)
            self.adoption.start()

    # ================================================================== admission
    def admit(self, run_input: RunInput, language: str) -> Admission:
        """Check and record a new run; raises AguiError (answered before the stream).

        The run first takes a slot among the ``max_runs`` concurrent runs, or is refused
        with ``SERVER_BUSY`` before anything is written or sent; the run's driver gives the
        slot back when its body is closed (``run_ended``).
        """
        if not self._run_slots.acquire(blocking=False):
            log.warning("run %s refused: %d runs already active", run_input.run_id, self.settings.max_runs)
            raise AguiError(
                Code.SERVER_BUSY, msg.SERVER_BUSY, {"seconds": RETRY_AFTER_SECONDS, "retryAfter": RETRY_AFTER_SECONDS}
            )
        try:
            admission = self._admit(run_input, language)
        except BaseException:
            self._run_slots.release()
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
            if mode is Mode.TURN and run_lock is not None and self._orphan_possible(thread_id):
                run_lock = self._after_adopting(thread_id, run_lock)
            with self.store.locked(thread_id):
                record = self.store.load(thread_id)
                if record is None:
                    if mode is not Mode.TURN:
                        raise AguiError(Code.EXECUTION_LOST, msg.EXECUTION_LOST_NO_THREAD)
                    record = ThreadRecord(
                        thread_id=thread_id,
                        context_id=context_id_for(thread_id),
                        cwd=str(cwd),
                        user_id=props.user_id,
                        execution=Execution(
                            execution_id=str(uuid.uuid4()),
                            ros_invocation_id=props.ros_invocation_id,
                        ),
                    )
                    fresh = True
                else:
                    fresh = False
                self._check_admission(record, run_input, digest, run_lock, str(cwd), mode)
                stale_task_id = None
                if mode is Mode.TURN and not fresh:
                    if not record.execution.terminal:  # expired interrupts, or a run whose adapter died
                        stale_task_id = record.execution.task_id
                    record.start_execution(str(uuid.uuid4()), props.ros_invocation_id)
                record.remember_run(run_input.run_id, digest)
                RunBegan(run_input.run_id, rfc3339(self.clock()), run_mode_name(mode, props.run_mode)).apply(record)
                ensure_workspace(cwd)
                self.store.save(record)
        except BaseException as exc:  # refused: the thread is given back at once
            if run_lock is not None:
                run_lock.release()
            if isinstance(exc, StoreError):
                log.error("thread %s: state unavailable: %s", thread_id, exc)
                raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
            raise
        return Admission(run_input, language, record, run_lock, mode, parts=parts, stale_task_id=stale_task_id)

    def _orphan_possible(self, thread_id: str) -> bool:
        """Whether the thread's execution is live although no run holds the thread (we do):
        the run of it died with its process, and may be adopted."""
        record = self.store.load(thread_id)
        if record is None:
            return False
        live = record.execution
        return bool(live.task_id) and not live.terminal and not live.waiting

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

    def take_run_slot(self) -> bool:
        return self._run_slots.acquire(blocking=False)

    def give_run_slot(self) -> None:
        self._run_slots.release()

    def register_adopted(self, driver: RunDriver) -> None:
        """An adopted run (``adoption``) counts among the live runs and holds its slot."""
        with self._live_lock:
            self._live.add(driver)
        self.metrics.run_opened()
        self.metrics.adopted()

    def _lock_after_leaving_run(self, thread_id: str) -> RunLock | None:
        """The thread's run lock, when the run holding it here is one whose client just hung
        up (a Stop, then a new message at once): that run ends and gives the thread back
        within moments, so the new run waits for it rather than being refused THREAD_BUSY.
        None at once when the holder's client is still there (or it runs in another process),
        or when the holder would go on without its client (a grace period, other readers)."""
        with self._live_lock:
            holders = [d for d in self._live if d.thread_id == thread_id and d.holds_thread]

        def adopting() -> bool:  # adopted, the kernel not heard yet: the run may end at once
            return self.adoption.taking_over(thread_id) or any(d.settling() for d in holders)

        settling = adopting()
        if not settling and self.settings.disconnect_grace_seconds > 0:
            return None
        if not settling and not any([d.hung_up_now() for d in holders]):
            return None
        deadline = time.monotonic() + LEAVING_RUN_WAIT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.01)
            run_lock = self.store.try_lock_run(thread_id)
            if run_lock is not None:
                log.info("thread %s: the run holding it ended as its client left; admitting the next", thread_id)
                return run_lock
            if settling and not adopting():
                with self._live_lock:
                    holders = [d for d in self._live if d.thread_id == thread_id and d.holds_thread]
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
                elif self._kernel_lost(execution.task_id):
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

    # ================================================================== reattach
    def reattach(
        self, thread_id: str, run_id: str, after: int, digest: str | None = None, *, attach: bool = True
    ) -> JournalReader | None:
        """A reader of the run's events after id ``after``, attached among the run's readers
        (any number follow a run at once; none ends another).

        With ``digest`` (``POST /`` with ``Last-Event-ID``): None when the thread never saw
        that run id (the request is then a new run, the header ignored), RUN_ID_CONFLICT
        when the run had another body. RUN_NOT_FOUND for a run whose journal is gone or
        never was; REPLAY_UNAVAILABLE when the events after ``after`` fell out of it.
        Without ``attach`` (a HEAD, or a look before answering 204) the reader is not attached:
        ``attach_reader`` does it.
        """
        if digest is not None:
            try:
                record = self.store.load(thread_id)
            except StoreError as exc:
                log.error("thread %s: %s", thread_id, exc)
                raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
            known = record.run_digests.get(run_id) if record is not None else None
            if known is None:
                return None
            if known != digest:
                raise AguiError(Code.RUN_ID_CONFLICT, msg.RUN_ID_CONFLICT)
        try:
            try:
                reader = self.journals.open_reader(thread_id, run_id, after)
            except RunNotFound:
                if not self._journal_coming(thread_id, run_id):
                    raise
                reader = self.journals.open_reader(thread_id, run_id, after)
        except RunNotFound:
            raise AguiError(Code.RUN_NOT_FOUND, msg.RUN_NOT_FOUND) from None
        except ReplayUnavailable:
            raise AguiError(Code.REPLAY_UNAVAILABLE, msg.REPLAY_UNAVAILABLE) from None
        except OSError as exc:
            log.error("run %s: journal unreadable: %s", run_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        if not reader.ended:
            self.adoption.run(thread_id, run_id)  # an orphan: adopted now, so the reader follows it live
        if not attach:
            return reader
        self.attach_reader(thread_id, run_id, reader)
        return reader

    def _journal_coming(self, thread_id: str, run_id: str) -> bool:
        """Whether the run is live here and its journal was made after a short wait: a run's
        journal is made just after its RUN_STARTED went out (while the kernel answers)."""
        with self._live_lock:
            driver = next((d for d in self._live if d.run_id == run_id and d.thread_id == thread_id), None)
        return driver is not None and driver.journal_made.wait(JOURNAL_WAIT_SECONDS)

    def attach_reader(self, thread_id: str, run_id: str, reader: JournalReader) -> None:
        """Count the reader among the run's readers (the run goes on while one follows it)."""
        try:
            reader.attach()
        except OSError as exc:
            reader.close()
            log.error("run %s: journal unreadable: %s", run_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        self.metrics.reattached()
        log.info("run %s on thread %s reattached after event %d", run_id, thread_id, reader.after)

    # ================================================================== streaming
    def stream(self, admission: Admission, client_gone: Callable[[], bool] | None = None) -> RunDriver:
        """The SSE body of an admitted run (a WSGI iterable with ``close()``); ``client_gone``,
        when the server offers it, tells the run its client hung up while it waits."""
        machine = RunMachine(
            admission.run_input,
            mode=admission.mode,
            record=admission.record,
            language=admission.language,
            parts=admission.parts,
            interrupt_ttl_seconds=self.settings.interrupt_ttl_seconds,
            stale_task_id=admission.stale_task_id,
        )
        driver = RunDriver(self, admission, machine, client_gone)
        with self._live_lock:
            self._live.add(driver)
        self.metrics.run_opened()
        return driver

    def run_ended(self, driver: RunDriver) -> None:
        """A run's body was closed: it leaves the live runs and gives its slot back."""
        with self._live_lock:
            live = driver in self._live
            self._live.discard(driver)
        if live:  # once per run, however often its body is closed
            self.metrics.run_closed()
            self._run_slots.release()
            self.idle.touch()

    def live_driver(self, thread_id: str) -> RunDriver | None:
        """This process's live run of the thread: the one holding it, else a guidance run."""
        with self._live_lock:
            drivers = [d for d in self._live if d.thread_id == thread_id and not d.machine.ended]
        drivers.sort(key=lambda d: d.machine.mode is Mode.GUIDANCE)
        return drivers[0] if drivers else None

    def live_runs(self) -> int:
        with self._live_lock:
            return len(self._live)

    def shut_down_runs(self, grace_seconds: float, flush_seconds: float = 5.0, *, hand_over: bool = False) -> int:
        """Graceful shutdown: let the live runs end by themselves for ``grace_seconds``,
        then end the others with their final event, or with ``hand_over`` leave them running
        in the kernel for the next process to adopt; how many had to be ended or handed over."""
        deadline = time.monotonic() + grace_seconds
        while self.live_runs() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._live_lock:
            remaining = list(self._live)
        for driver in remaining:
            driver.shut_down(hand_over=hand_over)
        deadline = time.monotonic() + flush_seconds
        while self.live_runs() and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(remaining)

    # ================================================================== cancel
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
        self._free_thread_of(execution_id)
        log.info("execution %s on thread %s cancelled", execution_id, thread_id)
        return "cancelled"

    def _free_thread_of(self, execution_id: str) -> None:
        """A live run of a cancelled execution (here) gives its thread back now."""
        with self._live_lock:
            drivers = [d for d in self._live if d.machine.execution_id == execution_id]
        for driver in drivers:
            driver.release_now()

    def _kernel_lost(self, task_id: str | None) -> bool:
        """Whether the kernel says the task is gone (unknown, or ended); a kernel that does
        not answer has not lost anything."""
        if not task_id:
            return True
        try:
            task = self.kernel.get_task(task_id, timeout=5.0)
        except KernelRejected as exc:
            return exc.rpc_code == -32001
        except KernelUnavailable:
            return False
        return inspect_frame({"result": task}).state in TERMINAL_STATES

    def cancel_task_quietly(self, task_id: str) -> None:
        try:
            self.kernel.cancel_task(task_id)
        except KernelRejected as exc:
            log.info("CancelTask %s: %s", task_id, exc.detail)
        except KernelUnavailable as exc:
            log.warning("CancelTask %s failed: %s", task_id, exc)
