"""Frame builders: how a script's steps become A2A frames and pipeline envelopes.

Why: the scripts say what happens (a text delta, a tool call, an interrupt, a
pipeline step); the exact frames (statusUpdate nesting, messageId conventions,
``iac_code`` metadata, Struct floats, pipeline batches) are built here once, so
no script writes wire shapes by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from agui_adapter.scripted_kernel.pipeline_journal import PIPELINE_EXTENSION_URI, Pipeline, pipeline_steps
from agui_adapter.scripted_kernel.tasks import Canceled, KernelState, Pending, Task
from agui_adapter.scripted_kernel.wire import (
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    SUBMITTED,
    WORKING,
    as_struct,
    dumps,
    now_iso,
    random_hex,
)

_USAGE = {
    "cachedInputTokens": 0.0,
    "provider": "openai",
    "totalTokens": 18.0,
    "inputTokens": 11.0,
    "outputTokens": 7.0,
    "model": "other",
}
_ZERO_USAGE = {
    "cachedInputTokens": 0.0,
    "totalTokens": 0.0,
    "inputTokens": 0.0,
    "outputTokens": 0.0,
}


def _type_name(value: Any) -> str:
    """The Python type name the real kernel reports in a tool's ``inputSummary``."""
    return {
        str: "str",
        bool: "bool",
        int: "int",
        float: "float",
        list: "list",
        dict: "dict",
    }.get(type(value), "str")


