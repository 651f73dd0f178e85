"""What the kernel's replies to a Resume's checks mean (sans-I/O).

Before a Resume's answers go to the kernel, the run asks it to restore the session, whether
it still has the task, and (for a sideband answer) whether it took the answer. Each check
here reads one ``Reply`` and returns what it learned, or raises: ``AguiError`` for the
RUN_ERROR the run ends with, ``identity.Lost`` when the kernel no longer has the task or the
session (rule 6: the machine retires the execution in the same write).
"""

from __future__ import annotations

import logging
from typing import Any

from agui_adapter.kernel_client.failures import KernelRejected
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.run.effects import Failed, KernelAnswer, KernelRefused, Reply
from agui_adapter.run.identity import Lost
from agui_adapter.run.task_lost import refusal_says_lost
from agui_adapter.run.translation import BUSY_STATES, FAILURE_STATES, FrameInfo, inspect_frame

log = logging.getLogger("agui_adapter.run")

#: Kernel task states after which a Resume has nothing to answer.
TASK_GONE_STATES = frozenset({"canceled", "completed"}) | FAILURE_STATES


def reason(reply: Reply) -> str:
    """A reply, for a log line."""
    return reply.reason if isinstance(reply, Failed) else type(reply).__name__


def check_restored(reply: Reply, run_id: str) -> None:
    """``RestoreSession``'s reply: the session is back, or raise."""
    if isinstance(reply, Failed):
        log.warning("run %s: kernel unavailable before resume: %s", run_id, reply.reason)
        raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
    if isinstance(reply, KernelAnswer):
        error = reply.body.get("error") if isinstance(reply.body, dict) else None
        if reply.status == 409 and isinstance(error, dict) and error.get("code") == Code.SESSION_BACKUP_NOT_READY:
            raise AguiError(Code.SESSION_BACKUP_NOT_READY, msg.SESSION_BACKUP_NOT_READY)
        if reply.status == 404:
            raise Lost(msg.RESUME_SESSION_UNAVAILABLE, session=True)
        if reply.status >= 400:
            log.warning("ensure-restored answered HTTP %s", reply.status)
            raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)


def check_task(reply: Reply, run_id: str, *, task_id: str | None, context_id: str, session_id: str | None) -> FrameInfo:
    """``GetTask``'s reply: the task, still ours and still waiting, or raise."""
    if isinstance(reply, KernelRefused):
        if refusal_says_lost(reply.error.rpc_code):
            raise Lost(msg.RESUME_TASK_UNAVAILABLE)
        raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
    if not isinstance(reply, KernelAnswer):
        log.warning("run %s: kernel unavailable before resume: %s", run_id, reason(reply))
        raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
    info = inspect_frame({"result": reply.body})
    if info.task_id != task_id or (info.context_id and info.context_id != context_id):
        raise AguiError(Code.A2A_PROTOCOL_ERROR, msg.RESUME_TASK_MISMATCH)
    if info.session_id and session_id and info.session_id != session_id:
        raise Lost(msg.SESSION_LOST, session=True)
    if info.state in TASK_GONE_STATES:
        raise Lost(msg.RESUME_TASK_UNAVAILABLE)
    return info


def check_sideband(reply: Reply, run_id: str) -> KernelRejected | None:
    """``SendMessage``'s reply to a sideband answer: None when the kernel took it, the
    kernel's refusal to map (``endings.rejection``), or raise."""
    if isinstance(reply, KernelRefused):
        return reply.error
    if not isinstance(reply, KernelAnswer):
        log.warning("run %s: kernel unavailable for an answer: %s", run_id, reason(reply))
        raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)
    if refused_ack(reply.body):  # a permission_ack saying accepted: false
        raise AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_REJECTED)
    return None


def check_stale_task_stopped(reply: Reply, run_id: str) -> None:
    """``StopTask``'s reply (a task left by a dead run): the new turn may start, or raise.
    A kernel that does not know the task (``KernelRefused``) has nothing to stop."""
    if isinstance(reply, KernelAnswer):
        state = inspect_frame({"result": reply.body}).state
        if state in BUSY_STATES:
            log.warning("run %s: an earlier task is still %s; starting anyway", run_id, state)
    elif isinstance(reply, Failed):
        raise AguiError(Code.A2A_UNAVAILABLE, msg.A2A_UNAVAILABLE)


def refused_ack(body: Any) -> bool:
    """Whether a unary answer's reply holds an acknowledgement with ``accepted: false``."""
    if isinstance(body, dict):
        if body.get("accepted") is False:
            return True
        return any(refused_ack(value) for value in body.values())
    if isinstance(body, list):
        return any(refused_ack(item) for item in body)
    return False
