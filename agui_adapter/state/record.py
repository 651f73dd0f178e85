"""The thread record, and the named changes a run makes to it (sans-I/O).

A ``ThreadRecord`` is everything the adapter must remember about one AG-UI thread: its
binding (contextId, cwd, userId, iac-code session), its current ``Execution`` (task id,
pending interrupts, pipeline progress) and bounded idempotency records. Those records are
bounded in size too, not only in count: a run id is remembered by its SHA-256
(``RunDigests``), so a thousand runs cost the same whatever ids the client chose. ``store`` reads
and writes it; nothing here touches a file.

Every change a run makes to the record is a named ``Mutation`` (``RecordIds``,
``CommitInterrupts``, ``AcceptAnswer``, ``RetireExecution``, ``RunBegan``, ``RunEnded``): a small value the run
machine returns and the driver applies under the record lock, read-modify-write. A
mutation that finds the record moved on (the execution was cancelled meanwhile)
either does nothing or raises ``StaleExecution``, whichever its contract says.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

SCHEMA_VERSION = 1
MAX_RUN_DIGESTS = 1000
MAX_APPLIED_ANSWERS = 500
MAX_TERMINAL_EXECUTIONS = 200
#: The thread's recent runs kept for ``GET /threads/{threadId}`` (oldest first).
MAX_RUNS = 50


_RUN_KEY = re.compile(r"[0-9a-f]{64}")


def run_key(run_id: str) -> str:
    """The fixed-size key a run id is remembered by (SHA-256, hex)."""
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()


class RunDigests(dict[str, str]):
    """runId → request digest of the runs a thread has seen, oldest first.

    Stored under :func:`run_key` of the run id, never the id itself, while every lookup
    takes the run id: ``run_id in digests``, ``digests.get(run_id)``. State files written
    before kept raw ids; those are still found (both ways), and re-keyed when read.
    """

    def __contains__(self, run_id: object) -> bool:
        if not isinstance(run_id, str):
            return False
        return super().__contains__(run_key(run_id)) or super().__contains__(run_id)

    def __getitem__(self, run_id: str) -> str:
        key = run_key(run_id)
        return super().__getitem__(key if super().__contains__(key) else run_id)

    def get(self, run_id: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[run_id] if run_id in self else default

    def remember(self, run_id: str, digest: str, limit: int) -> None:
        self.pop(run_id, None)  # a raw id from an old state file
        self.pop(run_key(run_id), None)  # a repeat moves to the end
        super().__setitem__(run_key(run_id), digest)
        while len(self) > limit:
            del self[next(iter(self))]

    @classmethod
    def from_json(cls, data: Any) -> RunDigests:
        digests = cls()
        for key, digest in (data or {}).items():
            key = str(key)
            stored = key if _RUN_KEY.fullmatch(key) else run_key(key)
            super(RunDigests, digests).__setitem__(stored, str(digest))
        return digests


class RecordError(Exception):
    """A state file that cannot be read as a thread record."""


class StaleExecution(Exception):
    """The execution a mutation was meant for ended while the run was live."""


@dataclass
class PendingInterrupt:
    """An interrupt the client was told about and has not answered yet."""

    input: dict[str, Any]  # the kernel's input, allowlisted (what the answer is checked against)
    interrupt: dict[str, Any]  # the AG-UI interrupt exactly as announced
    sideband: bool = False  # a candidate-scope permission, answered with a unary call

    @property
    def expires_at(self) -> str | None:
        value = self.interrupt.get("expiresAt")
        return value if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "interrupt": self.interrupt, "sideband": self.sideband}

    @classmethod
    def from_json(cls, data: Any) -> PendingInterrupt:
        if not isinstance(data, dict):
            raise RecordError("malformed pending interrupt")
        return cls(dict(data.get("input") or {}), dict(data.get("interrupt") or {}), bool(data.get("sideband")))


@dataclass
class Execution:
    """One execution: an initial run plus the resumes of its interrupts."""

    execution_id: str
    ros_invocation_id: str
    task_id: str | None = None
    terminal: bool = False
    pending: dict[str, PendingInterrupt] = field(default_factory=dict)  # by interrupt (input) id
    # PipelineProgress.to_json(): delivered journal sequences and open business steps
    pipeline: dict[str, Any] = field(default_factory=dict)
    text_digests: list[str] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        """Interrupts are pending and can still be answered."""
        return bool(self.pending) and not self.terminal

    def to_json(self) -> dict[str, Any]:
        return {
            "executionId": self.execution_id,
            "rosInvocationId": self.ros_invocation_id,
            "taskId": self.task_id,
            "terminal": self.terminal,
            "pending": {k: v.to_json() for k, v in self.pending.items()},
            "pipeline": self.pipeline,
            "textDigests": self.text_digests,
        }

    @classmethod
    def from_json(cls, data: Any) -> Execution:
        return cls(
            execution_id=_req_str(data["executionId"]),
            ros_invocation_id=_req_str(data["rosInvocationId"]),
            task_id=_opt_str(data.get("taskId")),
            terminal=bool(data.get("terminal", False)),
            pending={str(k): PendingInterrupt.from_json(v) for k, v in (data.get("pending") or {}).items()},
            pipeline=dict(data.get("pipeline") or {}),
            text_digests=[str(s) for s in data.get("textDigests") or []],
        )


@dataclass
class RunEntry:
    """One run of the thread, as ``GET /threads/{threadId}`` lists it (plus what
    ``GET /threads/{threadId}/messages`` needs to give messages the ids the run streamed:
    its mode, the kernel task it drove, the tool calls its interrupts asked about)."""

    run_id: str
    started_at: str  # RFC 3339, UTC
    mode: str  # turn | resume | guidance | pipeline
    outcome: str | None = None  # success | interrupt | error; None while running
    error_code: str | None = None
    ended_at: str | None = None
    task_id: str | None = None
    interrupt_tool_calls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "startedAt": self.started_at,
            "mode": self.mode,
            "outcome": self.outcome,
            "errorCode": self.error_code,
            "endedAt": self.ended_at,
            "taskId": self.task_id,
            "interruptToolCalls": self.interrupt_tool_calls,
        }

    @classmethod
    def from_json(cls, data: Any) -> RunEntry:
        if not isinstance(data, dict):
            raise RecordError("malformed run entry")
        return cls(
            run_id=_req_str(data.get("runId")),
            started_at=_req_str(data.get("startedAt")),
            mode=_req_str(data.get("mode")),
            outcome=_opt_str(data.get("outcome")),
            error_code=_opt_str(data.get("errorCode")),
            ended_at=_opt_str(data.get("endedAt")),
            task_id=_opt_str(data.get("taskId")),
            interrupt_tool_calls=[str(t) for t in data.get("interruptToolCalls") or []],
        )

    def public(self) -> dict[str, Any]:
        """The entry as ``GET /threads/{threadId}`` shows it."""
        return {
            "runId": self.run_id,
            "outcome": self.outcome,
            "errorCode": self.error_code,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
        }


@dataclass
class ThreadRecord:
    """Everything the adapter must remember about one AG-UI thread."""

    thread_id: str
    context_id: str
    cwd: str
    user_id: str | None
    execution: Execution
    session_id: str | None = None
    run_digests: RunDigests = field(default_factory=RunDigests)
    applied_answers: list[dict[str, str]] = field(default_factory=list)
    # executionId -> rosInvocationId of executions that ended (bounded, oldest first)
    terminal_executions: dict[str, str] = field(default_factory=dict)
    # the last MAX_RUNS runs, oldest first (``RunEntry``): ids, times, outcomes; never text
    runs: list[RunEntry] = field(default_factory=list)
    # how many times it was saved: which of two copies is newer (``record_log`` recovery)
    revision: int = 0

    def remember_run(self, run_id: str, digest: str) -> None:
        self.run_digests.remember(run_id, digest, MAX_RUN_DIGESTS)

    def start_execution(self, execution_id: str, ros_invocation_id: str) -> None:
        """A new turn: a new execution in the same context and session."""
        if not self.execution.terminal:
            self.retire_execution()
        self.execution = Execution(execution_id=execution_id, ros_invocation_id=ros_invocation_id)

    def retire_execution(self) -> None:
        """Mark the current execution ended (its cancel answers already_terminal)."""
        execution = self.execution
        execution.terminal = True
        execution.pending.clear()
        self.terminal_executions[execution.execution_id] = execution.ros_invocation_id
        while len(self.terminal_executions) > MAX_TERMINAL_EXECUTIONS:
            del self.terminal_executions[next(iter(self.terminal_executions))]

    def remember_answer(self, execution_id: str, interrupt_id: str, digest: str) -> None:
        self.applied_answers = [
            a
            for a in self.applied_answers
            if not (a["executionId"] == execution_id and a["interruptId"] == interrupt_id)
        ]
        self.applied_answers.append({"executionId": execution_id, "interruptId": interrupt_id, "digest": digest})
        del self.applied_answers[:-MAX_APPLIED_ANSWERS]

    def applied_digest(self, execution_id: str, interrupt_id: str) -> str | None:
        for answer in self.applied_answers:
            if answer["executionId"] == execution_id and answer["interruptId"] == interrupt_id:
                return answer["digest"]
        return None

    # --- (de)serialisation --------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "schemaVersion": SCHEMA_VERSION,
            "threadId": self.thread_id,
            "contextId": self.context_id,
            "cwd": self.cwd,
            "userId": self.user_id,
            "iacCodeSessionId": self.session_id,
            "execution": self.execution.to_json(),
            "runDigests": dict(self.run_digests),
            "appliedAnswers": self.applied_answers,
            "terminalExecutions": self.terminal_executions,
            "runs": [entry.to_json() for entry in self.runs],
            "revision": self.revision,
        }

    @classmethod
    def from_json(cls, data: Any, thread_id: str) -> ThreadRecord:
        try:
            if not isinstance(data, dict) or data.get("schemaVersion") != SCHEMA_VERSION:
                raise RecordError("unsupported state file")
            if data.get("threadId") != thread_id:
                raise RecordError("state file belongs to another thread")
            return cls(
                thread_id=thread_id,
                context_id=_req_str(data["contextId"]),
                cwd=_req_str(data["cwd"]),
                user_id=_opt_str(data.get("userId")),
                session_id=_opt_str(data.get("iacCodeSessionId")),
                execution=Execution.from_json(data["execution"]),
                run_digests=RunDigests.from_json(data.get("runDigests")),
                applied_answers=[dict(a) for a in data.get("appliedAnswers") or []],
                terminal_executions={str(k): str(v) for k, v in (data.get("terminalExecutions") or {}).items()},
                runs=[RunEntry.from_json(entry) for entry in data.get("runs") or []],
                revision=_revision(data.get("revision")),
            )
        except RecordError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"malformed state file: {exc.__class__.__name__}") from exc


def _revision(value: Any) -> int:
    """A record's revision; 0 for a state file written before records had one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _req_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise RecordError("missing required field")
    return value


