"""iac-code pipeline envelopes: what they mean for AG-UI, and what was already delivered.

A pipeline spans many AG-UI runs (one per interrupt), and its envelopes reach the
adapter live — sometimes batched, out of order, or only in the kernel's journal
(``GET /iac-code/pipeline/state``). This module holds the pure parts: which envelopes
a frame carries, how steps are named, which event types the contract forwards as
``CUSTOM iac-code.pipeline.v1``, and ``PipelineProgress``, the durable record of which
journal sequences the client has already been sent, so that no event is lost or
delivered twice across runs and restarts. Sequences are never used to *drop* an event
just because a higher one was seen first: only "already delivered" counts. A publication
still pending the kernel's backup (:func:`is_pending_publication`) is never delivered: its
sequence counts as handled, and its committed twin is the one the client gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PIPELINE_EVENT = "iac-code.pipeline.v1"

#: Event types forwarded as CUSTOM iac-code.pipeline.v1 (the contract's allowlist).
CUSTOM_EVENT_TYPES = frozenset(
    {
        "pipeline_started",
        "pipeline_resumed",
        "pipeline_completed",
        "pipeline_error",
        "pipeline_warning",
        "backup_blocked",
        "candidate_started",
        "candidate_completed",
        "candidate_failed",
        "candidate_interrupted",
        "candidate_restart_requested",
        "candidate_selected",
        "candidate_detail_shown",
        "candidate_step_failed",
        "sub_pipeline_started",
        "sub_pipeline_completed",
        "sub_step_failed",
        "step_failed",
        "stack_progress",
        "stack_instances_progress",
        "stack_current_changed",
        "cleanup_started",
        "cleanup_progress",
        "cleanup_completed",
        "cleanup_failed",
        "rollback_triggered",
        "rollback_completed",
        "context_compaction_started",
        "context_compacted",
        "context_compaction_failed",
        "fields_marked_stale",
        "diagram_shown",
        "mcp_status",
        "tool_progress",
    }
)
STEP_OPENERS = frozenset({"step_started", "candidate_step_started", "input_received"})
STEP_CLOSERS = frozenset({"step_completed", "step_failed", "candidate_step_completed", "candidate_step_failed"})


def envelopes(iac: dict[str, Any]) -> list[dict[str, Any]]:
    """The pipeline envelopes of one frame: the batch first, then the single one."""
    out: list[dict[str, Any]] = []
    batch = iac.get("pipelineBatch")
    if isinstance(batch, dict) and isinstance(batch.get("events"), list):
        out.extend(e for e in batch["events"] if isinstance(e, dict))
    single = iac.get("pipeline")
    if isinstance(single, dict):
        out.append(single)
    return out


def _coordinate_id(value: Any, *keys: str) -> str | None:
    if not isinstance(value, dict):
        return None
    for key in keys:
        item = value.get(key)
        if isinstance(item, str) and item:
            return item
    return None


def step_key(envelope: dict[str, Any]) -> str | None:
    """``step:<id>`` or ``candidate:<candidate>:<id>``; None when there is no step."""
    coordinate = envelope.get("candidateStep") or envelope.get("step")
    step_id = _coordinate_id(coordinate, "id")
    if step_id is None:
        return None
    candidate = _coordinate_id(envelope.get("candidate"), "id", "subPipelineId", "runId")
    return f"candidate:{candidate}:{step_id}" if candidate else f"step:{step_id}"


def step_name(key: str) -> str:
    """The AG-UI stepName: the plain step id, or the full key for candidate steps."""
    return key[len("step:") :] if key.startswith("step:") else key


def message_key(envelope: dict[str, Any], pipeline_run_id: str) -> str:
    """One AG-UI text message per pipeline scope (candidates stream in parallel)."""
    parts = ["pipeline-message", pipeline_run_id, str(envelope.get("scope") or "pipeline")]
    for name in ("candidate", "candidateStep", "step"):
        coordinate = _coordinate_id(envelope.get(name), "runId", "id")
        if coordinate and coordinate not in parts:
            parts.append(coordinate)
    return ":".join(parts)


#: The ``visibility`` of a publication journaled before the kernel's backup committed it.
PENDING_BACKUP = "pending_backup"


def is_pending_publication(envelope: dict[str, Any]) -> bool:
    """A publication the kernel journaled before its backup committed (``visibility:
    "pending_backup"``, at the top or in ``data``, or ``data.backupPending``), as the kernel's
    own ``_is_pending_backup_publication`` reads it. Its live stream never carries one: the
    committed twin (another ``eventId``, a later sequence) follows once the backup is
    durable, and if the backup fails, a ``backup_blocked`` event follows instead and the
    kernel's snapshot drops the pending publication. So the client is sent none of them."""
    data = envelope.get("data")
    data = data if isinstance(data, dict) else {}
    visibility = envelope.get("visibility")
    if not isinstance(visibility, str):
        visibility = data.get("visibility")
    return visibility == PENDING_BACKUP or data.get("backupPending") is True


def sequence_of(envelope: dict[str, Any]) -> int | None:
    value = envelope.get("sequence")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass
class PipelineProgress:
    """Which journal sequences were delivered, and which business steps are open."""

    high_water: int = 0  # every sequence <= high_water was delivered
    delivered: set[int] = field(default_factory=set)  # delivered sequences above high_water
    open_steps: set[str] = field(default_factory=set)
    run_id: str | None = None  # the kernel's pipelineRunId

    def seen(self, sequence: int) -> bool:
        return sequence <= self.high_water or sequence in self.delivered

    def mark(self, sequence: int) -> None:
        if sequence <= self.high_water:
            return
        self.delivered.add(sequence)
        while self.high_water + 1 in self.delivered:
            self.high_water += 1
            self.delivered.discard(self.high_water)

    def to_json(self) -> dict[str, Any]:
        return {
            "highWater": self.high_water,
            "delivered": sorted(self.delivered),
            "openSteps": sorted(self.open_steps),
            "runId": self.run_id,
        }

    @classmethod
    def from_json(cls, data: Any) -> PipelineProgress:
        if not isinstance(data, dict):
            return cls()
        run_id = data.get("runId")
        return cls(
            high_water=int(data.get("highWater") or 0),
            delivered={int(s) for s in data.get("delivered") or []},
            open_steps={str(s) for s in data.get("openSteps") or []},
            run_id=run_id if isinstance(run_id, str) else None,
        )
