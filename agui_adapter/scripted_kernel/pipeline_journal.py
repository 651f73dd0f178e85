"""A pipeline run's journal and its projection: what ``/iac-code/pipeline/state`` shows.

Why: every pipeline envelope the kernel creates is journaled and folded into a
snapshot (steps, messages, permissions, inputs, handoff), as the real kernel
keeps it in the session; a restarted adapter reads it back through the REST
endpoint. This module is that bookkeeping, apart from the scripts that emit
the envelopes.
"""

from __future__ import annotations

import copy
import queue
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agui_adapter.scripted_kernel.wire import UTC

if TYPE_CHECKING:
    from agui_adapter.scripted_kernel.frames import PipeRun
    from agui_adapter.scripted_kernel.tasks import Pending

PIPELINE_EXTENSION_URI = "urn:iac-code:a2a:pipeline-events:v1"
PIPELINE_NAMES = ("selling", "selling_solution_first")
PIPELINE_STEPS = (
    "intent_parsing",
    "architecture_planning",
    "evaluate_candidates",
    "confirm_and_select",
    "deploying",
)
#: selling_solution_first's own steps (tests/data/a2a-selling/13): plan and choose, materialize and
#: confirm, deploy
SOLUTION_FIRST_STEPS = ("solution_planning_and_selection", "materialize_selected_candidate", "deploying")


def pipeline_steps(name: str) -> tuple[str, ...]:
    """The steps of the named pipeline (``selling``'s five, ``selling_solution_first``'s three)."""
    return SOLUTION_FIRST_STEPS if name == "selling_solution_first" else PIPELINE_STEPS


def wait_iac(waits: list[Pending]) -> dict[str, Any]:
    """The ``iac_code`` keys that describe the pending waits of a pipeline task."""
    first = waits[0]
    if first.kind == "deployment_confirmation":
        return {}  # the real kernel sends this wait without an input (tests/data/a2a-selling/15, 21)
    iac: dict[str, Any] = {"input": first.envelope}
    if first.kind == "cloud_resource_selection":
        iac["inputRequired"] = first.envelope
    return iac


def match_option(options: list[dict[str, Any]], answer: str) -> dict[str, Any] | None:
    """The option whose label or id is the answer (case-insensitive), if any."""
    wanted = answer.casefold()
    return next(
        (o for o in options if wanted in (str(o.get("label", "")).casefold(), str(o.get("id", "")).casefold())),
        None,
    )