def _opt_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise RecordError("bad optional field")
    return value


# ====================================================================== mutations
class Mutation(Protocol):
    """A named change to a thread record, applied under its lock.

    ``durable``: the write is synced to disk before the run goes on. Every mutation is,
    except ``RecordIds``: ids the kernel can tell again are only replaced atomically (they
    survive a crash of the adapter, not of the machine), which saves a disk sync on the
    path to a run's first delta."""

    durable: bool

    def apply(self, record: ThreadRecord) -> None: ...


@dataclass(frozen=True)
class RecordIds:
    """The kernel named the run's task and/or session: remember them before announcing them."""

    execution_id: str
    task_id: str | None = None
    session_id: str | None = None
    durable: ClassVar[bool] = False

    def apply(self, record: ThreadRecord) -> None:
        if self.task_id and record.execution.execution_id == self.execution_id:
            record.execution.task_id = self.task_id
        if self.session_id and record.session_id is None:
            record.session_id = self.session_id


@dataclass(frozen=True)
class CommitInterrupts:
    """The run ends in interrupts: they are pending (merged with any still unanswered),
    with what a Resume needs to continue the stream where it stopped."""

    execution_id: str
    task_id: str | None
    pending: dict[str, PendingInterrupt]
    text_digests: list[str]
    pipeline: dict[str, Any]

    durable: ClassVar[bool] = True

    def apply(self, record: ThreadRecord) -> None:
        execution = record.execution
        if execution.execution_id != self.execution_id or execution.terminal:
            raise StaleExecution(self.execution_id)
        merged = dict(execution.pending)
        for input_id, entry in self.pending.items():
            merged.setdefault(input_id, entry)
        execution.pending = merged
        execution.task_id = execution.task_id or self.task_id
        execution.text_digests = list(self.text_digests)
        execution.pipeline = dict(self.pipeline)


