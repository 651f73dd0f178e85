"""The once-only check of a pipeline's business events, shared by the scripted and real-kernel suites.

Across every run of one pipeline, each business event the kernel journaled (terminal, handoff,
permission, input, backup_blocked) reaches the client at most once, by ``eventId`` and by
``(eventType, sequence)``; a publication still pending the kernel's backup
(``visibility: "pending_backup"``) never does, its committed twin does when it is allowlisted;
and no interrupt is raised twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from agui_adapter.run.pipeline_progress import CUSTOM_EVENT_TYPES, PIPELINE_EVENT, is_pending_publication

#: The events a client acts on: shown twice, they say twice that something happened.
BUSINESS_EVENT_TYPES = (
    "pipeline_completed",
    "pipeline_failed",
    "pipeline_canceled",
    "pipeline_handoff_ready",
    "permission_requested",
    "permission_resolved",
    "input_required",
    "input_received",
    "backup_blocked",
)


def delivered_pipeline_events(runs: list[Any]) -> list[dict[str, Any]]:
    return [e["value"] for r in runs for e in r.of("CUSTOM") if e["name"] == PIPELINE_EVENT]


def assert_business_events_once(runs: list[Any], journal: list[dict[str, Any]]) -> None:
    """``runs``: the RunResults of one pipeline, in order; ``journal``: the kernel's journal of its task."""
    delivered = delivered_pipeline_events(runs)
    ids = Counter(v["eventId"] for v in delivered)
    assert not [i for i, n in ids.items() if n > 1], f"delivered twice by eventId: {ids.most_common(3)}"
    keys = Counter((v["eventType"], v.get("sequence")) for v in delivered)
    assert not [k for k, n in keys.items() if n > 1], f"delivered twice by (type, sequence): {keys.most_common(3)}"
    pending = [(v["eventType"], v.get("sequence")) for v in delivered if is_pending_publication(v)]
    assert not pending, f"publications pending the kernel's backup were delivered: {pending}"
    for kind in BUSINESS_EVENT_TYPES:
        sent = sorted(v["sequence"] for v in delivered if v["eventType"] == kind)
        committed = sorted(e["sequence"] for e in journal if e["eventType"] == kind and not is_pending_publication(e))
        assert sent == (committed if kind in CUSTOM_EVENT_TYPES else []), (kind, sent, committed)
    interrupts = Counter(
        i["id"]
        for r in runs
        if r.terminal["type"] == "RUN_FINISHED" and r.terminal["outcome"]["type"] == "interrupt"
        for i in r.terminal["outcome"]["interrupts"]
    )
    assert not [i for i, n in interrupts.items() if n > 1], f"an interrupt raised twice: {interrupts.most_common(3)}"
