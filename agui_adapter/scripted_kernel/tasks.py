"""The kernel's task store: contexts, tasks, their subscribers, cancellation, snapshots.

Why: every request thread and every script worker reads and changes the same
contexts and tasks; keeping all of it behind one short lock in one object makes
the concurrency rules (never sleep, write a socket or touch the disk under the
lock; publishing never blocks) checkable in one place.
"""

from __future__ import annotations

import queue
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agui_adapter.scripted_kernel.pipeline_journal import PIPELINE_EXTENSION_URI, Pipeline, wait_iac
from agui_adapter.scripted_kernel.sessions import SessionRecord, SessionStore
from agui_adapter.scripted_kernel.wire import (
    CANCELED,
    CLOSE,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    SUBMITTED,
    UTC,
    WORKING,
    as_struct,
    not_cancelable,
    now_iso,
    task_not_found,
)

#: Request-log entries kept (oldest dropped first) so benchmarks cannot grow it forever.
MAX_LOGGED_REQUESTS = 50_000


CANCEL_TEXT = "Task canceled."


class Canceled(Exception):
    """Raised inside a script when its task was canceled (or the kernel stops)."""


@dataclass
class Context:
    """A conversation: bound to one session id and (from its first cwd on) one workspace."""

    context_id: str
    session_id: str
    cwd: str | None = None
    turns: int = 0
    running_task_id: str | None = None
    # the session's conversation in the real kernel's shape (session recovery ``messages``);
    # in memory only, like every text this kernel sees
    conversation: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Pending:
    """A wait of a task for the user: the interrupt envelope and what answering it needs."""

    kind: str  # "permission" | "ask_user_question"
    input_id: str
    tool_use_id: str
    envelope: dict[str, Any]
    permission: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_permission(
        cls,
        *,
        task_id: str,
        context_id: str,
        language: str,
        tool_use_id: str,
        tool_name: str,
        shown: dict[str, Any],
        extra: dict[str, Any],
    ) -> Pending:
        """A permission wait: the capture-02 envelope (``shown``: its keys after ``toolName``)."""
        input_id = "permission-" + uuid.uuid4().hex
        envelope = {
            "schemaVersion": 1.0,
            "kind": "permission",
            "required": True,
            "language": language,
            "requestTaskId": task_id,
            "contextId": context_id,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "toolName": tool_name,
            **shown,
        }
        permission = {"pending": True, "toolUseId": tool_use_id, "toolName": tool_name, "autoApproved": False}
        return cls("permission", input_id, tool_use_id, envelope, permission, extra)


@dataclass
class Task:
    """One A2A task: its status and history, its pending wait and the streams attached to it."""

    id: str
    context_id: str
    session_id: str | None
    status: dict[str, Any]
    seq: int
    cwd: str = ""
    language: str = "en"
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    pending: Pending | None = None
    running: bool = False
    canceled: bool = False
    subscribers: list[queue.SimpleQueue[Any]] = field(default_factory=list)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    attached: threading.Event = field(default_factory=threading.Event)  # set by SubscribeToTask
    execution_id: str = field(default_factory=lambda: "exec-" + uuid.uuid4().hex)


