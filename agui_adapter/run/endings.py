"""How a run's kernel work ended, as the AG-UI error it ends with (sans-I/O).

Pure functions for ``run.machine``: the RUN_ERROR a JSON-RPC refusal means, and the verdict
on a stream that closed (RUN_FINISHED when the kernel's last state was a good one, else the
error its states and failure detail say). The order of the ending itself (release the
thread before the final event, spans closed first) is the machine's.
"""

from __future__ import annotations

import logging

from agui_adapter.kernel_client.failures import KernelRejected
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code, clip_detail

log = logging.getLogger("agui_adapter.run")

#: The last kernel states of a stream that ends a run well.
GOOD_END_STATES = frozenset({"completed", "input-required"})


def rejection(exc: KernelRejected, run_id: str, *, answering: bool) -> AguiError:
    """The RUN_ERROR for a JSON-RPC error: a retryable backup wait, a refused answer (the
    interrupt stays pending: ``answering``), or a refused request."""
    data = exc.data
    if isinstance(data, dict) and data.get("code") == Code.SESSION_BACKUP_NOT_READY:
        return AguiError(Code.SESSION_BACKUP_NOT_READY, msg.SESSION_BACKUP_NOT_READY)
    log.warning("run %s: the kernel rejected the request: %s", run_id, exc)
    if answering:
        return AguiError(Code.A2A_UNAVAILABLE, msg.RESUME_REJECTED)
    return AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_REJECTED, {"detail": clip_detail(exc.detail)})


def stream_error(bad_state: str | None, last_state: str | None, failure_detail: str | None) -> AguiError | None:
    """The error a closed stream ends the run with, or None for success. A cancellation
    outranks a failure; a stream that stopped in a busy state failed."""
    if bad_state == "canceled":
        return AguiError(Code.CANCELLED, msg.CANCELLED)
    if bad_state is not None or last_state not in GOOD_END_STATES:
        if failure_detail:
            return AguiError(
                Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED_DETAIL, {"detail": clip_detail(failure_detail)}
            )
        return AguiError(Code.A2A_EXECUTION_FAILED, msg.A2A_EXECUTION_FAILED)
    return None
