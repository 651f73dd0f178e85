"""A thread's conversation as AG-UI ``Message`` objects, from what the kernel keeps (sans-I/O).

``GET /threads/{threadId}/messages`` gives a client that lost everything but the thread id
its transcript back. The adapter keeps no conversation text (its state directory is not
where text lives); the kernel does. iac-code 0.16.0's ``GetTask`` / ``ListTasks`` history
holds only the agent's status messages (no user message, no tool call, no tool result:
see ``tests/data/history/``), so the conversation is read from the kernel's session
recovery view (``GET /iac-code/session/recovery``), whose ``messages`` are the session's
stored conversation in the kernel's own shape:

* ``{"role": "user", "content": "text"}`` (or a list of blocks) for a user turn;
* ``{"role": "assistant", "content": [{"type": "thinking"}, {"type": "text", "text"},
  {"type": "tool_use", "id", "name", "input"}]}``;
* ``{"role": "user", "content": [{"type": "tool_result", "tool_use_id", "content"}]}``.

They become AG-UI messages (the shape ``MESSAGES_SNAPSHOT`` carries): user messages with
their text, assistant messages with their text and ``toolCalls``, tool messages with their
``toolCallId`` and content. Thinking is left out (AG-UI's ``Message`` has no place for it
beside an answer).

The kernel's messages carry no ids, so the ids are rebuilt the way the run's translator
made them (``translate.RunTranslator._fresh``), from the thread's recent runs
(``record.RunEntry``): the kernel task each turn drove, and for each Resume of it the tool
calls its interrupts asked about. A run streams its text (every LLM call of it) as one
message, ``<taskId>-message`` for a turn's first run and ``<taskId>-message@<run tag>`` for a
Resume: the kernel's assistant messages of one run become that one message, with all their
tool calls; a tool result is ``tool-result-<toolCallId>`` (``@<run tag>`` in a Resume); tool call ids
are the kernel's own. A user message is ``<taskId>-user``. Turns older than the runs kept
(and pipeline conversations, which live in other sessions) get ids ``history-<n>``,
stable as long as the conversation only grows.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agui_adapter.run.identity import run_tag
from agui_adapter.run.translation import mint_id
from agui_adapter.state.record import RunEntry

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_TURN_MODES = frozenset({"turn", "pipeline"})


@dataclass
class _Segment:
    """One run of a turn: the ids its translator minted, and its namespace (Resume runs)."""

    namespace: str | None
    resolves: frozenset[str] = frozenset()  # tool calls whose result starts the next segment
    used: set[str] = field(default_factory=set)
    message: dict[str, Any] | None = None  # the run's assistant message, once it said something

    def fresh(self, base: str) -> str:
        return mint_id(base, self.namespace, self.used)


def _turns(runs: Sequence[RunEntry]) -> list[tuple[str, list[_Segment]]]:
    """Per kernel task that a turn drove, oldest first: its runs as id segments."""
    order: list[str] = []
    segments: dict[str, list[_Segment]] = {}
    for entry in runs:
        task = entry.task_id
        if not task:
            continue
        if entry.mode in _TURN_MODES and task not in segments:
            order.append(task)
            segments[task] = [_Segment(None, frozenset(entry.interrupt_tool_calls))]
        elif entry.mode == "resume" and task in segments:
            segments[task].append(_Segment(run_tag(entry.run_id), frozenset(entry.interrupt_tool_calls)))
    return [(task, segments[task]) for task in order]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _text(blocks: list[dict[str, Any]]) -> str:
    return "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text" and b.get("text"))


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def _is_user_turn(message: dict[str, Any]) -> bool:
    blocks = _blocks(message.get("content"))
    return message.get("role") == "user" and not any(b.get("type") == "tool_result" for b in blocks)


def agui_messages(kernel_messages: Sequence[Any], runs: Sequence[RunEntry]) -> list[dict[str, Any]]:
    """The kernel's conversation as AG-UI messages, oldest first, with the streamed ids."""
    conversation = [m for m in kernel_messages if isinstance(m, dict)]
    user_turns = sum(1 for m in conversation if _is_user_turn(m))
    turns = _turns(runs)
    # the newest turns are the ones the runs kept: align from the end
    known = turns[-user_turns:] if user_turns else []
    unknown = user_turns - len(known)
    out: list[dict[str, Any]] = []
    turn_index = -1
    task: str | None = None
    segments: list[_Segment] = []
    current = 0
    for position, message in enumerate(conversation):
        role = message.get("role")
        blocks = _blocks(message.get("content"))
        if _is_user_turn(message):
            turn_index += 1
            if turn_index >= unknown:
                task, segments = known[turn_index - unknown]
            else:
                task, segments = None, []
            current = 0
            text = _text(blocks)
            out.append({"id": f"{task}-user" if task else f"history-{position}", "role": "user", "content": text})
        elif role == "assistant":
            text = _text(blocks)
            calls = [
                {
                    "id": str(b.get("id")),
                    "type": "function",
                    "function": {"name": str(b.get("name", "")), "arguments": json.dumps(b.get("input") or {})},
                }
                for b in blocks
                if b.get("type") == "tool_use" and b.get("id")
            ]
            if not text and not calls:
                continue  # thinking only
            if task and segments:
                # one run's text is one streamed message, however many LLM calls made it
                segment = segments[current]
                if segment.message is None:
                    segment.message = {"id": segment.fresh(f"{task}-message"), "role": "assistant"}
                    out.append(segment.message)
                item = segment.message
            else:
                item = {"id": f"history-{position}", "role": "assistant"}
                out.append(item)
            if text:
                item["content"] = item.get("content", "") + text
            if calls:
                item["toolCalls"] = item.get("toolCalls", []) + calls
        elif role == "user":
            for index, block in enumerate(blocks):
                if block.get("type") != "tool_result" or not block.get("tool_use_id"):
                    continue
                call_id = str(block["tool_use_id"])
                if segments and call_id in segments[current].resolves and current + 1 < len(segments):
                    current += 1  # answered by a Resume: its result was streamed by that run
                if segments:
                    message_id = segments[current].fresh(f"tool-result-{call_id}")
                else:
                    message_id = f"history-{position}-{index}"
                content = _result_text(block.get("content"))
                out.append({"id": message_id, "role": "tool", "toolCallId": call_id, "content": content})
    return out


