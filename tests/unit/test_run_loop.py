"""The effect loop (``run.loop``) the driver and the machine tests' bench both use.

A scripted machine stands in for ``RunMachine``: the loop must carry effects out in order,
hand events to ``emit``, stop before each disk write or kernel call (so the caller writes
what is decided first), and feed every reply back until no effect is left.
"""

from __future__ import annotations

from typing import Any

from agui_adapter.run.effects import (
    CancelTask,
    Effect,
    Emit,
    Failed,
    Finish,
    GetTask,
    KernelAnswer,
    Outcome,
    Persist,
    Persisted,
    ReleaseThread,
    Reply,
    SendStreaming,
)
from agui_adapter.run.loop import carry_out
from agui_adapter.state.record import Execution, RetireExecution, ThreadRecord


class Scripted:
    """Answers each reply with the next batch of a script, and keeps the replies."""

    def __init__(self, *batches: list[Effect]) -> None:
        self.batches = list(batches)
        self.replies: list[tuple[Reply, float]] = []

    def replied(self, reply: Reply, now: float) -> list[Effect]:
        self.replies.append((reply, now))
        return self.batches.pop(0)


def event(name: str) -> dict[str, Any]:
    return {"type": "CUSTOM", "name": name}


def test_replies_go_back_until_no_effect_is_left_and_requests_are_announced_first() -> None:
    record = ThreadRecord(thread_id="t", context_id="c", cwd="/tmp", user_id=None, execution=Execution("e", "inv"))
    write = Persist(RetireExecution("e"), required=True)
    machine = Scripted([Emit([event("b")]), GetTask("task-1")], [CancelTask("task-1"), Emit([event("c")])])
    log: list[Any] = []

    def perform(effect: Effect) -> Reply | None:
        log.append(("perform", type(effect).__name__))
        if isinstance(effect, Persist):
            return Persisted(record)
        if isinstance(effect, GetTask):
            return KernelAnswer(200, {"id": "task-1"})
        return None

    first = [Emit([event("a")]), ReleaseThread(), write]
    for request in carry_out(machine, first, perform, lambda events: log.append(("emit", events)), lambda: 7.0):
        log.append(("before", type(request).__name__))
    assert log == [
        ("emit", [event("a")]),
        ("perform", "ReleaseThread"),  # not a request: no stop before it
        ("before", "Persist"),
        ("perform", "Persist"),
        ("emit", [event("b")]),
        ("before", "GetTask"),
        ("perform", "GetTask"),
        ("perform", "CancelTask"),
        ("emit", [event("c")]),
    ]
    assert [type(reply).__name__ for reply, _ in machine.replies] == ["Persisted", "KernelAnswer"]
    assert {now for _, now in machine.replies} == {7.0} and not machine.batches


def test_a_batch_without_a_request_is_carried_out_without_asking_the_machine() -> None:
    machine = Scripted()
    performed: list[Effect] = []
    effects: list[Effect] = [SendStreaming({"messageId": "m"}), Finish(Outcome.SUCCESS)]
    requests = list(carry_out(machine, effects, lambda e: performed.append(e), lambda events: None, lambda: 0.0))
    assert [type(r) for r in requests] == [SendStreaming]  # a stream to open takes a while too
    assert performed == effects and machine.replies == []


def test_a_failed_request_is_a_reply_like_any_other() -> None:
    machine = Scripted([])
    list(carry_out(machine, [GetTask("t")], lambda e: Failed("refused"), lambda events: None, lambda: 1.0))
    assert machine.replies == [(Failed("refused"), 1.0)]
