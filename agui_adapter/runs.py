"""Runs: the only module that knows the order of things.

Admission happens under the thread's record lock: the run lock is taken, the record
is read from disk, the contract's checks run in upstream's order (duplicate run id,
busy thread, binding conflict, pending interrupts), and the admitted run is written
down before the first byte is sent. Then the run streams: ``RUN_STARTED`` at once, the
kernel's frames translated as they arrive (one chunk per wake-up, heartbeats while the
kernel is silent), durable writes exactly where the contract needs them (task and
session ids known, interrupt, terminal), and the thread released *before* the final
event is written, so a client that reacts to ``RUN_FINISHED`` at once is never told
THREAD_BUSY. A client that goes away during a live run gets its kernel task cancelled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from . import events as ev
from . import interrupts as intr
from . import messages as msg
from . import outbound, resume
from .a2a import FrameReader, KernelClient, KernelRejected, KernelStream, KernelUnavailable, SnapshotStream
from .config import Settings
from .content import build_user_parts
from .errors import AguiError, clip_detail
from .i18n import translate
from .pipeline import PipelineProgress
from .pump import KernelPump
from .store import Execution, RunLock, StoreError, ThreadRecord, ThreadStore
from .translate import SESSION_EVENT, FrameInfo, RunTranslator, inspect_frame
from .validation import RunInput, request_digest
from .workspace import allowed_roots, ensure_workspace, resolve_workspace

log = logging.getLogger("agui_adapter.runs")


def context_id_for(thread_id: str) -> str:
    return "agui-" + hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:40]


@dataclass
class Admission:
    """An admitted run, holding its thread's run lock until it ends."""

    run_input: RunInput
    language: str
    record: ThreadRecord
    run_lock: RunLock | None  # None for guidance, which never holds the thread
    mode: str  # "turn" | "resume" | "guidance"
    parts: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)

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
    ) -> None:
        self.store = store
        self.kernel = kernel
        self.settings = settings
        self.clock = clock
        self._env = dict(os.environ if env is None else env)
        if settings.allowed_cwds:
            self._env["IAC_CODE_AGUI_ALLOWED_CWDS"] = settings.allowed_cwds

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def allowed_roots(self) -> list[Path]:
        return allowed_roots(self._env, os.getcwd(), tempfile.gettempdir())

    # ================================================================== admission
    def admit(self, run_input: RunInput, language: str) -> Admission:
        """Check and record a new run; raises AguiError (answered before the stream)."""
        props = run_input.props
        cwd = resolve_workspace(props.cwd, self.allowed_roots(), reserved=(self.store.root,))
        if props.active_guidance:
            mode = "guidance"
        else:
            mode = "turn" if run_input.resume is None else "resume"
        parts: list[dict[str, Any]] = []
        if mode != "resume":
            _, parts = build_user_parts(run_input.messages)
        digest = request_digest(run_input.raw)
        thread_id = run_input.thread_id
        expired_task: list[str] = []
        try:
            run_lock = None if mode == "guidance" else self.store.try_lock_run(thread_id)
        except StoreError as exc:
            log.error("thread %s: %s", thread_id, exc)
            raise AguiError("STATE_UNAVAILABLE", msg.STATE_UNAVAILABLE) from None
        try:
            with self.store.locked(thread_id):
                record = self.store.load(thread_id)
                if record is None:
                    if mode != "turn":
                        raise AguiError("EXECUTION_LOST", msg.EXECUTION_LOST_NO_THREAD)
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
                self._check_admission(record, run_input, digest, run_lock, str(cwd), mode, expired_task)
                if mode == "turn" and not fresh:
                    self._rotate(record, props.ros_invocation_id)
                record.remember_run(run_input.run_id, digest)
                ensure_workspace(cwd)
                self.store.save(record)
        except AguiError:
            if run_lock is not None:
                run_lock.release()
            raise
        except StoreError as exc:
            if run_lock is not None:
                run_lock.release()
            log.error("thread %s: state unavailable: %s", thread_id, exc)
            raise AguiError("STATE_UNAVAILABLE", msg.STATE_UNAVAILABLE) from None
        except BaseException:
            if run_lock is not None:
                run_lock.release()
            raise
        for task_id in filter(None, expired_task):
            self.cancel_task_quietly(task_id)
        return Admission(run_input, language, record, run_lock, mode, parts=parts)

    def _check_admission(
        self,
        record: ThreadRecord,
        run_input: RunInput,
        digest: str,
        run_lock: RunLock | None,
        cwd: str,
        mode: str,
        expired_task: list[str],
    ) -> None:
        props = run_input.props
        known = record.run_digests.get(run_input.run_id)
        if known is not None:
            if known == digest:
                raise AguiError("DUPLICATE_RUN_ID", msg.DUPLICATE_RUN_ID)
            raise AguiError("RUN_ID_CONFLICT", msg.RUN_ID_CONFLICT)
        if run_lock is None and mode != "guidance":
            raise AguiError("THREAD_BUSY", msg.THREAD_BUSY)
        if cwd != record.cwd or props.user_id != record.user_id:
            raise AguiError("THREAD_BINDING_CONFLICT", msg.THREAD_BINDING_CONFLICT)
        execution = record.execution
        if mode == "turn":
            if execution.pending and not execution.terminal:
                if resume.first_expiry(execution.pending, self.clock()) is None:
                    raise AguiError("RESUME_REQUIRED", msg.RESUME_REQUIRED)
                # Expired interrupts no longer hold the thread: the new turn replaces them.
                log.info("thread %s: pending interrupts expired; starting a new turn", record.thread_id)
                expired_task.append(execution.task_id or "")
        elif mode == "guidance":
            # Guidance steers a running pipeline: it needs one, and no interrupt may be waiting.
            if run_input.resume is not None or props.run_mode != "pipeline":
                raise AguiError("EXECUTION_LOST", msg.EXECUTION_LOST_NO_THREAD)
            if not execution.task_id or execution.terminal:
                raise AguiError("EXECUTION_LOST", msg.EXECUTION_LOST_NO_THREAD)
            if execution.pending:
                raise AguiError("RESUME_REQUIRED", msg.RESUME_REQUIRED)
        elif props.ros_invocation_id != execution.ros_invocation_id:
            raise AguiError("EXECUTION_LOST", msg.EXECUTION_LOST_MISMATCH)

    @staticmethod
    def _rotate(record: ThreadRecord, ros_invocation_id: str) -> None:
        """A new turn: a new execution in the same context and session."""
        if not record.execution.terminal:
            record.retire_execution()
        record.execution = Execution(execution_id=str(uuid.uuid4()), ros_invocation_id=ros_invocation_id)

    # ================================================================== streaming
    def stream(self, admission: Admission) -> Iterable[bytes]:
        """The SSE body of an admitted run (a WSGI iterable with ``close()``)."""
        return _StreamBody(_RunStream(self, admission))

    def persist(self, thread_id: str, mutate: Callable[[ThreadRecord], None]) -> ThreadRecord:
        record = self.store.update(thread_id, mutate)
        if record is None:
            raise StoreError("the thread state disappeared")
        return record

    # ================================================================== cancel
    def cancel_execution(self, thread_id: str, ros_invocation_id: str, execution_id: str) -> str:
        """The cancel extension: ``cancelled`` or ``already_terminal``; else EXECUTION_NOT_FOUND."""
        not_found = AguiError("EXECUTION_NOT_FOUND", msg.EXECUTION_NOT_FOUND)
        try:
            record = self.store.load(thread_id)
        except StoreError as exc:
            log.error("cancel on thread %s: %s", thread_id, exc)
            raise AguiError("STATE_UNAVAILABLE", msg.STATE_UNAVAILABLE) from None
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
                raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE) from None

        def retire(current: ThreadRecord) -> None:
            if current.execution.execution_id == execution_id:
                current.retire_execution()

        try:
            self.persist(thread_id, retire)
        except StoreError as exc:
            log.error("cancel on thread %s: %s", thread_id, exc)
            raise AguiError("STATE_UNAVAILABLE", msg.STATE_UNAVAILABLE) from None
        log.info("execution %s on thread %s cancelled", execution_id, thread_id)
        return "cancelled"

    def cancel_task_quietly(self, task_id: str) -> None:
        try:
            self.kernel.cancel_task(task_id)
        except KernelRejected as exc:
            log.info("CancelTask %s: %s", task_id, exc.detail)
        except KernelUnavailable as exc:
            log.warning("CancelTask %s failed: %s", task_id, exc)