# ====================================================================== paging
class BadPage(ValueError):
    """A ``limit`` or ``before`` the route cannot use (which one: ``args[0]``)."""


def parse_page(limit: str | None, before: str | None) -> tuple[int, int | None]:
    """(limit, index of the first message not to return) from the query parameters."""
    if limit is None or limit == "":
        count = DEFAULT_LIMIT
    else:
        if not (limit.isascii() and limit.isdigit() and len(limit) <= 6) or not 1 <= int(limit) <= MAX_LIMIT:
            raise BadPage("limit")
        count = int(limit)
    if before is None:
        return count, None
    try:
        raw = base64.urlsafe_b64decode(before.encode("ascii") + b"=" * (-len(before) % 4)).decode("ascii")
    except (UnicodeError, binascii.Error, ValueError):
        raise BadPage("before") from None
    if not (raw.startswith("m") and raw[1:].isdigit() and len(raw) <= 12):
        raise BadPage("before")
    return count, int(raw[1:])


def cursor(index: int) -> str:
    """The opaque cursor of the messages before ``index``."""
    return base64.urlsafe_b64encode(f"m{index}".encode("ascii")).decode("ascii").rstrip("=")


def page(messages: list[dict[str, Any]], limit: int, before: int | None) -> tuple[list[dict[str, Any]], str | None]:
    """The newest ``limit`` messages before ``before`` (all when None), oldest first, and the
    cursor of the older ones (None when there are none)."""
    end = len(messages) if before is None else min(before, len(messages))
    start = max(0, end - limit)
    return messages[start:end], (cursor(start) if start > 0 else None)