@dataclass
class Pipeline:
    """One pipeline run: its journal, its projection (the snapshot) and its pending waits.

    Everything here lives in the kernel (guarded by ``KernelState.lock``), so a
    restarted adapter finds the run exactly where it was.
    """

    task_id: str
    context_id: str
    session_id: str
    name: str
    user_request: str
    flags: frozenset[str]
    rich: bool = False
    language: str = "en"
    seq: int = 0  # last sequence handed out (continues across pipelines of a context)
    journal: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    snapshot_version: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    rounds: dict[str, int] = field(default_factory=dict)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    input_history: list[dict[str, Any]] = field(default_factory=list)
    handoff_history: list[dict[str, Any]] = field(default_factory=list)
    cleanup_history: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    active_candidates: list[str] = field(default_factory=list)
    guidance: list[str] = field(default_factory=list)  # activeGuidance texts received while running
    pending_input: dict[str, Any] | None = None
    normal_handoff: dict[str, Any] | None = None
    pending_handoff: dict[str, Any] | None = None
    waits: list[Pending] = field(default_factory=list)
    # candidate-step permissions: waited for while the task stays WORKING, answered out of band
    side_waits: list[Pending] = field(default_factory=list)
    side_answers: queue.SimpleQueue[tuple[Pending, str]] = field(default_factory=queue.SimpleQueue)
    gen: Generator[Any, Any, None] | None = None
    runner: PipeRun | None = None

    # ----------------------------------------------------------- projection

    def _step(self, envelope: dict[str, Any]) -> dict[str, Any] | None:
        coordinate = envelope.get("step")
        if not isinstance(coordinate, dict):
            return None
        return next((s for s in reversed(self.steps) if s["id"] == coordinate.get("id")), None)

    @staticmethod
    def _coordinate(envelope: dict[str, Any]) -> dict[str, Any]:
        step = envelope.get("step")
        return {k: step[k] for k in ("attempt", "id", "index", "runId", "total")} if isinstance(step, dict) else {}

    @staticmethod
    def _run_key(envelope: dict[str, Any]) -> str:
        for name in ("candidateStep", "step"):
            coordinate = envelope.get(name)
            if isinstance(coordinate, dict):
                return f"{envelope['scope']}-{coordinate['runId']}"
        return "pipeline"

    def _entry(self, envelope: dict[str, Any], **extra: Any) -> dict[str, Any]:
        entry: dict[str, Any] = dict(envelope.get("data") or {})
        entry.update(
            {
                "createdAt": envelope["createdAt"],
                "data": dict(envelope.get("data") or {}),
                "eventId": envelope["eventId"],
                "eventType": envelope["eventType"],
                "scope": envelope["scope"],
                "sequence": envelope["sequence"],
                "status": envelope["status"],
            }
        )
        if "step" in envelope:
            entry["step"] = self._coordinate(envelope)
            entry["runId"] = envelope["step"]["runId"]
        entry.update(extra)
        return entry

    def apply(self, envelope: dict[str, Any]) -> None:
        """Project one envelope into the snapshot state."""
        kind = envelope["eventType"]
        data = envelope.get("data") or {}
        created = envelope["createdAt"]
        if kind != "backup_committed":
            self.snapshot_version += 1
        step = self._step(envelope)
        if kind == "pipeline_started":
            self.status = "running"
        elif kind == "step_started":
            coordinate = envelope["step"]
            self.steps.append(
                {
                    "attempt": coordinate["attempt"],
                    "candidates": [],
                    "id": coordinate["id"],
                    "index": coordinate["index"],
                    "runId": coordinate["runId"],
                    "startedAt": created,
                    "status": "running",
                    "total": coordinate["total"],
                    "type": "normal",
                }
                | ({"uiMode": coordinate["uiMode"]} if coordinate.get("uiMode") else {})
            )
        elif kind == "message_started":
            key = self._run_key(envelope)
            self.rounds[key] = self.rounds.get(key, 0) + 1
        elif kind == "text_delta":
            self._append_text(envelope, str(data.get("text", "")))
        elif kind == "tool_result":
            self.tool_results.append(
                self._entry(envelope, id=data.get("toolUseId"))
                | {k: v for k, v in data.items() if k in ("toolName", "toolUseId", "isError", "result", "input")}
            )
        elif kind == "input_required":
            entry = self._entry(envelope, required=True, input=dict(envelope.get("input") or {}))
            self.input_history.append(entry)
            pending = {k: v for k, v in entry.items() if k not in ("data", "eventType", "input", "sequence", "status")}
            self.pending_input = pending
            self.status = "waiting_input"
            if step is not None:
                step["status"] = "waiting_input"
        elif kind == "input_received":
            self.input_history.append(self._entry(envelope))
            self.pending_input = None
            self.status = "running"
            if step is not None:
                step["status"] = "running"
                step["inputReceived"] = dict(data)
        elif kind == "permission_requested" and envelope.get("visibility") == "pending_backup":
            pass  # the same request is journaled again as committed
        elif kind == "permission_requested":
            entry = self._entry(envelope, candidate=dict(envelope.get("candidate") or {}))
            entry["inputId"] = (envelope.get("permission") or {}).get("inputId")
            entry["status"] = "pending"
            self.permissions.append(entry)
            if self.pending_input is None:
                self.pending_input = {k: v for k, v in entry.items() if k not in ("data", "eventType", "sequence")}
            self.status = "waiting_input"
            if step is not None:
                step["status"] = "waiting_input"
        elif kind == "permission_resolved":
            for entry in self.permissions:
                if entry.get("inputId") == data.get("inputId"):
                    entry["status"] = "resolved"
                    entry["decision"] = data.get("decision")
                    entry["resolvedAt"] = created
            waiting = [e for e in self.permissions if e["status"] == "pending"]
            if waiting:
                self.pending_input = {k: v for k, v in waiting[0].items() if k not in ("data", "eventType", "sequence")}
            else:
                self.pending_input = None
                self.status = "running"
                if step is not None:
                    step["status"] = "running"
        elif kind == "candidate_started" and step is not None:
            candidate = envelope["candidate"]
            step["candidates"].append(
                {key: candidate[key] for key in ("attempt", "id", "index", "name", "pipelineName", "runId")}
                | {"startedAt": created, "status": "running"}
            )
            self.active_candidates.append(candidate["runId"])
        elif kind in ("candidate_completed", "candidate_failed") and step is not None:
            candidate = envelope["candidate"]
            for item in step["candidates"]:
                if item["runId"] == candidate["runId"]:
                    item["status"] = "completed" if kind == "candidate_completed" else "failed"
                    item["completedAt"] = created
                    item.update({k: v for k, v in data.items() if k in ("conclusions", "failed", "step_conclusions")})
            if candidate["runId"] in self.active_candidates:
                self.active_candidates.remove(candidate["runId"])
        elif kind == "step_completed" and step is not None:
            step.update(
                {
                    "status": "completed",
                    "completedAt": created,
                    "conclusion": data.get("conclusion"),
                    "conclusionField": data.get("conclusionField"),
                    "durationS": data.get("durationS"),
                }
            )
        elif kind == "step_failed" and step is not None:
            step.update({"status": "failed", "failedAt": created, "error": data.get("error")})
            self.status = "failed"
        elif kind == "pipeline_error":
            self.warnings.append(self._entry(envelope))
            self.status = "failed"
        elif kind == "pipeline_completed":
            self.status = "completed"
        elif kind == "pipeline_failed":
            self.status = "failed"
        elif kind == "pipeline_canceled":
            self.status = "canceled"
            self.pending_input = None
            for item in self.steps:
                if item["status"] in ("running", "waiting_input"):
                    item["status"] = "canceled"
        elif kind == "pipeline_handoff_ready":
            entry = self._entry(envelope)
            entry["visibility"] = envelope.get("visibility")
            cleanup = data.get("cleanup") or {}
            self.cleanup_history.append(
                {
                    "createdAt": created,
                    "data": dict(cleanup),
                    "eventId": envelope["eventId"],
                    "eventType": kind,
                    "scope": envelope["scope"],
                    "sequence": envelope["sequence"],
                    "status": cleanup.get("status"),
                }
            )
            if envelope.get("visibility") == "committed":
                self.normal_handoff = entry
                self.pending_handoff = None
                self.handoff_history.append(entry)
            else:
                self.pending_handoff = entry

    def _append_text(self, envelope: dict[str, Any], text: str) -> None:
        key = self._run_key(envelope)
        round_ = self.rounds.get(key, 1)
        message_id = f"message-{key}" if round_ == 1 else f"message-{key}-round-{round_}"
        message = next((m for m in self.messages if m["id"] == message_id), None)
        if message is None:
            message = {
                "createdAt": envelope["createdAt"],
                "id": message_id,
                "round": round_,
                "scope": envelope["scope"],
                "segments": [],
                "text": "",
            }
            if "step" in envelope:
                message["step"] = self._coordinate(envelope)
                message["runId"] = envelope["step"]["runId"]
            for name in ("candidate", "candidateStep"):
                if name in envelope:
                    message[name] = dict(envelope[name])
            self.messages.append(message)
        message["text"] += text
        message["segments"] = [{"kind": "text", "text": message["text"]}]
        message["updatedAt"] = envelope["createdAt"]

    def snapshot(self, *, lean: bool = False) -> dict[str, Any]:
        """The ``snapshot`` object of ``GET /iac-code/pipeline/state`` (a deep copy)."""
        display: dict[str, Any] = {
            "artifacts": [],
            "candidateDetails": [],
            "diagrams": [],
            "messages": self.messages,
            "permissions": self.permissions,
        }
        if not lean:
            display["toolResults"] = self.tool_results
        cleanup_status = self.cleanup_history[-1]["status"] if self.cleanup_history else "none"
        cleanup: dict[str, Any] = {
            "history": self.cleanup_history,
            "resourceCount": 0,
            "resources": [],
            "status": cleanup_status,
        }
        if self.cleanup_history:
            cleanup["statusMessage"] = self.cleanup_history[-1]["data"].get("statusMessage")
        snapshot = {
            "cleanup": cleanup,
            "contextId": self.context_id,
            "control": {
                "activeCandidateRunIds": self.active_candidates,
                "candidateRestarts": [],
                "handoffHistory": self.handoff_history,
                "inputHistory": self.input_history,
                "interruptHistory": [],
                "rollbackHistory": [],
                "stepNames": list(pipeline_steps(self.name)),
                "totalSteps": len(pipeline_steps(self.name)),
                "userRequest": self.user_request,
                "warningHistory": self.warnings,
            },
            "display": display,
            "generatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSequence": self.seq,
            "normalHandoff": self.normal_handoff,
            "pendingInput": self.pending_input,
            "pendingNormalHandoff": self.pending_handoff,
            "pendingTerminal": None,
            "pipelineName": self.name,
            "pipelineRunId": self.context_id,
            "schemaVersion": "1.2",
            "snapshotVersion": self.snapshot_version,
            "stacks": {"byId": {}, "current": None, "history": []},
            "status": self.status,
            "steps": self.steps,
            "taskId": self.task_id,
        }
        return copy.deepcopy(snapshot)
