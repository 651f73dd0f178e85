"""A run's identity: the ids it mints, the kernel ids it learns, the session event it announces.

Pure functions for ``run.machine``. A run is bound to one A2A context (its thread's), one
kernel task and one kernel session; the kernel names the task and the session in its first
frames, and a frame naming others is a protocol error, or, for the session, a sign that the
kernel lost ours (``Lost``). What the machine learns is written before it is announced
(``iac-code.session.v1``, the contract's rule 1); what to write is ``learned_ids``'s answer.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.protocol.validation import RunInput
from agui_adapter.run.translation import FAILURE_STATES, SESSION_EVENT, FrameInfo


class Lost(Exception):
    """The kernel no longer has the run's task (or, ``session``, its session): rule 6."""

    def __init__(self, template: str, *, session: bool = False, task_id: str | None = None) -> None:
        super().__init__(template)
        self.template, self.session = template, session
        self.task_id = task_id  # the task the frame that showed the loss named, if the run had none


def run_tag(run_id: str) -> str:
    """A short stable tag of a run id, for ids the run mints."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:8]


def turn_message_id(mode_value: str) -> str:
    """The id of a new turn's (or guidance's) kernel message: fresh every time."""
    return f"agui-{mode_value}-{uuid.uuid4().hex}"


def answer_message_id(run_id: str, interrupt_id: str) -> str:
    """The id of an answer's kernel message: the same for the same run and interrupt."""
    return f"agui-resume-{run_tag(run_id)}-{interrupt_id}"


def session_value(
    run_input: RunInput, execution_id: str, context_id: str, task_id: str | None, session_id: str | None
) -> dict[str, Any]:
    """The value of the ``iac-code.session.v1`` event."""
    value: dict[str, Any] = {
        "schemaVersion": 1,
        "threadId": run_input.thread_id,
        "aguiRunId": run_input.run_id,
        "executionId": execution_id,
        "contextId": context_id,
        "rosInvocationId": run_input.props.ros_invocation_id,
    }
    if task_id:
        value["taskId"] = task_id
    if session_id:
        value["sessionId"] = session_id
    return value


def announced_in(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The session event's value among events already emitted (an adopted run's journal)."""
    announced = None
    for event in events:
        if event.get("type") == "CUSTOM" and event.get("name") == SESSION_EVENT:
            value = event.get("value")
            announced = value if isinstance(value, dict) else None
    return announced


def differs(info: FrameInfo, task_id: str | None, session_id: str | None, context_id: str) -> bool:
    """Whether a frame names ids other than the run's (the cheap check, once per frame)."""
    return bool(
        (info.task_id and info.task_id != task_id)
        or (info.session_id and info.session_id != session_id)
        or (info.context_id and info.context_id != context_id)
    )


@dataclass(frozen=True, slots=True)
class Learned:
    """The run's ids after a frame, and which of them are new and must be written."""

    task_id: str | None
    session_id: str | None
    new_task: str | None  # to write
    new_session: str | None  # to write


def learned_ids(
    info: FrameInfo, *, task_id: str | None, session_id: str | None, context_id: str, written_task: str | None
) -> Learned:
    """Check a frame's ids against the run's; raise on a change (``Lost`` for a session the
    kernel replaced). The kernel's first task snapshot names the task and the next frame its
    session: the task id waits for that frame (the snapshot announces nothing), so one write
    records both, on the path to the first delta."""
    new_session = None
    if info.task_id:
        if task_id is None:
            task_id = info.task_id
        elif info.task_id != task_id:
            raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.TASK_IDENTITY_CHANGED)
    if info.context_id and info.context_id != context_id:
        raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.CONTEXT_IDENTITY_CHANGED)
    if info.session_id:
        if session_id is None:
            session_id = new_session = info.session_id
        elif info.session_id != session_id:  # the kernel lost our session and made a new one
            raise Lost(msg.SESSION_LOST, session=True, task_id=task_id)
    new_task = task_id if task_id != written_task else None
    if new_session is None and session_id is None and info.kind == "task" and not info.iac:
        new_task = None  # a bare snapshot: wait for the frame that names the session
    return Learned(task_id, session_id, new_task, new_session)


def check_guidance(info: FrameInfo, *, task_id: str | None, context_id: str) -> None:
    """Guidance only needs the kernel to take the message: raise the error its first frame means, if any."""
    if info.task_id and info.task_id != task_id:
        raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.TASK_IDENTITY_CHANGED)
    if info.context_id and info.context_id != context_id:
        raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.CONTEXT_IDENTITY_CHANGED)
    if info.state in FAILURE_STATES:
        raise AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED)
    if info.state == "canceled":
        raise AguiError(Code.CANCELLED, msg.CANCELLED)
