"""The artifacts an adopted run's kernel task made while no adapter process followed it.

A live run maps each ``artifactUpdate`` frame (``write_file`` wrote a file, say) to the CUSTOM
event ``iac-code.artifact.v1`` (``translation.ARTIFACT_EVENT``). Those the kernel sent while the
run's process was dead reached no journal. The kernel's task snapshot, the first frame of
``SubscribeToTask`` or the answer of ``GetTask``, carries the task's ``artifacts`` (A2A
``Task.artifacts``: each the very object its ``artifactUpdate`` carried; captures
``tests/data/a2a-subscribe/`` 10-13), and the live updates that follow the snapshot do not
repeat them. So the adopter sends, in the shape a live run sends them, the snapshot's artifacts
whose ``artifactId`` the run's journal does not hold: ``RunTranslator.reconcile`` calls
``RunTranslator.gap_artifacts`` with the snapshot after the gap's tool results (where a live run
has them), which the adopter (``adoption.Adoption``) sets to ``gap_artifact_events`` of the
snapshot and the journal's ids.

Only a run that began its task is given them: a Resume continues a task whose earlier runs
already sent its earlier artifacts (their journals, not this one, hold them), and the kernel's
stored task never learns what a Resume's continuation made once that Resume's stream closed
(capture 15), so the snapshot could only give a Resume artifacts that are not its own.
Pure: no I/O, timestamps passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from agui_adapter.protocol import events as ev
from agui_adapter.protocol.events import Event
from agui_adapter.run.translation import ARTIFACT_EVENT, normalize_numbers


def artifact_event(artifact: dict[str, Any], ts: int) -> Event:
    """The CUSTOM event of one artifact, as a live run sends it for an ``artifactUpdate``."""
    return ev.custom(ts, ARTIFACT_EVENT, {"schemaVersion": 1, **normalize_numbers(artifact)})


def journal_artifact_ids(events: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The ``artifactId`` of every artifact event a run's journal holds."""
    ids: set[str] = set()
    for event in events:
        if event.get("type") == "CUSTOM" and event.get("name") == ARTIFACT_EVENT:
            value = event.get("value")
            if isinstance(value, dict) and isinstance(value.get("artifactId"), str):
                ids.add(value["artifactId"])
    return frozenset(ids)


def gap_artifact_events(task: dict[str, Any], sent: Iterable[str], ts: int) -> list[Event]:
    """The artifact events of the task's snapshot (``task``: a ``Task`` object) whose
    ``artifactId`` is not in ``sent``, in the snapshot's order, each once."""
    artifacts = task.get("artifacts")
    if not isinstance(artifacts, list):
        return []
    seen = set(sent)
    out: list[Event] = []
    for artifact in artifacts:
        if not isinstance(artifact, dict):
            continue
        artifact_id = artifact.get("artifactId")
        if not isinstance(artifact_id, str) or not artifact_id or artifact_id in seen:
            continue
        seen.add(artifact_id)
        out.append(artifact_event(artifact, ts))
    return out


def for_journal(events: Iterable[dict[str, Any]]) -> Callable[[dict[str, Any], int], list[Event]]:
    """``RunTranslator.gap_artifacts`` of an adopted run whose journal holds ``events``."""
    sent = journal_artifact_ids(events)
    return lambda task, ts: gap_artifact_events(task, sent, ts)
