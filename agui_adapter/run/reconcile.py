"""An adopted run catching up: the dead process's journal taken up, the kernel's gap given back (sans-I/O).

A run another process began and died in (``run.adoption``) goes on in a new process with a
fresh ``RunTranslator``. Before the translator maps the kernel's next frame it must know what
the client was already sent, and what the kernel did while no process followed: that is this
module's job, kept out of the translator, which only maps live frames.

``Reconciliation`` takes up the journal's events (the ids used, the spans left open, the text
each kernel message showed, the tool calls that have their result, the pipeline envelopes
delivered) into its translator's bookkeeping, and ``reconcile`` sends what the kernel's task
snapshot and conversation hold beyond that. ``gap_tool_calls`` reads the run's tool calls out of
the kernel's conversation (the adopted driver asks the kernel for it). It works on the
translator's span bookkeeping directly: it is the translator's other way in, besides frames.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agui_adapter.protocol import events as ev
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.spans import step_key_of
from agui_adapter.run import pipeline_progress as pl
from agui_adapter.run.history import agui_messages
from agui_adapter.run.translation import (
    TERMINAL_STATES,
    RunTranslator,
    compact_json,
    mint_id,
    nonempty_str,
    normalize_numbers,
    normalize_state,
)
from agui_adapter.state.record import RunEntry


@dataclass(frozen=True, slots=True)
class GapToolCall:
    """A tool call of the run as the kernel's conversation keeps it (``Reconciliation.reconcile``)."""

    tool_call_id: str
    name: str
    arguments: str  # compact JSON, as ``TOOL_CALL_ARGS`` carries it live


def gap_tool_calls(
    conversation: Sequence[Any], runs: Sequence[RunEntry], run_id: str, task_id: str, namespace: str | None
) -> tuple[list[GapToolCall], list[tuple[str, str]]]:
    """The tool calls and tool results of one run in the kernel's conversation (the
    ``messages`` of ``GET /iac-code/session/recovery``), with the ids the run streams them
    under: the conversation is cut into runs as ``GET /threads/{t}/messages`` cuts it
    (``history.agui_messages``); the run's own entry does not carry its task yet (a run's
    task is written when it ends), so it is given here. A run's calls are those of its
    assistant message; its results, the tool messages minted in its namespace (a Resume's
    include the result of the call its interrupt asked about, started by the run before)."""
    runs = [replace(e, task_id=task_id) if e.run_id == run_id and not e.task_id else e for e in runs]
    messages = agui_messages(conversation, runs)
    own = mint_id(f"{task_id}-message", namespace, set())
    calls: list[GapToolCall] = []
    for message in messages:
        if message.get("id") == own and message.get("role") == "assistant":
            for call in message.get("toolCalls") or []:
                function = call.get("function") or {}
                try:
                    arguments = compact_json(normalize_numbers(json.loads(function.get("arguments") or "{}")))
                except ValueError:
                    arguments = "{}"
                calls.append(GapToolCall(str(call["id"]), str(function.get("name") or "tool"), arguments))
    called = {c.tool_call_id for c in calls}
    results = [
        (str(m["toolCallId"]), str(m.get("content") or ""))
        for m in messages
        if m.get("role") == "tool"
        and m.get("id") == mint_id(f"tool-result-{m.get('toolCallId')}", namespace, set())
        and (namespace is not None or m.get("toolCallId") in called)
    ]
    return calls, results


