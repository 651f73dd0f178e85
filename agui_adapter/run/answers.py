"""A Resume's answers on their way to the kernel: the queue, the answer in flight, what is owed.

Pure bookkeeping for ``run.machine``. A Resume's checked answers (``resume.plan``) go to the
kernel one at a time: sideband answers first (unary calls), then the others, one stream each.
An answer stays in flight until the kernel took it and it is on disk; a text answer then owes
the client its tool call's result, emitted before the next events of the stream. Inputs the
kernel asks for while answers are still to send wait here, for the interrupt at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agui_adapter.run.resume import Answer


class AnswerQueue:
    """The answers still to send, in order, and what the ones sent left to do."""

    __slots__ = ("pending", "current", "owed", "new_inputs", "sideband_ids")

    def __init__(self) -> None:
        self.pending: list[Answer] = []  # answers still to send, in order
        self.current: Answer | None = None  # the answer being sent or accepted
        self.owed: list[tuple[str, str]] = []  # (toolCallId, text) of accepted answers
        self.new_inputs: list[dict[str, Any]] = []  # inputs seen while answers were still to send
        self.sideband_ids: set[str] = set()  # inputs the kernel waits for as sideband answers

    def __bool__(self) -> bool:
        """Whether answers are still to send."""
        return bool(self.pending)

    def next_sideband(self) -> Answer | None:
        """Take the next sideband answer, now in flight, if any."""
        sideband = next((a for a in self.pending if a.sideband), None)
        if sideband is not None:
            self.pending.remove(sideband)
            self.current = sideband
        return sideband

    def next(self) -> Answer:
        """Take the next answer, now in flight."""
        self.current = self.pending.pop(0)
        return self.current

    def accepted(self) -> Answer:
        """The answer in flight is on disk: it leaves the queue, owing its result if it has one."""
        answer = self.current
        assert answer is not None
        self.current = None
        if answer.result and answer.tool_use_id:
            self.owed.append((answer.tool_use_id, answer.result))
        return answer

    def take_owed(self) -> list[tuple[str, str]]:
        """The tool results owed, once."""
        owed, self.owed = self.owed, []
        return owed

    def fresh(self, inputs: list[dict[str, Any]], applied: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The kernel's inputs that no answer in the queue, nor an applied one, covers."""
        waiting = {a.interrupt_id for a in self.pending}
        return [i for i in inputs if i.get("inputId") not in waiting and not applied(i)]

    def hold(self, inputs: list[dict[str, Any]]) -> None:
        """Keep inputs for the interrupt at the end of the stream (once each)."""
        self.new_inputs.extend(i for i in inputs if i not in self.new_inputs)

    def take_new_inputs(self) -> list[dict[str, Any]]:
        inputs, self.new_inputs = self.new_inputs, []
        return inputs