class Run:
    """Frame builders for one run of a task's script (one worker thread)."""

    def __init__(self, state: KernelState, task: Task) -> None:
        self.state = state
        self.task = task
        self.tid = task.id
        self.cid = task.context_id
        self.sid = task.session_id
        self.segment: list[str] = []  # text of the current LLM call
        self.said: list[str] = []  # text and thinking not yet in the conversation
        self.thought: list[str] = []

    def sleep(self, seconds: float) -> None:
        delay = seconds * self.state.delay_scale
        canceled = self.task.cancel_event.wait(delay) if delay > 0 else self.task.cancel_event.is_set()
        if canceled:
            raise Canceled()

    def message(self, text: str, message_id: str) -> dict[str, Any]:
        return {
            "messageId": message_id,
            "contextId": self.cid,
            "taskId": self.tid,
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
        }

    def meta(self, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> dict[str, Any]:
        iac: dict[str, Any] = dict(before or {})
        if self.sid:
            iac["iacCodeSessionId"] = self.sid
        iac.update(after or {})
        return {"iac_code": iac}

    def status(
        self,
        state: str,
        *,
        message: dict[str, Any] | None = None,
        timestamp: bool = False,
        metadata: dict[str, Any] | None = None,
        repeat: int = 1,
        pending: Pending | None = None,
        close: bool = False,
    ) -> None:
        status: dict[str, Any] = {"state": state}
        if message is not None:
            status["message"] = message
        if timestamp:
            status["timestamp"] = now_iso()
        update: dict[str, Any] = {
            "taskId": self.tid,
            "contextId": self.cid,
            "status": status,
        }
        if metadata is not None:
            update["metadata"] = metadata
        self.state.publish(
            self.task,
            {"statusUpdate": update},
            status=status,
            repeat=repeat,
            pending=pending,
            close=close,
        )

    def task_frame(self, frame: dict[str, Any]) -> None:
        self.state.publish(self.task, frame)

    def opening(self, new_task: bool) -> None:
        if new_task:
            self.status(SUBMITTED, timestamp=True, metadata=self.meta())
        self.status(WORKING, timestamp=True, metadata=self.meta())

    def remember(self, message: dict[str, Any]) -> None:
        """Append to the session's conversation, as the real kernel's session keeps it."""
        with self.state.lock:
            ctx = self.state.contexts.get(self.cid)
            if ctx is not None:
                ctx.conversation.append({**message, "token_count": 0, "elapsed_seconds": 0.0, "metadata": {}})

    def remember_reply(self, tool_use: dict[str, Any] | None = None) -> None:
        """What the LLM said since the last call (thinking, text, a tool call) as one message."""
        content: list[dict[str, Any]] = []
        if self.thought:
            content.append({"type": "thinking", "thinking": "".join(self.thought), "provider_metadata": {}})
        if self.said:
            content.append({"type": "text", "text": "".join(self.said)})
        if tool_use is not None:
            content.append(tool_use)
        self.said, self.thought = [], []
        if content:
            self.remember({"role": "assistant", "content": content})

    def delta(self, text: str) -> None:
        self.segment.append(text)
        self.said.append(text)
        self.status(
            WORKING,
            message=self.message(text, f"{self.tid}-message"),
            metadata=self.meta(),
        )

    def deltas(self, pieces: list[str] | tuple[str, ...]) -> None:
        for piece in pieces:
            self.delta(piece)

    def fast(self, count: int) -> None:
        if count <= 0:
            return
        self.segment.append("x" * count)
        self.said.append("x" * count)
        message = self.message("x", f"{self.tid}-message")
        self.status(WORKING, message=message, metadata=self.meta(), repeat=count)

    def thinking(self, text: str) -> None:
        self.thought.append(text)
        self.status(
            WORKING,
            metadata=self.meta(after={"thinking": {"text": text, "type": "raw_thinking"}}),
        )

    def tool(self, payload: dict[str, Any]) -> None:
        self.status(WORKING, metadata=self.meta(before={"tool": payload}))
        if payload.get("status") in ("completed", "failed") and "result" in payload:
            result = {
                "type": "tool_result",
                "tool_use_id": payload.get("toolUseId"),
                "content": str(payload["result"]),
                "is_error": payload.get("status") == "failed",
                "metadata": {},
            }
            self.remember({"role": "user", "content": [result]})

    def usage(self, zero: bool = False) -> None:
        self.status(
            WORKING,
            metadata=self.meta(after={"usage": dict(_ZERO_USAGE if zero else _USAGE)}),
        )

    def end_llm_call(self) -> None:
        """Usage closes an LLM call; the final repeat only covers the last call's text."""
        self.usage()
        self.segment = []

    def artifact(self, artifact: dict[str, Any]) -> None:
        update = {
            "taskId": self.tid,
            "contextId": self.cid,
            "artifact": artifact,
            "lastChunk": True,
        }
        self.state.publish(self.task, {"artifactUpdate": update}, artifact=artifact)

    def final(self) -> None:
        self.remember_reply()
        text = "".join(self.segment)
        self.segment = []
        self.status(
            WORKING,
            message=self.message(text, f"{self.tid}-2"),
            timestamp=True,
            metadata=self.meta(before={"assistantFinal": {"complete": True}}),
        )

    def end_turn(self) -> None:
        self.status(INPUT_REQUIRED, timestamp=True, metadata=self.meta(), close=True)

    def finish_reply(self) -> None:
        self.usage()
        self.final()
        self.end_turn()

    def interrupt(self, pending: Pending) -> None:
        before: dict[str, Any] = {"input": pending.envelope}
        if pending.permission is not None:
            before["permission"] = pending.permission
        self.status(
            INPUT_REQUIRED,
            metadata=self.meta(before=before),
            pending=pending,
            close=True,
        )

    def fail_now(self, text: str) -> None:
        self.status(
            FAILED,
            message=self.message(text, f"{self.tid}-4"),
            timestamp=True,
            close=True,
        )

    def tool_call(
        self,
        tool_use_id: str,
        name: str,
        tool_input: dict[str, Any],
        *,
        deltas: bool = True,
    ) -> None:
        """The LLM streaming a tool call: started, input deltas, input_complete."""
        self.tool({"toolUseId": tool_use_id, "name": name, "status": "started"})
        if deltas:
            args = dumps(tool_input)
            cut = len(args) // 2
            for length in (cut, len(args) - cut):
                self.tool(
                    {
                        "toolUseId": tool_use_id,
                        "partialJsonLength": float(length),
                        "status": "input_delta",
                    }
                )
        self.remember_reply({"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input})
        summary = {
            "tool_name": name,
            "fields": {key: {"type": _type_name(tool_input[key])} for key in sorted(tool_input)},
        }
        self.tool(
            {
                "toolUseId": tool_use_id,
                "inputSummary": summary,
                "name": name,
                "status": "input_complete",
                "toolInput": as_struct(tool_input),
            }
        )


_PIPE_STATES = {
    "working": WORKING,
    "input_required": INPUT_REQUIRED,
    "completed": COMPLETED,
    "failed": FAILED,
    "canceled": CANCELED,
}


class PipeRun:
    """Envelope builders for a pipeline; ``run`` is the worker run currently driving it."""

    def __init__(self, state: KernelState, pipe: Pipeline) -> None:
        self.state = state
        self.pipe = pipe
        self.run: Run | None = None
        self._batch: list[dict[str, Any]] | None = None

    def coord(self, name: str, attempt: int = 1) -> dict[str, Any]:
        steps = pipeline_steps(self.pipe.name)
        return {
            "id": name,
            "runId": f"step-{name}-{attempt}",
            "index": steps.index(name) + 1,
            "total": len(steps),
            "attempt": attempt,
        }

    def event(self, event_type: str, data: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Journal an envelope without sending it (send it later, or never)."""
        with self.state.lock:
            if self.run is not None and self.run.task.canceled:
                raise Canceled()
            return self.state.pipeline_event_locked(self.pipe, event_type, data, **kwargs)

    def send(
        self,
        *envelopes: dict[str, Any],
        extra: dict[str, Any] | None = None,
        batch: bool = False,
        close: bool = False,
    ) -> None:
        """One statusUpdate carrying the envelopes; its state follows the last one's status."""
        assert self.run is not None
        if len(envelopes) == 1 and not batch:
            iac: dict[str, Any] = {"pipeline": as_struct(envelopes[0])}
        else:
            iac = {
                "pipelineBatch": {
                    "schemaVersion": "1.0",
                    "extensionUri": PIPELINE_EXTENSION_URI,
                    "events": [as_struct(e) for e in envelopes],
                }
            }
        iac.update(as_struct(extra or {}))
        state = _PIPE_STATES[envelopes[-1]["status"]]
        self.run.status(state, metadata={"iac_code": iac}, close=close)

    def emit(self, event_type: str, data: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Journal and send (or add to the open batch)."""
        envelope = self.event(event_type, data, **kwargs)
        if self._batch is not None:
            self._batch.append(envelope)
        else:
            self.send(envelope)
        return envelope

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Envelopes emitted inside go out together as one ``pipelineBatch``."""
        self._batch = []
        try:
            yield
            envelopes = self._batch
        finally:
            self._batch = None
        if envelopes:
            self.send(*envelopes, batch=True)

    def say(self, text: str, **coordinates: Any) -> None:
        self.emit("message_started", {"messageId": "msg_" + random_hex(24)}, **coordinates)
        self.emit("text_delta", {"text": text}, **coordinates)
