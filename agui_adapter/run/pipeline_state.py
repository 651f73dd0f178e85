"""The kernel's pipeline journal, asked for and mapped to AG-UI events (sans-I/O).

A pipeline run's events reach the client live on the kernel stream; those the stream
skipped (a gap) or that happened while nobody followed (a Resume, an adopted run) are in the
kernel's pipeline journal. ``journal_params`` says what to ask for (after the last sequence
delivered), ``events_from`` maps the reply through the run's translator, and
``adopt_progress`` takes up what a dead process delivered (``pipeline.json``).
"""

from __future__ import annotations

import logging
from typing import Any

from agui_adapter.protocol.events import Event
from agui_adapter.run.effects import Failed, KernelAnswer, Reply
from agui_adapter.run.pipeline_progress import PipelineProgress
from agui_adapter.run.translation import RunTranslator

log = logging.getLogger("agui_adapter.run")


def journal_params(task_id: str | None, progress: PipelineProgress, *, snapshot: bool) -> dict[str, Any]:
    """``FetchPipelineState``'s parameters: the journal after what the client has, and the
    snapshot unless only the gaps are wanted."""
    params: dict[str, Any] = {"taskId": task_id, "afterSequence": progress.high_water}
    if not snapshot:
        params["includeSnapshot"] = "false"
    return params


def events_from(reply: Reply, translator: RunTranslator, ts: int, run_id: str, *, snapshot: bool) -> list[Event]:
    """What the kernel's journal holds after what the client has, as events (absent: none)."""
    if isinstance(reply, Failed):
        log.warning("run %s: pipeline state unavailable: %s", run_id, reply.reason)
        return []
    if not isinstance(reply, KernelAnswer) or reply.status != 200 or not isinstance(reply.body, dict):
        if isinstance(reply, KernelAnswer) and reply.status != 404:
            log.warning("run %s: pipeline state answered HTTP %s", run_id, reply.status)
        return []
    out: list[Event] = []
    if snapshot and isinstance(reply.body.get("snapshot"), dict):
        out.append(translator.snapshot_event(reply.body["snapshot"], ts))
    for envelope in reply.body.get("events") or []:
        if isinstance(envelope, dict):
            translator.map_envelope(envelope, ts, out)
    return out


def adopt_progress(translator: RunTranslator, noted_json: dict[str, Any]) -> None:
    """An adopted run's translator takes up the sequences the dead process delivered."""
    noted, progress = PipelineProgress.from_json(noted_json), translator.pipeline
    for sequence in sorted(noted.delivered | set(range(progress.high_water + 1, noted.high_water + 1))):
        progress.mark(sequence)
    progress.run_id = progress.run_id or noted.run_id
    translator.pipeline_seen = True
