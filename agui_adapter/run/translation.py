"""A2A frames in, AG-UI events out: the sans-I/O heart of the adapter.

``inspect_frame`` reads what the orchestration needs from one kernel frame (ids,
state, required inputs, errors). ``RunTranslator`` is the per-run state machine that
maps frames to AG-UI events and keeps the spans balanced: every START gets its END
before the run's terminal event, and no message, reasoning or tool id is reused
within a run. Nothing here does I/O or reads a clock: timestamps are passed in. An adopted
run's translator is first given the dead process's journal and the kernel's gap by
``run.reconcile``, its other way in.

The kernel's dialect (iac-code 0.16.0) has a few traps, handled here:
numbers in metadata arrive as floats (``9.0``); the whole answer is repeated at the
end with ``assistantFinal.complete`` (dropped when deltas were shown, used when none
were); the text of a FAILED or CANCELED status is an error report, not an answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.kernel_client.repeats import Repeat
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.spans import close_spans
from agui_adapter.run import interrupts as intr
from agui_adapter.run import pipeline_progress as pl
from agui_adapter.run.pipeline_progress import PipelineProgress
from agui_adapter.run.usage import UsageTotals

TERMINAL_STATES = frozenset({"completed", "failed", "canceled", "rejected", "auth-required"})
FAILURE_STATES = frozenset({"failed", "rejected", "auth-required"})
BUSY_STATES = frozenset({"submitted", "working"})  # a task in these blocks a new turn in its context
_RESULT_KINDS = ("task", "statusUpdate", "artifactUpdate", "message")

SESSION_EVENT = "iac-code.session.v1"
ARTIFACT_EVENT = "iac-code.artifact.v1"
TOOL_PROGRESS_EVENT = "iac-code.tool-progress.v1"


def normalize_numbers(value: Any) -> Any:
    """Integral floats become ints, recursively (protobuf Struct sends ``9.0``)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: normalize_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize_numbers(v) for v in value]
    return value


_STATE_NAMES: dict[str, str] = {}  # the states seen, normalized once (bounded: kernel input)


def normalize_state(raw: Any) -> str | None:
    """``TASK_STATE_INPUT_REQUIRED`` -> ``input-required``."""
    if type(raw) is str:
        known = _STATE_NAMES.get(raw)
        if known is not None:
            return known
    if not isinstance(raw, str) or not raw:
        return None
    state = raw.lower()
    if state.startswith("task_state_"):
        state = state[len("task_state_") :]
    state = state.replace("_", "-")
    if type(raw) is str and len(_STATE_NAMES) < 64:
        _STATE_NAMES[raw] = state
    return state


def nonempty_str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


@dataclass(slots=True)
class FrameInfo:
    """What one kernel frame says, independent of any run."""

    kind: str  # task | statusUpdate | artifactUpdate | message | error | unknown
    body: dict[str, Any]
    task_id: str | None = None
    context_id: str | None = None
    session_id: str | None = None
    state: str | None = None
    iac: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    #: the status message's (messageId, text), when known without looking into ``body``: a
    #: repeat's (``_inspect_repeat``); else None and ``status_text(body)`` says it
    message: tuple[str | None, str] | None = None


def inspect_frame(frame: Any) -> FrameInfo:
    """Classify one JSON-RPC response frame of the kernel's stream (hot path: keep it lean)."""
    if type(frame) is Repeat:
        return _inspect_repeat(frame)
    result = frame.get("result") if type(frame) is dict else None
    if type(result) is not dict:
        if type(frame) is dict and "error" in frame:
            error = frame["error"]
            return FrameInfo("error", {}, error=error if isinstance(error, dict) else {})
        return FrameInfo("unknown", {})
    kind, body = "unknown", result
    for name in _RESULT_KINDS:
        candidate = result.get(name)
        if type(candidate) is dict:
            kind, body = name, candidate
            break
    else:
        if "status" in result or "id" in result:
            kind = "task"  # GetTask / CancelTask answer: result is the Task itself
    task_id = body.get("taskId") or (body.get("id") if kind == "task" else None)
    context_id = body.get("contextId")
    info = FrameInfo(
        kind,
        body,
        task_id=task_id if type(task_id) is str else None,
        context_id=context_id if type(context_id) is str and context_id else None,
    )
    status = body.get("status")
    if type(status) is dict:
        info.state = normalize_state(status.get("state"))
    metadata = body.get("metadata")
    iac = metadata.get("iac_code") if type(metadata) is dict else None
    if type(iac) is dict:
        if len(iac) > 1 or "iacCodeSessionId" not in iac:  # most frames carry only the session id
            iac = normalize_numbers(iac)
        info.iac = iac
        info.session_id = _session_id(iac)
        if "input" in iac or "pendingPermissions" in iac:
            info.inputs = required_inputs(iac)
        elif info.state == "input-required" and ("pipeline" in iac or "pipelineBatch" in iac):
            confirmation = intr.confirmation_input(iac)  # a wait the kernel sends without an input
            if confirmation is not None:
                info.inputs = [confirmation]
    return info