class KernelState:
    """All mutable kernel state, guarded by one short lock.

    The lock is never held while sleeping, writing to a socket or touching the
    file system; subscriber queues are unbounded so publishing never blocks.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        delay_scale: float = 1.0,
        keepalive_seconds: float = 15.0,
        default_cwd: str | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.token = token or None
        self.delay_scale = max(0.0, float(delay_scale))
        self.keepalive_seconds = float(keepalive_seconds)
        self.instance_id = "instance-" + uuid.uuid4().hex
        self.lock = threading.Lock()
        self.contexts: dict[str, Context] = {}
        self.tasks: dict[str, Task] = {}
        self.pipelines: dict[str, Pipeline] = {}  # by taskId
        self.context_pipelines: dict[str, str] = {}  # contextId -> taskId of its latest pipeline
        self.pipeline_sequences: dict[str, int] = {}  # contextId (= pipelineRunId) -> last sequence
        self._requests: list[dict[str, Any]] = []
        self._seq = 0
        self._default_cwd = default_cwd
        self._temp_cwd: str | None = None  # the default cwd this kernel created (removed on shutdown)
        self._cwd_lock = threading.Lock()
        self.closing = False
        self.sessions = SessionStore(state_dir) if state_dir else None
        self._persist_lock = threading.Lock()
        for context_id, record in (self.sessions.load() if self.sessions else {}).items():
            self.contexts[context_id] = Context(context_id, record.session_id, record.cwd, record.turns)
            if record.pipeline_sequence:
                self.pipeline_sequences[context_id] = record.pipeline_sequence
        # Test knob: sessions whose backup is still "synchronizing" (ensure-restored answers 409).
        self.backup_not_ready: set[str] = set()

    # ----------------------------------------------------------- request log

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of the JSON-RPC request log."""
        with self.lock:
            return list(self._requests)

    def log_request(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self._requests.append(entry)
            if len(self._requests) > MAX_LOGGED_REQUESTS:
                del self._requests[: len(self._requests) - MAX_LOGGED_REQUESTS]

    def reset_requests(self) -> None:
        with self.lock:
            self._requests.clear()

    # ----------------------------------------------------------- extension points

    def pipeline_snapshot(
        self, task_id: str | None, context_id: str | None, args: dict[str, str]
    ) -> dict[str, Any] | None:
        """Body of ``GET /iac-code/pipeline/state``; ``None`` means 404 (not a pipeline task).

        Raises ``ValueError`` (HTTP 400) for a malformed ``afterSequence``.
        """
        raw_after = args.get("afterSequence")
        after: int | None = None
        if raw_after not in (None, ""):
            try:
                number = float(str(raw_after))  # "7" and "7.0" (a live sequence) alike
            except ValueError:
                number = -1.0
            after = int(number) if number.is_integer() else -1
            if after < 0:
                raise ValueError("afterSequence must be a non-negative integer.")
        include = str(args.get("includeSnapshot", "true")).strip().lower() not in ("false", "0", "no")
        lean = str(args.get("lean", "")).strip().lower() in ("1", "true", "yes")
        with self.lock:
            pipe: Pipeline | None = None
            if task_id is not None:
                pipe = self.pipelines.get(task_id)
                if pipe is not None and context_id is not None and pipe.context_id != context_id:
                    pipe = None
            elif context_id is not None:
                pipe = self.pipelines.get(self.context_pipelines.get(context_id, ""))
            if pipe is None:
                return None
            events = [e for e in pipe.journal if e["sequence"] > (after or 0)]
            last = pipe.seq
            if not include:
                return {"fromSequence": after or 0, "lastSequence": last, "events": events}
            body: dict[str, Any] = {"snapshot": pipe.snapshot(lean=lean)}
            if after is None:
                body["events"] = []
            else:
                body.update({"fromSequence": after, "lastSequence": last, "events": events})
            return body

    def pipeline_event_locked(
        self,
        pipe: Pipeline,
        event_type: str,
        data: dict[str, Any] | None = None,
        *,
        status: str = "working",
        step: dict[str, Any] | None = None,
        candidate: dict[str, Any] | None = None,
        candidate_step: dict[str, Any] | None = None,
        visibility: str | None = None,
        input_: dict[str, Any] | None = None,
        permission: dict[str, Any] | None = None,
        artifact: dict[str, Any] | None = None,
        scope: str | None = None,
    ) -> dict[str, Any]:
        """Create one pipeline envelope, journal it and project it into the snapshot.

        ``scope`` overrides the scope the coordinates imply (a rollback is pipeline-scoped but
        names the step it returns to, tests/data/a2a-selling/20).
        """
        pipe.seq = self.pipeline_sequences.get(pipe.context_id, 0) + 1
        self.pipeline_sequences[pipe.context_id] = pipe.seq
        if scope is not None:
            pass
        elif candidate_step is not None:
            scope = "candidate_step"  # events inside a candidate's step (observed on the real kernel)
        else:
            scope = "candidate" if candidate is not None else "step" if step is not None else "pipeline"
        envelope: dict[str, Any] = {
            "schemaVersion": "1.0",
            "extensionUri": PIPELINE_EXTENSION_URI,
            "eventId": "evt-" + uuid.uuid4().hex,
            "sequence": pipe.seq,
            "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "eventType": event_type,
            "scope": scope,
            "pipelineRunId": pipe.context_id,
            "taskId": pipe.task_id,
            "contextId": pipe.context_id,
            "pipelineName": pipe.name,
            "status": status,
            "data": data if data is not None else {},
            "iacCodeSessionId": pipe.session_id,
        }
        for key, value in (
            ("step", step),
            ("candidate", candidate),
            ("candidateStep", candidate_step),
            ("input", input_),
            ("permission", permission),
            ("artifact", artifact),
            ("visibility", visibility),
        ):
            if value is not None:
                envelope[key] = value
        pipe.journal.append(envelope)
        pipe.apply(envelope)
        return envelope

    def signal(self, task: Task, item: object) -> None:
        """Put a sentinel (``ACK``) on every stream attached to the task."""
        with self.lock:
            for subscriber in task.subscribers:
                subscriber.put(item)

    def default_cwd(self) -> str:
        """Workspace for turns that never sent a cwd (created lazily, outside the repo)."""
        with self._cwd_lock:
            if self._default_cwd is None:
                if self.closing:  # the turn is canceled at once: create nothing shutdown would miss
                    return tempfile.gettempdir()
                self._default_cwd = self._temp_cwd = tempfile.mkdtemp(prefix="scripted-kernel-")
            return self._default_cwd

    def persist(self) -> None:
        """Write what the contexts need to continue after a restart (with a state directory)."""
        if self.sessions is None:
            return
        with self._persist_lock:  # snapshot and write in one order: no older state written last
            with self.lock:
                records = {
                    context_id: SessionRecord(
                        ctx.session_id, ctx.cwd, ctx.turns, self.pipeline_sequences.get(context_id, 0)
                    )
                    for context_id, ctx in self.contexts.items()
                }
            try:
                self.sessions.save(records)
            except OSError as exc:  # the kernel goes on; the next change tries again
                print(f"scripted kernel: cannot save sessions: {exc}", file=sys.stderr)

    # ----------------------------------------------------------- tasks (lock held)

    def new_task_locked(self, context_id: str, session_id: str | None) -> Task:
        self._seq += 1
        task = Task(
            id=str(uuid.uuid4()),
            context_id=context_id,
            session_id=session_id,
            status={"state": SUBMITTED},
            seq=self._seq,
        )
        self.tasks[task.id] = task
        return task

    def execution_control_locked(self, task: Task) -> dict[str, Any]:
        running = task.running
        status = {
            SUBMITTED: "working",
            WORKING: "working",
            INPUT_REQUIRED: "input-required",
            FAILED: "failed",
            CANCELED: "canceled",
            COMPLETED: "completed",
        }.get(task.status["state"], "working")
        # As observed: a live run holds execution + llm; an idle task keeps its
        # execution slot (captures 05, 14, 31, 49); a failed one holds nothing.
        if running:
            blockers = [
                {"kind": "execution", "count": 1.0},
                {"kind": "llm", "count": 1.0},
            ]
        elif task.status["state"] == FAILED:
            blockers = []
        else:
            blockers = [{"kind": "execution", "count": 1.0}]
        return {
            "releaseReady": False,
            "pauseReason": None,
            "blockers": blockers,
            "streamAvailable": bool(blockers),
            "executionId": task.execution_id,
            "commitError": None,
            "taskId": task.id,
            "pauseId": None,
            "persistedRevision": 0.0,
            "executionStatus": status,
            "backup": {"status": "not_requested"},
            "terminationReason": None,
            "contextId": task.context_id,
            "externalOperations": [],
            "phase": "running",
            "pauseComplete": False,
            "connectionEpoch": -1.0,
            "serverInstanceId": self.instance_id,
            "expiresAt": None,
            "revision": 0.0,
        }

    def snapshot_locked(self, task: Task, history_length: int | None = None) -> dict[str, Any]:
        """The Task object as GetTask / CancelTask / SubscribeToTask return it."""
        snap: dict[str, Any] = {
            "id": task.id,
            "contextId": task.context_id,
            "status": task.status,
        }
        if task.artifacts:
            snap["artifacts"] = list(task.artifacts)
        history = task.history
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        if history:
            snap["history"] = list(history)
        iac: dict[str, Any] = {}
        pipe = self.pipelines.get(task.id)
        if pipe is not None and pipe.waits:
            iac.update(wait_iac(pipe.waits))
        elif pipe is not None and pipe.side_waits and not task.canceled:
            # a candidate-step permission: the task stays WORKING, the stored task lists the waits
            iac["pendingPermissions"] = [dict(w.envelope) for w in pipe.side_waits]
        elif task.pending is not None:
            iac["input"] = task.pending.envelope
            if task.pending.permission is not None:
                iac["permission"] = task.pending.permission
        if task.session_id:
            iac["iacCodeSessionId"] = task.session_id
        iac["executionControl"] = self.execution_control_locked(task)
        snap["metadata"] = {"iac_code": iac}
        return snap

    def apply_status_locked(self, task: Task, status: dict[str, Any], repeat: int) -> None:
        # Like a2a-sdk's task manager: the replaced status message moves to history.
        previous = task.status.get("message")
        if previous is not None:
            task.history.append(previous)
        message = status.get("message")
        if message is not None and repeat > 1:
            task.history.extend([message] * (repeat - 1))
        task.status = status

    def finish_locked(self, task: Task) -> None:
        task.running = False
        ctx = self.contexts.get(task.context_id)
        if ctx is not None and ctx.running_task_id == task.id:
            ctx.running_task_id = None
        for subscriber in task.subscribers:
            subscriber.put(CLOSE)
        task.subscribers.clear()

    def publish(
        self,
        task: Task,
        result: dict[str, Any],
        *,
        status: dict[str, Any] | None = None,
        repeat: int = 1,
        artifact: dict[str, Any] | None = None,
        pending: Pending | None = None,
        close: bool = False,
    ) -> None:
        """Apply one event to the task and broadcast it to the attached streams."""
        with self.lock:
            if task.canceled:
                raise Canceled()
            if status is not None:
                self.apply_status_locked(task, status, repeat)
            if artifact is not None:
                task.artifacts.append(artifact)
            if pending is not None:
                task.pending = pending
            item = (result, repeat)
            for subscriber in task.subscribers:
                subscriber.put(item)
            if close:
                self.finish_locked(task)

    def finish(self, task: Task) -> None:
        with self.lock:
            if task.running:
                self.finish_locked(task)

    def unsubscribe(self, task: Task, subscriber: queue.SimpleQueue[Any]) -> None:
        with self.lock:
            try:
                task.subscribers.remove(subscriber)
            except ValueError:
                pass

    def cancel(self, task_id: str) -> dict[str, Any]:
        """CancelTask: CANCELED goes to the live streams, which then close."""
        with self.lock:
            task = self.tasks.get(task_id)
            if task is None:
                raise task_not_found()
            if not task.running:
                raise not_cancelable()
            task.canceled = True
            pipe = self.pipelines.get(task.id)
            canceled_event: dict[str, Any] | None = None
            if pipe is not None:
                pipe.waits.clear()
                canceled_event = self.pipeline_event_locked(
                    pipe, "pipeline_canceled", {"reason": CANCEL_TEXT}, status="canceled"
                )
            status = {
                "state": CANCELED,
                "message": {
                    "messageId": f"{task.id}-5",
                    "contextId": task.context_id,
                    "taskId": task.id,
                    "role": "ROLE_AGENT",
                    "parts": [{"text": CANCEL_TEXT}],
                },
                "timestamp": now_iso(),
            }
            update: dict[str, Any] = {
                "taskId": task.id,
                "contextId": task.context_id,
                "status": status,
            }
            if task.session_id:
                update["metadata"] = {"iac_code": {"iacCodeSessionId": task.session_id}}
            if canceled_event is not None:
                update["metadata"] = {"iac_code": {"pipeline": as_struct(canceled_event)}}
            self.apply_status_locked(task, status, 1)
            for subscriber in task.subscribers:
                subscriber.put(({"statusUpdate": update}, 1))
            self.finish_locked(task)
            snapshot = self.snapshot_locked(task)
        task.cancel_event.set()
        return snapshot

    def shutdown(self) -> None:
        """Stop every running script, close every open stream, save the sessions, remove temp folders."""
        with self.lock:
            self.closing = True
            for task in self.tasks.values():
                if task.running:
                    task.canceled = True
                    task.cancel_event.set()
                    self.finish_locked(task)
        self.persist()
        with self._cwd_lock:
            temp, self._temp_cwd = self._temp_cwd, None
            if temp is not None:
                self._default_cwd = None
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