@dataclass(frozen=True)
class AcceptAnswer:
    """The kernel took an answer: it leaves the pending state and is remembered as applied."""

    execution_id: str
    interrupt_id: str
    digest: str

    durable: ClassVar[bool] = True

    def apply(self, record: ThreadRecord) -> None:
        if record.execution.execution_id == self.execution_id:
            record.execution.pending.pop(self.interrupt_id, None)
        record.remember_answer(self.execution_id, self.interrupt_id, self.digest)


@dataclass(frozen=True)
class RetireExecution:
    """The execution is over (or cannot go on): its cancel answers ``already_terminal``.

    ``unless_waiting`` keeps an execution whose interrupts are still pending (a run that
    ends in error after some answers were refused); ``task_id`` fills in a task id that
    was learnt only after the run was abandoned; ``lost_session`` is a session the kernel
    no longer has: the thread forgets it, so that its next run starts a new one."""

    execution_id: str
    unless_waiting: bool = False
    task_id: str | None = None
    lost_session: str | None = None

    durable: ClassVar[bool] = True

    def apply(self, record: ThreadRecord) -> None:
        if self.lost_session and record.session_id == self.lost_session:
            record.session_id = None
        execution = record.execution
        if execution.execution_id != self.execution_id:
            return
        if self.unless_waiting and execution.pending:
            return
        if self.task_id and not execution.task_id:
            execution.task_id = self.task_id
        record.retire_execution()


@dataclass(frozen=True)
class RunBegan:
    """A run was admitted: it joins the thread's recent runs (the oldest beyond MAX_RUNS
    leaves). Applied by admission to the record it writes."""

    run_id: str
    started_at: str
    mode: str

    durable: ClassVar[bool] = True

    def apply(self, record: ThreadRecord) -> None:
        record.runs.append(RunEntry(self.run_id, self.started_at, self.mode))
        del record.runs[:-MAX_RUNS]


@dataclass(frozen=True)
class RunEnded:
    """A run ended: its outcome, error code and end time (and the kernel task it drove).
    Not synced to disk: it is what a client is shown, not what the contract rests on."""

    run_id: str
    outcome: str
    ended_at: str
    error_code: str | None = None
    task_id: str | None = None
    interrupt_tool_calls: tuple[str, ...] = ()

    durable: ClassVar[bool] = False

    def apply(self, record: ThreadRecord) -> None:
        for entry in reversed(record.runs):
            if entry.run_id == self.run_id:
                entry.outcome, entry.error_code, entry.ended_at = self.outcome, self.error_code, self.ended_at
                entry.task_id = self.task_id or entry.task_id
                entry.interrupt_tool_calls = list(self.interrupt_tool_calls)
                return