def _inspect_repeat(repeat: Repeat) -> FrameInfo:
    """A repeat's template is looked into once: a repeat differs from it in the status
    message's text alone, which nothing here reads but the body handed on, and the status
    message's (messageId, text) it makes (``status_text``), known from the template when
    the template's message, given a probe text, says (its id, that text)."""
    template = repeat.template
    seen = template.inspected
    if seen is None:
        info = inspect_frame(template.frame)
        probe = status_text(Repeat(template, _PROBE).status_update()) if info.kind == "statusUpdate" else (None, "")
        seen = template.inspected = (info, probe[1] == _PROBE, probe[0])
    info, plain_text, message_id = seen
    if info.kind != "statusUpdate":  # the text is not in the body looked into: the long way
        return inspect_frame(repeat.frame())
    # positional (kind, body, task_id, context_id, session_id, state, iac, inputs, error,
    # message): half the cost of naming them, once per delta
    return FrameInfo(
        "statusUpdate", repeat.status_update(), info.task_id, info.context_id, info.session_id, info.state,
        info.iac, info.inputs, None, (message_id, repeat.text) if plain_text else None,
    )  # fmt: skip


#: the text a template's status message is tried with (``_inspect_repeat``)
_PROBE = "\x01probe\x02"


def _session_id(iac: dict[str, Any]) -> str | None:
    sid = iac.get("iacCodeSessionId")
    if type(sid) is str and sid:
        return sid
    sid = nonempty_str(sid)
    if sid:
        return sid
    pipeline = iac.get("pipeline")
    if isinstance(pipeline, dict) and nonempty_str(pipeline.get("iacCodeSessionId")):
        return pipeline["iacCodeSessionId"]
    batch = iac.get("pipelineBatch")
    if isinstance(batch, dict) and isinstance(batch.get("events"), list):
        for envelope in batch["events"]:
            if isinstance(envelope, dict) and nonempty_str(envelope.get("iacCodeSessionId")):
                return envelope["iacCodeSessionId"]
    return None


