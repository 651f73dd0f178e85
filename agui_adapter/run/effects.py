"""What the run machine asks for, and what it is told back (plain values, no behaviour).

``run.machine`` decides; ``run.driver`` carries out. Between them travel only these
values: *effects* (emit these events, apply this store mutation, call the kernel,
release the thread, the run is over) and *replies* to the effects that need one (the
store write succeeded or failed, the kernel answered, refused (``KernelRejected``, which
the kernel client raises), or was unreachable). An effect that needs a reply is always
the last of the batch it arrives in; the driver carries it out at once and feeds the
reply back before anything else (``run.loop``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.kernel_client.failures import KernelRejected
from agui_adapter.protocol.events import Event
from agui_adapter.state.record import Mutation, ThreadRecord


class Mode(enum.Enum):
    """What an admitted run does."""

    TURN = "turn"  # a new user turn: a new kernel task
    RESUME = "resume"  # answers to the pending interrupts of the current task
    GUIDANCE = "guidance"  # a message into a running pipeline; never holds the thread


class Outcome(enum.Enum):
    """How a run ended."""

    SUCCESS = "success"  # RUN_FINISHED, outcome success
    INTERRUPT = "interrupt"  # RUN_FINISHED, outcome interrupt (the interrupts are on disk)
    ERROR = "error"  # RUN_ERROR
    ABANDONED = "abandoned"  # the client went away (or the server closed the response)


# ====================================================================== effects
@dataclass(slots=True)
class Emit:
    """AG-UI events for the client, in order."""

    events: list[Event]


@dataclass(slots=True)
class Persist:
    """Apply a mutation to the thread record. ``required``: the machine waits for
    ``Persisted`` or ``Failed``; otherwise a failure is only logged."""

    mutation: Mutation
    required: bool = False


@dataclass(slots=True)
class SendStreaming:
    """Open a kernel stream with ``SendStreamingMessage`` (the message may hold secrets)."""

    message: dict[str, Any] = field(repr=False)


@dataclass(slots=True)
class Follow:
    """Open a kernel stream that follows an existing task (``SubscribeToTask``), or its
    last snapshot when it no longer runs."""

    task_id: str


@dataclass(slots=True)
class RestoreSession:
    """Ask the kernel to restore a session before a Resume (reply: ``KernelAnswer``)."""

    cwd: str
    session_id: str
    task_id: str | None


@dataclass(slots=True)
class GetTask:
    """Is the interrupted task still there? ``GetTask``; the reply is a ``KernelAnswer``
    with the task, ``KernelRefused`` (-32001: the kernel lost it) or ``Failed``."""

    task_id: str


@dataclass(slots=True)
class FetchPipelineState:
    """The kernel's pipeline journal after a sequence, and its snapshot unless
    ``includeSnapshot`` is false; the reply is a ``KernelAnswer`` (or ``Failed``).
    An answer other than 200 means there is nothing to add."""

    params: dict[str, Any]


@dataclass(slots=True)
class StopTask:
    """Cancel a task left running by a run that died with its adapter, and wait (bounded)
    until the kernel says it stopped (reply: ``KernelAnswer`` with its last state, or
    ``KernelRefused`` when the kernel does not know it)."""

    task_id: str


@dataclass(slots=True)
class SendMessage:
    """A unary ``SendMessage``: a sideband answer, taken by the kernel when the call
    returns (reply: ``KernelAnswer``, ``KernelRefused`` or ``Failed``). The message
    may hold secrets."""

    message: dict[str, Any] = field(repr=False)


@dataclass(slots=True)
class CancelTask:
    """``CancelTask``, best effort."""

    task_id: str


@dataclass(slots=True)
class CancelWhenKnown:
    """The stream is abandoned before its task id was seen: cancel the task once the
    reader learns it, and retire the execution."""

    execution_id: str


@dataclass(slots=True)
class StopStream:
    """Close the kernel stream being read."""


@dataclass(slots=True)
class ReleaseThread:
    """Give the thread back (its run lock): the next run may start."""


@dataclass(slots=True)
class Finish:
    """The run is over; nothing follows."""

    outcome: Outcome
    code: str | None = None  # the RUN_ERROR code


Request = Persist | StopTask | RestoreSession | GetTask | FetchPipelineState | SendMessage
Effect = (
    Emit
    | Persist
    | SendStreaming
    | Follow
    | RestoreSession
    | GetTask
    | FetchPipelineState
    | SendMessage
    | StopTask
    | CancelTask
    | CancelWhenKnown
    | StopStream
    | ReleaseThread
    | Finish
)

#: Requests that call the kernel: events already decided are written before them.
KERNEL_REQUESTS = (StopTask, RestoreSession, GetTask, FetchPipelineState, SendMessage)


# ====================================================================== replies
@dataclass(slots=True)
class Persisted:
    """The mutation was applied; ``record`` is the thread record as written."""

    record: ThreadRecord


@dataclass(slots=True)
class KernelAnswer:
    """The kernel answered: an HTTP status and a JSON body (200 and the result for JSON-RPC)."""

    status: int
    body: Any


@dataclass(slots=True)
class KernelRefused:
    """The kernel answered with a JSON-RPC error."""

    error: KernelRejected


@dataclass(slots=True)
class Failed:
    """The request could not be carried out: the store could not be written (or the
    execution ended meanwhile), or the kernel could not be reached."""

    reason: str


Reply = Persisted | KernelAnswer | KernelRefused | Failed
