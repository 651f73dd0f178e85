"""The one rule that says a kernel task is lost.

A task is lost when the kernel refuses a call about it with JSON-RPC ``-32001`` (task not
found: the kernel restarted, or forgot it), or, for a task something still waits on (an
interrupt's answer), when its last state is terminal: nobody can answer it any more. A
kernel that does not answer (down, slow) has lost nothing: the caller tries again later
(``adoption``'s health look, admission's ``RESUME_REQUIRED``). The machine reads a refusal
(``refusal_says_lost``); admission asks the kernel (``admission.ask_whether_lost``), outside
any record lock. A pure module: it imports nothing of the kernel client.
"""

from __future__ import annotations

from typing import Any

from agui_adapter.run.translation import TERMINAL_STATES, inspect_frame

#: JSON-RPC error of A2A: the task is not found (or, for SubscribeToTask, not active).
TASK_NOT_FOUND = -32001


def refusal_says_lost(rpc_code: int | None) -> bool:
    """Whether a JSON-RPC refusal about a task (``GetTask``, ``SubscribeToTask`` once
    ``follow`` fell back to ``GetTask``) says the kernel no longer has it."""
    return rpc_code == TASK_NOT_FOUND


def snapshot_says_lost(task: Any) -> bool:
    """Whether a task's snapshot says it ended: what waited on it waits for nothing."""
    return inspect_frame({"result": task}).state in TERMINAL_STATES