def required_inputs(iac: dict[str, Any]) -> list[dict[str, Any]]:
    """The inputs the kernel is waiting for: ``input`` plus ``pendingPermissions``.

    Only objects with ``required: true`` count; a normal turn also ends in
    INPUT_REQUIRED, but without any such input.
    """
    candidates: list[Any] = [iac.get("input")]
    pending = iac.get("pendingPermissions")
    if isinstance(pending, list):
        candidates.extend(pending)
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for item in candidates:
        if not isinstance(item, dict) or item.get("required") is not True:
            continue
        key = nonempty_str(item.get("inputId")) or json.dumps(item, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def status_text(body: dict[str, Any]) -> tuple[str | None, str]:
    """(messageId, text) of an agent status message; text is "" when there is none."""
    status = body.get("status")
    message = status.get("message") if isinstance(status, dict) else None
    if not isinstance(message, dict):
        return None, ""
    if message.get("role") not in (None, "ROLE_AGENT", "agent"):
        return None, ""
    parts = message.get("parts")
    if not isinstance(parts, list):
        return None, ""
    if len(parts) == 1 and isinstance(parts[0], dict):
        text = parts[0].get("text")
        text = text if isinstance(text, str) else ""
    else:
        text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return nonempty_str(message.get("messageId")), text


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def mint_id(base: str, namespace: str | None, used: set[str]) -> str:
    """The id a run gives to a message or tool call of the kernel's ``base`` id: namespaced by
    the run (a Resume's ``@<run tag>``), made unique within the run (``~2``, ``~3``), and
    remembered in ``used``. ``run.history`` mints the same ids to give back what the run streamed."""
    if namespace:
        base = f"{base}@{namespace}"
    candidate, n = base, 1
    while candidate in used:
        n += 1
        candidate = f"{base}~{n}"
    used.add(candidate)
    return candidate


class RunTranslator:
    """Maps the kernel frames of one AG-UI run to AG-UI events."""

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        *,
        id_namespace: str | None = None,
        prior_text_digests: Iterable[str] = (),
        pipeline: PipelineProgress | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        # A resume run continues kernel messages that an earlier run already opened and
        # closed: its AG-UI ids get a suffix so that no id is reused on the thread.
        self._namespace = id_namespace
        self._prior_digests = frozenset(prior_text_digests)
        self._shown: dict[str, list[str]] = {}  # kernel message id -> pieces shown in this run
        self._used_ids: set[str] = set()
        self._text_alias: dict[str, str] = {}  # kernel message id -> AG-UI id in this run
        self._open_text: dict[str, None] = {}  # AG-UI ids, in opening order
        self._current_text: str | None = None
        self._open_reasoning: dict[str, None] = {}
        self._open_tools: dict[str, None] = {}
        self._started_tools: set[str] = set()
        self._tool_results: set[str] = set()
        self._usage = UsageTotals()
        self.text_emitted = False
        self.failure_detail: str | None = None
        self.pipeline = pipeline or PipelineProgress()
        self.pipeline_seen = pipeline is not None and bool(pipeline.high_water or pipeline.open_steps)
        self._event_ids: set[str] = set()
        self._active_steps: dict[str, None] = {}

    # --- ids ------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        return mint_id(base, self._namespace, self._used_ids)

    # --- frames -----------------------------------------------------------------------
    def map(self, info: FrameInfo, ts: int) -> list[Event]:
        """Events for one frame, in a fixed order: pipeline envelopes, thinking, tool, usage,
        artifact, text."""
        out: list[Event] = []
        iac = info.iac
        if iac:
            if "pipeline" in iac or "pipelineBatch" in iac:
                for envelope in pl.envelopes(iac):
                    self.map_envelope(envelope, ts, out)
            thinking = iac.get("thinking")
            if isinstance(thinking, dict):
                self._map_thinking(thinking, ts, out)
            tool = iac.get("tool")
            if isinstance(tool, dict):
                self._map_tool(tool, ts, out)
            usage = iac.get("usage")
            if isinstance(usage, dict):
                self.record_usage(usage)
        if info.kind == "artifactUpdate":
            artifact = info.body.get("artifact")
            if isinstance(artifact, dict):
                value = {"schemaVersion": 1, **normalize_numbers(artifact)}
                out.append(ev.custom(ts, ARTIFACT_EVENT, value))
        elif info.kind == "statusUpdate":
            self._map_status_text(info, ts, out)
        return out

    def _map_status_text(self, info: FrameInfo, ts: int, out: list[Event]) -> None:
        message_id, text = info.message or status_text(info.body)
        if not text:
            return
        if info.state in TERMINAL_STATES:
            # "Task canceled." / an error report: not part of the assistant's answer.
            if info.state in FAILURE_STATES:
                self.failure_detail = text
            return
        final = info.iac.get("assistantFinal")
        if isinstance(final, dict) and final.get("complete") is True and self.text_emitted:
            return  # the kernel repeats the whole answer at the end
        self.emit_text(message_id or "assistant", text, ts, out)

    def emit_text(self, kernel_id: str, text: str, ts: int, out: list[Event], *, parallel: bool = False) -> None:
        shown = self._shown.get(kernel_id)
        if shown is None:
            # A status message may repeat what an earlier run of this execution showed.
            # Pipeline deltas never do: they are de-duplicated by eventId instead.
            if not parallel:
                text = self._strip_shown_prefix(text)
            shown = self._shown[kernel_id] = []
        if not text:
            return
        shown.append(text)
        if self._open_reasoning:
            self._close_reasoning(ts, out)
        agui_id = self._text_alias.get(kernel_id)
        if agui_id is None or agui_id not in self._open_text:
            if self._current_text is not None and not parallel:
                self._close_text(self._current_text, ts, out)
            agui_id = self._fresh(kernel_id)
            self._text_alias[kernel_id] = agui_id
            self._open_text[agui_id] = None
            out.append(ev.text_start(ts, agui_id))
        self._current_text = agui_id
        out.append(ev.text_content(ts, agui_id, text))
        self.text_emitted = True

    def _strip_shown_prefix(self, text: str) -> str:
        """Drop the longest prefix an earlier run of this execution already showed."""
        if not self._prior_digests:
            return text
        for end in range(len(text), 0, -1):
            if _digest(text[:end]) in self._prior_digests:
                return text[end:]
        return text

    def text_digests(self) -> list[str]:
        """Digests of the text shown per kernel message (kept with an interrupt)."""
        shown = {_digest("".join(pieces)) for pieces in self._shown.values() if pieces}
        return sorted(shown | self._prior_digests)

    def _close_text(self, agui_id: str, ts: int, out: list[Event]) -> None:
        if agui_id in self._open_text:
            del self._open_text[agui_id]
            out.append(ev.text_end(ts, agui_id))
        if self._current_text == agui_id:
            # deterministic: the most recently opened message still open
            self._current_text = next(reversed(self._open_text), None) if self._open_text else None

    def _map_thinking(self, thinking: dict[str, Any], ts: int, out: list[Event], base: str | None = None) -> None:
        text = thinking.get("text")
        if thinking.get("type") != "raw_thinking" or not isinstance(text, str) or not text:
            return
        if not self._open_reasoning:
            rid = self._fresh(f"reasoning-{base or self._current_text or self.run_id}")
            self._open_reasoning[rid] = None
            out.append(ev.reasoning_start(ts, rid))
            out.append(ev.reasoning_message_start(ts, rid))
        rid = next(reversed(self._open_reasoning))
        out.append(ev.reasoning_content(ts, rid, text))

    def _close_reasoning(self, ts: int, out: list[Event]) -> None:
        # a reasoning span and its message open and close together here
        out += close_spans(ts, reasoning=self._open_reasoning, reasoning_messages=self._open_reasoning)
        self._open_reasoning.clear()

    def _map_tool(self, tool: dict[str, Any], ts: int, out: list[Event]) -> None:
        status = tool.get("status")
        tool_id = nonempty_str(tool.get("toolUseId"))
        if tool_id is None:
            return
        name = nonempty_str(tool.get("name")) or "tool"
        if status in ("started", "input_complete"):
            if tool_id not in self._started_tools:
                self._started_tools.add(tool_id)
                self._open_tools[tool_id] = None
                out.append(ev.tool_start(ts, tool_id, name, self._current_text))
            if status == "input_complete" and tool_id in self._open_tools:
                tool_input = tool.get("toolInput")
                args = tool_input if tool_input is not None else {"summary": tool.get("inputSummary")}
                out.append(ev.tool_args(ts, tool_id, compact_json(args)))
                del self._open_tools[tool_id]
                out.append(ev.tool_end(ts, tool_id))
        elif status in ("completed", "failed"):
            self.emit_tool_result(tool_id, tool.get("result"), ts, out)
        elif status == "progress":
            out.append(ev.custom(ts, TOOL_PROGRESS_EVENT, {"schemaVersion": 1, **tool}))

    def emit_tool_result(self, tool_id: str, result: Any, ts: int, out: list[Event]) -> None:
        """TOOL_CALL_RESULT once per tool call per run; an open call is closed first."""
        if tool_id in self._tool_results:
            return
        self._tool_results.add(tool_id)
        if tool_id in self._open_tools:
            del self._open_tools[tool_id]
            out.append(ev.tool_end(ts, tool_id))
        content = result if isinstance(result, str) else compact_json(result)
        out.append(ev.tool_result(ts, self._fresh(f"tool-result-{tool_id}"), tool_id, content))

    # --- pipeline -------------------------------------------------------------------------
    def reopen_steps(self, ts: int) -> list[Event]:
        """A Resume run starts by reopening the business steps still open (durably)."""
        out = []
        for key in sorted(self.pipeline.open_steps):
            if key not in self._active_steps:
                self._active_steps[key] = None
                out.append(ev.step_started(ts, pl.step_name(key)))
        return out

    def snapshot_event(self, snapshot: dict[str, Any], ts: int) -> Event:
        run_id = snapshot.get("pipelineRunId")
        if isinstance(run_id, str) and run_id:
            self.pipeline.run_id = run_id
        pipeline_run_id = self.pipeline.run_id or f"pipeline-{self.thread_id}"
        content = {"schemaVersion": 1, "pipelineRunId": pipeline_run_id, "snapshot": normalize_numbers(snapshot)}
        self.pipeline_seen = True
        return ev.activity_snapshot(ts, self._fresh(f"pipeline:{pipeline_run_id}"), pl.PIPELINE_EVENT, content)

    def map_envelope(self, envelope: dict[str, Any], ts: int, out: list[Event]) -> None:
        """One pipeline envelope (live or recovered from the journal), at most once; never a
        publication still pending the kernel's backup (``pipeline.is_pending_publication``)."""
        self.pipeline_seen = True
        event_id = envelope.get("eventId")
        sequence = pl.sequence_of(envelope)
        if isinstance(event_id, str):
            if event_id in self._event_ids:
                return
            self._event_ids.add(event_id)
        if sequence is not None:
            if self.pipeline.seen(sequence):
                return
            self.pipeline.mark(sequence)
        if pl.is_pending_publication(envelope):  # handled (not sent): its committed twin is
            return
        envelope = normalize_numbers(envelope)
        run_id = envelope.get("pipelineRunId")
        if self.pipeline.run_id is None and isinstance(run_id, str) and run_id:
            self.pipeline.run_id = run_id
        kind = envelope.get("eventType") or "pipeline_event"
        data = envelope.get("data") if isinstance(envelope.get("data"), dict) else {}
        if kind in pl.STEP_OPENERS:
            self._open_step(envelope, ts, out)
        if kind == "text_delta" and isinstance(data.get("text"), str):
            key = pl.message_key(envelope, self.pipeline.run_id or f"pipeline-{self.thread_id}")
            self.emit_text(key, data["text"], ts, out, parallel=True)
        elif kind == "thinking_delta":
            key = pl.message_key(envelope, self.pipeline.run_id or f"pipeline-{self.thread_id}")
            self._map_thinking({"type": "raw_thinking", "text": data.get("text")}, ts, out, base=key)
        elif kind == "tool_started":
            self._map_tool(
                {
                    "status": "input_complete",
                    "toolUseId": data.get("toolUseId"),
                    "name": data.get("toolName"),
                    "toolInput": data.get("input") if data.get("input") is not None else {},
                },
                ts,
                out,
            )
        elif kind == "tool_result":
            status = "failed" if data.get("isError") is True else "completed"
            self._map_tool(
                {"status": status, "toolUseId": data.get("toolUseId"), "result": data.get("result")}, ts, out
            )
        elif kind == "usage":
            self.record_usage(data)
        if kind in pl.STEP_CLOSERS:
            self._close_step(envelope, ts, out)
        if kind in pl.CUSTOM_EVENT_TYPES:
            out.append(ev.custom(ts, pl.PIPELINE_EVENT, envelope))

    def _open_step(self, envelope: dict[str, Any], ts: int, out: list[Event]) -> None:
        key = pl.step_key(envelope)
        if key is None:
            return
        self.pipeline.open_steps.add(key)
        if key not in self._active_steps:
            self._active_steps[key] = None
            out.append(ev.step_started(ts, pl.step_name(key)))

    def _close_step(self, envelope: dict[str, Any], ts: int, out: list[Event]) -> None:
        key = pl.step_key(envelope)
        if key is None or key not in self.pipeline.open_steps:
            return
        self.pipeline.open_steps.discard(key)
        if key not in self._active_steps:  # opened in an earlier run: a zero-length span here
            out.append(ev.step_started(ts, pl.step_name(key)))
        else:
            del self._active_steps[key]
        out.append(ev.step_finished(ts, pl.step_name(key)))

    # --- usage ------------------------------------------------------------------------
    def record_usage(self, usage: dict[str, Any]) -> None:
        self._usage.add(usage)

    def usage(self) -> list[dict[str, Any]]:
        return self._usage.entries()

    # --- adoption (a run another process began: ``run.reconcile`` takes up its state) ---
    @property
    def id_namespace(self) -> str | None:
        """The run's id namespace (a Resume's run tag), as ``mint_id`` takes it."""
        return self._namespace

    # --- the end ------------------------------------------------------------------------
    def close_all(self, ts: int) -> list[Event]:
        """END for every open span, in the order every run closes them (``spans.close_spans``)."""
        out = close_spans(
            ts,
            reasoning=self._open_reasoning,
            reasoning_messages=self._open_reasoning,
            tools=self._open_tools,
            texts=self._open_text,
            steps=[pl.step_name(key) for key in self._active_steps],
        )
        self._open_reasoning.clear()
        self._open_tools.clear()
        self._open_text.clear()
        self._current_text = None
        self._active_steps.clear()  # the durable open set survives: a Resume reopens it
        return out

    def finish(self, ts: int, outcome: dict[str, Any]) -> list[Event]:
        out = self.close_all(ts)
        out.append(ev.run_finished(ts, self.thread_id, self.run_id, outcome, self.usage()))
        return out

    def fail(self, ts: int, code: str, message: str) -> list[Event]:
        out = self.close_all(ts)
        out.append(ev.run_error(ts, code, message, self.usage()))
        return out