class Reconciliation:
    """One adopted run's translator, taking up the journal and catching up with the kernel."""

    def __init__(self, translator: RunTranslator, journal: Iterable[dict[str, Any]]) -> None:
        self.translator = translator
        # the tool calls of this run that the kernel's conversation holds (``run.adoption`` reads them)
        self.gap_tool_calls: list[GapToolCall] = []
        self.gap_tool_results: list[tuple[str, str]] = []  # (tool call id, result)
        self._restored_args: set[str] = set()  # open tool calls whose ARGS the journal holds
        # the artifacts the task snapshot holds beyond the journal's (``run.gap_artifacts``)
        self.gap_artifacts: Callable[[dict[str, Any], int], list[Event]] | None = None
        self._restore(journal)

    def _kernel_id(self, agui_id: str) -> str:
        """The kernel message id an AG-UI text id was minted from (``mint_id`` undone)."""
        namespace = self.translator.id_namespace
        base, tilde, n = agui_id.rpartition("~")
        if tilde and n.isdigit():
            agui_id = base
        if namespace and agui_id.endswith(f"@{namespace}"):
            agui_id = agui_id[: -len(namespace) - 1]
        return agui_id

    def _restore(self, events: Iterable[dict[str, Any]]) -> None:
        """Take up a run whose first events another process sent (its journal): the ids
        they used, the spans they left open, the text each kernel message showed, the tool
        calls that have their result, the pipeline envelopes delivered. Usage the dead
        process summed is not in the events: the final usage counts what follows."""
        t = self.translator
        for event in events:
            kind = event.get("type")
            mid = event.get("messageId")
            if isinstance(mid, str):
                t._used_ids.add(mid)
            if kind == "TEXT_MESSAGE_START" and isinstance(mid, str):
                t._open_text[mid] = None
                t._text_alias[self._kernel_id(mid)] = mid
                t._current_text = mid
            elif kind == "TEXT_MESSAGE_CONTENT" and isinstance(mid, str):
                t._shown.setdefault(self._kernel_id(mid), []).append(str(event.get("delta") or ""))
                t.text_emitted = True
            elif kind == "TEXT_MESSAGE_END" and isinstance(mid, str):
                t._open_text.pop(mid, None)
                if t._current_text == mid:
                    t._current_text = next(reversed(t._open_text), None) if t._open_text else None
            elif kind == "TOOL_CALL_START":
                t._started_tools.add(str(event.get("toolCallId")))
                t._open_tools[str(event.get("toolCallId"))] = None
            elif kind == "TOOL_CALL_ARGS":
                self._restored_args.add(str(event.get("toolCallId")))
            elif kind == "TOOL_CALL_END":
                t._open_tools.pop(str(event.get("toolCallId")), None)
            elif kind == "TOOL_CALL_RESULT":
                t._tool_results.add(str(event.get("toolCallId")))
            elif kind == "REASONING_START" and isinstance(mid, str):
                t._open_reasoning[mid] = None
            elif kind == "REASONING_END" and isinstance(mid, str):
                t._open_reasoning.pop(mid, None)
            elif kind == "STEP_STARTED":
                key = step_key_of(str(event.get("stepName")))
                t._active_steps[key] = None
                t.pipeline.open_steps.add(key)
            elif kind == "STEP_FINISHED":
                key = step_key_of(str(event.get("stepName")))
                t._active_steps.pop(key, None)
                t.pipeline.open_steps.discard(key)
            elif kind == "CUSTOM" and event.get("name") == pl.PIPELINE_EVENT and isinstance(event.get("value"), dict):
                envelope = event["value"]
                t.pipeline_seen = True
                if isinstance(envelope.get("eventId"), str):
                    t._event_ids.add(envelope["eventId"])
                sequence = pl.sequence_of(envelope)
                if sequence is not None:
                    t.pipeline.mark(sequence)
                run_id = envelope.get("pipelineRunId")
                if t.pipeline.run_id is None and isinstance(run_id, str) and run_id:
                    t.pipeline.run_id = run_id

    def reconcile(self, task: dict[str, Any], ts: int) -> list[Event]:
        """The text the kernel produced while no process followed the run: the task's
        snapshot (the first frame of ``SubscribeToTask``, or ``GetTask`` of a task that no
        longer runs) holds every agent delta so far (``history``, then ``status.message``);
        what each kernel message holds beyond what was shown of it is sent now, so the text
        ends up the kernel's. The kernel's final repeat of the answer (a message whose text
        is the text of the messages before it) is not text of its own. The tool calls are not
        in the snapshot: the adopter reads them from the kernel's conversation once the
        snapshot arrived (``gap_tool_calls``, ``gap_tool_results``: ``adoption``); those the
        journal does not hold are sent first, each call's START/ARGS/END (or the rest of
        them) and its result, with the ids a live run gives them. What neither gives back
        (reasoning deltas, tool progress) is not made up."""
        t = self.translator
        out: list[Event] = []
        for call in self.gap_tool_calls:
            tool_id = call.tool_call_id
            if tool_id not in t._started_tools:
                t._started_tools.add(tool_id)
                t._open_tools[tool_id] = None
                out.append(ev.tool_start(ts, tool_id, call.name, t._current_text))
            if tool_id in t._open_tools:  # ARGS go out with END (``input_complete``)
                if tool_id not in self._restored_args:  # a journal cut between the two holds them
                    out.append(ev.tool_args(ts, tool_id, call.arguments))
                del t._open_tools[tool_id]
                out.append(ev.tool_end(ts, tool_id))
        for tool_id, result in self.gap_tool_results:
            t.emit_tool_result(tool_id, result, ts, out)  # once per call: the journal's count
        self.gap_tool_calls, self.gap_tool_results = [], []
        out += self.gap_artifacts(task, ts) if self.gap_artifacts is not None else []
        messages: list[dict[str, Any]] = [m for m in task.get("history") or [] if isinstance(m, dict)]
        status = task.get("status")
        state = normalize_state(status.get("state")) if isinstance(status, dict) else None
        current = status.get("message") if isinstance(status, dict) else None
        if isinstance(current, dict) and state not in TERMINAL_STATES:
            messages.append(current)
        texts: list[tuple[str, str]] = []
        for message in messages:
            if message.get("role") not in (None, "ROLE_AGENT", "agent"):
                continue
            parts = message.get("parts")
            text = "".join(p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str))
            message_id = nonempty_str(message.get("messageId")) or "assistant"
            if text:
                texts.append((message_id, text))
        whole: dict[str, str] = {}
        order: list[str] = []
        pieces: list[str] = []
        for message_id, text in texts:
            if message_id not in whole and any(text == "".join(pieces[j:]) for j in range(len(pieces))):
                continue  # the final repeat of the answer
            pieces.append(text)
            if message_id not in whole:
                whole[message_id] = ""
                order.append(message_id)
            whole[message_id] += text
        for message_id in order:
            shown = "".join(t._shown.get(message_id, []))
            text = whole[message_id]
            if not text.startswith(shown):
                continue  # the journal no longer holds the start of it: nothing is made up
            rest = text[len(shown) :]
            if rest:
                if message_id not in t._shown:
                    t._shown[message_id] = []
                t.emit_text(message_id, rest, ts, out)
        return out