class _RunStream:
    """One run's stream; lives on the WSGI worker thread (plus one pump thread)."""

    def __init__(self, engine: RunEngine, admission: Admission) -> None:
        self.engine = engine
        self.adm = admission
        self.record = admission.record
        self.execution_id = admission.record.execution.execution_id
        execution = admission.record.execution
        self.translator = RunTranslator(
            admission.thread_id,
            admission.run_id,
            id_namespace=_run_tag(admission.run_id) if admission.mode == "resume" else None,
            prior_text_digests=execution.text_digests if admission.mode == "resume" else (),
            pipeline=PipelineProgress.from_json(execution.pipeline) if admission.mode == "resume" else None,
        )
        # resume: answers still to send, the one whose stream is being read, tool results owed
        self.answers: list[resume.Answer] = []
        self.current_answer: resume.Answer | None = None
        self.accepted_results: list[tuple[str, str]] = []
        self.new_inputs: list[dict[str, Any]] = []
        self.sideband_ids: set[str] = set()
        self.pump: KernelPump | None = None
        self.reader = FrameReader()
        self.task_id = admission.record.execution.task_id
        self.session_id = admission.record.session_id
        self.session_emitted = False
        self.finished = False
        self.last_state: str | None = None
        self.failed = False
        self.canceled = False

    def _t(self, template: str, **params: Any) -> str:
        return translate(self.adm.language, template, **params)

    # ------------------------------------------------------------------ main loop
    def body(self) -> Iterator[bytes]:
        adm = self.adm
        now = self.engine._now_ms()
        first = ev.run_started(now, adm.thread_id, adm.run_id, adm.run_input.parent_run_id)
        try:
            yield ev.encode(first)
            out: list[dict[str, Any]] = []
            try:
                self._start(out)
            except AguiError as term:
                yield self._end_with_error(out, term)
                return
            if out:
                yield ev.encode_many(out)
            heartbeat = self.engine.settings.heartbeat_seconds
            assert self.pump is not None
            while True:
                try:
                    items = self.pump.get(timeout=heartbeat)
                except Empty:
                    yield ev.HEARTBEAT
                    continue
                out = []
                try:
                    done = self._consume(items, out)
                except AguiError as term:
                    yield self._end_with_error(out, term)
                    return
                if done is not None:
                    yield done
                    return
                if out:
                    yield ev.encode_many(out)
        finally:
            if not self.finished:
                self._abandon()
            if self.pump is not None:
                self.pump.stop()

    def _start(self, out: list[dict[str, Any]]) -> None:
        adm = self.adm
        if adm.mode == "resume":
            self._start_resume(out)
            return
        # A new turn starts a task; guidance is sent into the running pipeline task.
        message = outbound.user_turn(
            message_id=f"agui-{adm.mode}-{uuid.uuid4().hex}",
            context_id=self.record.context_id,
            parts=adm.parts,
            metadata=outbound.turn_metadata(adm.run_input.props, self.record.cwd, adm.language),
            task_id=self.task_id if adm.mode == "guidance" else None,
        )
        self._open(lambda: self.engine.kernel.send_streaming_message(message))

    def _open(self, open_stream: Callable[[], KernelStream | SnapshotStream]) -> None:
        self.reader = FrameReader()
        self.pump = KernelPump(open_stream, name=f"kernel-pump-{self.adm.run_id[:16]}")
        self.pump.start()

    def _consume(self, items: list[tuple[str, Any]], out: list[dict[str, Any]]) -> bytes | None:
        """Translate queued items; returns the final chunk when the run ends."""
        ts = self.engine._now_ms()
        for kind, payload in items:
            if kind == "bytes":
                for frame in self.reader.feed(payload):
                    final = self._on_frame(frame, ts, out)
                    if final is not None:
                        return final
            elif kind == "end":
                for frame in self.reader.close():
                    final = self._on_frame(frame, ts, out)
                    if final is not None:
                        return final
                if self.adm.mode == "guidance":
                    raise AguiError("A2A_UNAVAILABLE", msg.RESUME_NOT_ACCEPTED)
                if self.current_answer is not None and not self.current_answer.accepted:
                    raise AguiError("A2A_UNAVAILABLE", msg.RESUME_NOT_ACCEPTED)
                if self.answers and not (self.failed or self.canceled):
                    self._send_next_answer()
                    return None
                return self._on_end(ts, out)
            elif kind == "rejected":
                raise self._rejection(payload)
            else:  # unavailable
                log.warning("run %s: kernel unavailable: %s", self.adm.run_id, payload)
                self._cancel_unrecoverable()
                raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE)
        return None

    def _rejection(self, exc: KernelRejected, *, answering: bool = False) -> AguiError:
        """The RUN_ERROR for a JSON-RPC error: a retryable backup wait, a refused answer
        (the interrupt stays pending), or a refused request."""
        data = exc.data
        if isinstance(data, dict) and data.get("code") == "SESSION_BACKUP_NOT_READY":
            return AguiError("SESSION_BACKUP_NOT_READY", msg.SESSION_BACKUP_NOT_READY)
        log.warning("run %s: the kernel rejected the request: %s", self.adm.run_id, exc)
        if answering or (self.current_answer is not None and not self.current_answer.accepted):
            return AguiError("A2A_UNAVAILABLE", msg.RESUME_REJECTED)
        return AguiError("A2A_EXECUTION_FAILED", msg.A2A_REJECTED, {"detail": clip_detail(exc.detail)})

    # ------------------------------------------------------------------ frames
    def _on_frame(self, frame: Any, ts: int, out: list[dict[str, Any]]) -> bytes | None:
        info = inspect_frame(frame)
        if info.kind == "error":
            raise self._rejection(KernelRejected(info.error or {}))
        if info.kind == "unknown":
            log.warning("run %s: ignoring an unrecognised kernel frame", self.adm.run_id)
            return None
        if self.adm.mode == "guidance":
            return self._on_guidance_frame(info, ts, out)
        self._check_identity(info)
        if self.current_answer is not None and not self.current_answer.accepted:
            self._accept(self.current_answer)
        if not self.session_emitted and self.task_id and self.session_id:
            out.append(self._session_event(ts))
        for tool_id, content in self.accepted_results:
            self.translator.emit_tool_result(tool_id, content, ts, out)
        self.accepted_results.clear()
        out.extend(self.translator.map(info, ts))
        if info.state:
            self.last_state = info.state
            if info.state in ("failed", "rejected", "auth-required"):
                self.failed = True
            elif info.state == "canceled":
                self.canceled = True
        if info.inputs and info.state == "input-required":
            waiting = {a.interrupt_id for a in self.answers}
            fresh = [i for i in info.inputs if i.get("inputId") not in waiting and not self._applied(i)]
            self.sideband_ids.update(intr.sideband_ids(info.iac))
            if fresh and not self.answers:
                return self._interrupt(fresh, ts, out)
            self.new_inputs.extend(i for i in fresh if i not in self.new_inputs)
        return None

    def _on_guidance_frame(self, info: FrameInfo, ts: int, out: list[dict[str, Any]]) -> bytes:
        """Guidance only needs the kernel to take the message; the pipeline's own run shows the rest."""
        if info.task_id and info.task_id != self.task_id:
            raise AguiError("A2A_PROTOCOL_ERROR", msg.TASK_IDENTITY_CHANGED)
        if info.context_id and info.context_id != self.record.context_id:
            raise AguiError("A2A_PROTOCOL_ERROR", msg.CONTEXT_IDENTITY_CHANGED)
        if info.state in ("failed", "rejected", "auth-required"):
            raise AguiError("A2A_EXECUTION_FAILED", msg.A2A_EXECUTION_FAILED)
        if info.state == "canceled":
            raise AguiError("CANCELLED", msg.CANCELLED)
        out.extend(self.translator.finish(ts, {"type": "success"}))
        self._settle(retire=False)
        return ev.encode_many(out)

    def _applied(self, kernel_input: dict[str, Any]) -> bool:
        input_id = kernel_input.get("inputId")
        return isinstance(input_id, str) and self.record.applied_digest(self.execution_id, input_id) is not None

    def _check_identity(self, info: FrameInfo) -> None:
        updates: dict[str, str] = {}
        if info.task_id:
            if self.task_id is None:
                self.task_id = updates["task_id"] = info.task_id
            elif info.task_id != self.task_id:
                raise AguiError("A2A_PROTOCOL_ERROR", msg.TASK_IDENTITY_CHANGED)
        if info.context_id and info.context_id != self.record.context_id:
            raise AguiError("A2A_PROTOCOL_ERROR", msg.CONTEXT_IDENTITY_CHANGED)
        if info.session_id:
            if self.session_id is None:
                self.session_id = updates["session_id"] = info.session_id
            elif info.session_id != self.session_id:
                raise AguiError("A2A_PROTOCOL_ERROR", msg.SESSION_IDENTITY_CHANGED)
        if not updates:
            return
        execution_id = self.execution_id

        cancelled_early: list[bool] = []

        def record_ids(record: ThreadRecord) -> None:
            if "task_id" in updates and record.execution.execution_id == execution_id:
                record.execution.task_id = updates["task_id"]
                if record.execution.terminal:  # cancelled before the kernel named its task
                    cancelled_early.append(True)
            if "session_id" in updates and record.session_id is None:
                record.session_id = updates["session_id"]

        try:
            self.engine.persist(self.adm.thread_id, record_ids)
        except StoreError as exc:
            log.error("run %s: cannot persist the mapping: %s", self.adm.run_id, exc)
            self._cancel_and_retire()
            template = msg.MAPPING_NOT_COMMITTED if "task_id" in updates else msg.SESSION_MAPPING_NOT_COMMITTED
            raise AguiError("STATE_PERSISTENCE_FAILED", template) from None
        if cancelled_early and self.task_id:
            self.engine.cancel_task_quietly(self.task_id)

    def _session_event(self, ts: int) -> dict[str, Any]:
        self.session_emitted = True
        value: dict[str, Any] = {
            "schemaVersion": 1,
            "threadId": self.adm.thread_id,
            "aguiRunId": self.adm.run_id,
            "executionId": self.execution_id,
            "contextId": self.record.context_id,
            "rosInvocationId": self.adm.run_input.props.ros_invocation_id,
        }
        if self.task_id:
            value["taskId"] = self.task_id
        if self.session_id:
            value["sessionId"] = self.session_id
        return ev.custom(ts, SESSION_EVENT, value)

    # ------------------------------------------------------------------ endings
    def _on_end(self, ts: int, out: list[dict[str, Any]]) -> bytes:
        if self.new_inputs and not (self.failed or self.canceled):
            inputs, self.new_inputs = self.new_inputs, []
            return self._interrupt(inputs, ts, out)
        self._fill_pipeline_gaps(ts, out)
        if not self.session_emitted and self.task_id:
            out.append(self._session_event(ts))
        if self.canceled:
            raise AguiError("CANCELLED", msg.CANCELLED)
        if self.failed or self.last_state not in ("completed", "input-required"):
            detail = self.translator.failure_detail
            if detail:
                raise AguiError(
                    "A2A_EXECUTION_FAILED", msg.A2A_EXECUTION_FAILED_DETAIL, {"detail": clip_detail(detail)}
                )
            raise AguiError("A2A_EXECUTION_FAILED", msg.A2A_EXECUTION_FAILED)
        out.extend(self.translator.finish(ts, {"type": "success"}))
        self._settle(retire=True)
        return ev.encode_many(out)

    def _end_with_error(self, out: list[dict[str, Any]], term: AguiError) -> bytes:
        ts = self.engine._now_ms()
        out.extend(self.translator.fail(ts, term.code, self._t(term.message, **term.params)))
        self._settle(retire=self.adm.mode != "guidance" and not self._has_pending())
        return ev.encode_many(out)

    def _has_pending(self) -> bool:
        try:
            record = self.engine.store.load(self.adm.thread_id)
        except StoreError:
            return False
        return bool(
            record
            and record.execution.execution_id == self.execution_id
            and record.execution.pending
            and not record.execution.terminal
        )

    def _settle(self, *, retire: bool) -> None:
        """The run is over: persist its end (best effort), then release the thread."""
        self.finished = True
        if self.pump is not None:
            self.pump.stop()
        if retire:
            execution_id = self.execution_id

            def retire_execution(record: ThreadRecord) -> None:
                if record.execution.execution_id == execution_id and not record.execution.pending:
                    record.retire_execution()

            try:
                self.engine.persist(self.adm.thread_id, retire_execution)
            except StoreError as exc:
                log.warning("run %s: could not record its end: %s", self.adm.run_id, exc)
        if self.adm.run_lock is not None:
            self.adm.run_lock.release()

    def _cancel_and_retire(self) -> None:
        """Fail closed: stop the kernel work and forget what cannot be resumed."""
        if self.task_id:
            self.engine.cancel_task_quietly(self.task_id)
        execution_id = self.execution_id

        def retire(record: ThreadRecord) -> None:
            if record.execution.execution_id == execution_id:
                record.retire_execution()

        try:
            self.engine.persist(self.adm.thread_id, retire)
        except StoreError:
            pass

    def _cancel_unrecoverable(self) -> None:
        if self.adm.mode != "guidance" and not self._has_pending():
            self._cancel_and_retire()

    def _abandon(self) -> None:
        """The client went away (or the server is stopping) during a live run."""
        self.finished = True
        if self.adm.mode == "guidance":  # the pipeline belongs to its own run
            return
        log.info("run %s: client went away; cancelling the kernel task", self.adm.run_id)
        try:
            if not self._has_pending():
                if self.task_id:
                    if self.pump is not None:
                        self.pump.stop()
                    self._cancel_and_retire()
                elif self.pump is not None:
                    engine, thread_id, execution_id = self.engine, self.adm.thread_id, self.execution_id

                    def cancel_later(task_id: str) -> None:
                        engine.cancel_task_quietly(task_id)

                        def retire(record: ThreadRecord) -> None:
                            if record.execution.execution_id == execution_id:
                                record.execution.task_id = record.execution.task_id or task_id
                                record.retire_execution()

                        try:
                            engine.persist(thread_id, retire)
                        except StoreError:
                            pass

                    self.pump.cancel_when_known(cancel_later)
        finally:
            if self.adm.run_lock is not None:
                self.adm.run_lock.release()

    # ------------------------------------------------------------------ pipelines
    def _pipeline_state(self, *, snapshot: bool) -> dict[str, Any] | None:
        """The kernel's pipeline journal after what the client has (None: not a pipeline)."""
        if not self.task_id:
            return None
        params: dict[str, Any] = {"taskId": self.task_id, "afterSequence": self.translator.pipeline.high_water}
        if not snapshot:
            params["includeSnapshot"] = "false"
        try:
            status, body = self.engine.kernel.pipeline_state(params)
        except KernelUnavailable as exc:
            log.warning("run %s: pipeline state unavailable: %s", self.adm.run_id, exc)
            return None
        if status != 200 or not isinstance(body, dict):
            if status != 404:
                log.warning("run %s: pipeline state answered HTTP %s", self.adm.run_id, status)
            return None
        return body

    def _fill_pipeline_gaps(self, ts: int, out: list[dict[str, Any]]) -> None:
        """Events the live stream skipped exist in the kernel's journal: deliver them too."""
        if not self.translator.pipeline_seen:
            return
        state = self._pipeline_state(snapshot=False)
        for envelope in (state or {}).get("events") or []:
            if isinstance(envelope, dict):
                self.translator.map_envelope(envelope, ts, out)

    def _recover_pipeline(self, out: list[dict[str, Any]]) -> None:
        """A Resume starts from the kernel's pipeline snapshot plus what the client missed."""
        state = self._pipeline_state(snapshot=True)
        if state is None:
            return
        ts = self.engine._now_ms()
        snapshot = state.get("snapshot")
        if isinstance(snapshot, dict):
            out.append(self.translator.snapshot_event(snapshot, ts))
        for envelope in state.get("events") or []:
            if isinstance(envelope, dict):
                self.translator.map_envelope(envelope, ts, out)

    # ------------------------------------------------------------------ interrupts
    def _interrupt(self, inputs: list[dict[str, Any]], ts: int, out: list[dict[str, Any]]) -> bytes:
        """Persist the pending interrupts, then announce them (fail closed)."""
        now = self.engine.clock()
        expires_at = intr.rfc3339(now + self.engine.settings.interrupt_ttl_seconds)
        execution_id, task_id = self.execution_id, self.task_id
        pending: dict[str, dict[str, Any]] = {}
        for kernel_input in inputs:
            input_id = kernel_input.get("inputId")
            if not isinstance(input_id, str) or not input_id:
                log.warning("run %s: ignoring a kernel input without inputId", self.adm.run_id)
                continue
            request_task = kernel_input.get("requestTaskId")
            if request_task and request_task != task_id:
                raise AguiError("A2A_PROTOCOL_ERROR", msg.INTERRUPT_OTHER_TASK)
            context = kernel_input.get("contextId")
            if context and context != self.record.context_id:
                raise AguiError("A2A_PROTOCOL_ERROR", msg.INTERRUPT_OTHER_CONTEXT)
            pending[input_id] = {
                "input": intr.allowlisted(kernel_input),
                "interrupt": intr.build_interrupt(kernel_input, expires_at=expires_at, language=self.adm.language),
                "sideband": input_id in self.sideband_ids,
            }
        if not pending:
            return self._on_end(ts, out)
        self._fill_pipeline_gaps(ts, out)
        digests = self.translator.text_digests()
        progress = self.translator.pipeline.to_json()

        def commit(record: ThreadRecord) -> None:
            execution = record.execution
            if execution.execution_id != execution_id or execution.terminal:
                raise StoreError("the execution ended while the run was live")
            merged = dict(execution.pending)
            for input_id, entry in pending.items():
                merged.setdefault(input_id, entry)
            execution.pending = merged
            execution.task_id = execution.task_id or task_id
            execution.text_digests = digests
            execution.pipeline = progress

        try:
            record = self.engine.persist(self.adm.thread_id, commit)
        except StoreError as exc:
            log.error("run %s: cannot persist the interrupt: %s", self.adm.run_id, exc)
            self._cancel_and_retire()
            raise AguiError("STATE_PERSISTENCE_FAILED", msg.INTERRUPT_NOT_COMMITTED) from None
        if not self.session_emitted:
            out.append(self._session_event(ts))
        interrupts = [entry["interrupt"] for entry in record.execution.pending.values()]
        out.extend(self.translator.finish(ts, {"type": "interrupt", "interrupts": interrupts}))
        self._settle(retire=False)
        return ev.encode_many(out)

    # ------------------------------------------------------------------ resume
    def _start_resume(self, out: list[dict[str, Any]]) -> None:
        """Check every answer, make sure the kernel still has the task, then send them."""
        execution = self.record.execution
        try:
            answers = resume.plan(
                self.adm.run_input.resume or [],
                {} if execution.terminal else execution.pending,
                lambda interrupt_id: self.record.applied_digest(self.execution_id, interrupt_id),
                task_id=self.task_id,
                now=self.engine.clock(),
            )
        except resume.Expired as exc:
            self._cancel_and_retire()
            raise AguiError("EXECUTION_EXPIRED", msg.EXECUTION_EXPIRED, {"expiresAt": exc.expires_at}) from None
        except resume.CancelExecution:
            self._cancel_and_retire()
            raise AguiError("CANCELLED", msg.CANCELLED_BY_RESPONSE) from None
        self._check_kernel_task()
        out.extend(self.translator.reopen_steps(self.engine._now_ms()))
        if self.translator.pipeline_seen or self.adm.run_input.props.run_mode == "pipeline":
            self._recover_pipeline(out)
        for answer in [a for a in answers if a.sideband]:
            self._send_unary(answer)
        self.answers = [a for a in answers if not a.sideband]
        if self.answers:
            self._send_next_answer()
        else:  # only sideband answers: follow the task they unblocked
            task_id = self.task_id or ""
            self._open(lambda: self.engine.kernel.follow(task_id))

    def _check_kernel_task(self) -> None:
        """The kernel must still have the session and the task the interrupts belong to."""
        kernel = self.engine.kernel
        if not self.task_id:
            raise AguiError("EXECUTION_LOST", msg.RESUME_TASK_UNAVAILABLE)
        try:
            if self.session_id:
                status, body = kernel.ensure_restored(self.record.cwd, self.session_id, self.task_id)
                error = body.get("error") if isinstance(body, dict) else None
                if status == 409 and isinstance(error, dict) and error.get("code") == "SESSION_BACKUP_NOT_READY":
                    raise AguiError("SESSION_BACKUP_NOT_READY", msg.SESSION_BACKUP_NOT_READY)
                if status == 404:
                    raise AguiError("EXECUTION_LOST", msg.RESUME_SESSION_UNAVAILABLE)
                if status >= 400:
                    log.warning("ensure-restored answered HTTP %s", status)
                    raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE)
            task = kernel.get_task(self.task_id)
        except KernelRejected as exc:
            if exc.rpc_code == -32001:
                raise AguiError("EXECUTION_LOST", msg.RESUME_TASK_UNAVAILABLE) from None
            raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE) from None
        except KernelUnavailable as exc:
            log.warning("run %s: kernel unavailable before resume: %s", self.adm.run_id, exc)
            raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE) from None
        info = inspect_frame({"result": task})
        if info.task_id != self.task_id or (info.context_id and info.context_id != self.record.context_id):
            raise AguiError("A2A_PROTOCOL_ERROR", msg.RESUME_TASK_MISMATCH)
        if info.session_id and self.session_id and info.session_id != self.session_id:
            raise AguiError("A2A_PROTOCOL_ERROR", msg.SESSION_IDENTITY_CHANGED)
        if info.state in ("canceled", "failed", "rejected", "completed"):
            self._cancel_and_retire()
            raise AguiError("EXECUTION_LOST", msg.RESUME_TASK_UNAVAILABLE)

    def _send_unary(self, answer: resume.Answer) -> None:
        """A sideband answer: accepted when the unary call returns."""
        try:
            self.engine.kernel.send_message(self._answer_message(answer))
        except KernelRejected as exc:
            raise self._rejection(exc, answering=True) from None
        except KernelUnavailable as exc:
            log.warning("run %s: kernel unavailable for an answer: %s", self.adm.run_id, exc)
            raise AguiError("A2A_UNAVAILABLE", msg.A2A_UNAVAILABLE) from None
        self._accept(answer)

    def _answer_message(self, answer: resume.Answer) -> dict[str, Any]:
        adm = self.adm
        metadata = outbound.turn_metadata(adm.run_input.props, self.record.cwd, adm.language)
        if answer.input_response:
            metadata["inputResponse"] = answer.input_response
        return outbound.user_turn(
            message_id=f"agui-resume-{_run_tag(adm.run_id)}-{answer.interrupt_id}",
            context_id=self.record.context_id,
            parts=[answer.part],
            metadata=metadata,
            task_id=self.task_id,
        )

    def _send_next_answer(self) -> None:
        answer = self.answers.pop(0)
        self.current_answer = answer
        message = self._answer_message(answer)
        self._open(lambda: self.engine.kernel.send_streaming_message(message))

    def _accept(self, answer: resume.Answer) -> None:
        """The kernel took the answer: only now does it leave the durable pending state."""
        answer.accepted = True
        execution_id, input_id, digest = self.execution_id, answer.interrupt_id, answer.digest

        def commit(record: ThreadRecord) -> None:
            if record.execution.execution_id == execution_id:
                record.execution.pending.pop(input_id, None)
            record.remember_answer(execution_id, input_id, digest)

        try:
            self.record = self.engine.persist(self.adm.thread_id, commit)
        except StoreError as exc:
            log.error("run %s: cannot commit an accepted answer: %s", self.adm.run_id, exc)
            self._cancel_and_retire()
            raise AguiError("STATE_PERSISTENCE_FAILED", msg.ANSWER_NOT_COMMITTED) from None
        if answer.result and answer.tool_use_id:
            self.accepted_results.append((answer.tool_use_id, answer.result))


def _run_tag(run_id: str) -> str:
    """A short stable tag of a run id, for ids the run mints."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:8]


class _StreamBody:
    """The WSGI body of a run. A server may close it without ever iterating it (the client
    left before the first write): the admitted run must still give its thread back."""

    def __init__(self, run: _RunStream) -> None:
        self._run = run
        self._body = run.body()
        self._started = False

    def __iter__(self) -> _StreamBody:
        return self

    def __next__(self) -> bytes:
        self._started = True
        return next(self._body)

    def close(self) -> None:
        if not self._started:
            self._run.finished = True
            if self._run.adm.run_lock is not None:
                self._run.adm.run_lock.release()
        self._body.close()
