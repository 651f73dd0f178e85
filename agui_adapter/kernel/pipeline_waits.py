"""Answers to pipeline waits: checking them, acknowledging them, resuming the pipeline.

Why: a pipeline pauses at question, resource and permission waits; an answer
arrives as a new request (streaming or unary), must match an active wait
exactly (else the kernel's -32602 texts), may resolve only one of several
permissions (acknowledged in place), and then drives the pipeline generator of
:mod:`agui_adapter.kernel.pipelines` on a worker. This module is that
hand-over between the request and the script.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable
from typing import Any

from agui_adapter.kernel.frames import Run
from agui_adapter.kernel.journal import Pipeline, match_option, wait_iac
from agui_adapter.kernel.messages import PERMISSION_FIELDS_MISMATCH, PERMISSION_NOT_ACTIVE
from agui_adapter.kernel.tasks import Canceled, KernelState, Pending, Task
from agui_adapter.kernel.wire import ACK, CLOSE, INPUT_REQUIRED, WORKING, as_struct, invalid_params

#: Seconds a pipeline resumed by a unary SendMessage waits for a SubscribeToTask (unscaled).
PIPELINE_SUBSCRIBE_GRACE = 2.0


INPUT_NOT_ACTIVE = "input_resume_invalid: pending input is not active."
INPUT_RESPONSE_MISMATCH = "Input response payload fields do not match schemaVersion 1."
NO_OPTION_TEXT = "The answer does not match any option."
INPUT_RESPONSE_KEYS = frozenset(
    {"schemaVersion", "kind", "status", "requestTaskId", "contextId", "inputId", "toolUseId", "selectorId", "value"}
)
INPUT_RESPONSE_OPTIONAL = frozenset({"label", "source", "optionsEmpty"})


def pipeline_answer_locked(
    state: KernelState,
    task: Task,
    pipe: Pipeline,
    *,
    context_id: str | None,
    answer: dict[str, Any] | None,
    response: dict[str, Any] | None,
    text: str,
    unary: bool,
    subscriber: queue.SimpleQueue[Any],
) -> Callable[[Run], None] | None:
    """Validate an answer to a pipeline wait (lock held).

    Returns the continuation script, or ``None`` when the answer resolved one
    of several permissions (acknowledged in place: the stream gets the ack
    and the remaining wait, and closes).
    """
    waits = pipe.waits
    if answer is not None:
        match = next(
            (
                w
                for w in waits
                if w.kind == "permission" and w.input_id == answer["inputId"] and w.tool_use_id == answer["toolUseId"]
            ),
            None,
        )
        if (
            match is None
            or answer["requestTaskId"] != task.id
            or answer.get("contextId", task.context_id) != task.context_id
            or (context_id is not None and context_id != task.context_id)
        ):
            raise invalid_params(PERMISSION_NOT_ACTIVE)
        decision = answer["decision"]
        waits.remove(match)
        pipe.answers.append((match, decision))
        if waits:
            _partial_ack_locked(state, task, pipe, match, decision, subscriber)
            return None
        task.attached.clear()
        return functools.partial(_script_pipeline_permission, pipe=pipe, pending=match, decision=decision, unary=unary)
    if context_id is not None and context_id != task.context_id:
        raise invalid_params("message.contextId does not match the task's contextId.")
    pending = waits[0]
    value: dict[str, Any]
    if response is not None:
        value = _resource_response(task, pending, response)
    elif pending.kind == "permission":
        raise invalid_params(PERMISSION_FIELDS_MISMATCH)
    elif pending.kind == "cloud_resource_selection":
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    else:
        reply = text.strip()
        if not reply:
            raise invalid_params("An answer to the pending question is required.")
        option = match_option(pending.envelope.get("options", []), reply)
        if option is None and not pending.envelope.get("allowFreeText"):
            raise invalid_params(NO_OPTION_TEXT)
        value = {"text": reply, "option": option}
    pipe.waits = []
    return functools.partial(resume_pipeline, pipe=pipe, value=value)


def _resource_response(task: Task, pending: Pending, response: dict[str, Any]) -> dict[str, Any]:
    """The validated ``iac_code.inputResponse`` of a cloud_resource_selection answer."""
    if pending.kind != "cloud_resource_selection":
        raise invalid_params(INPUT_NOT_ACTIVE)
    keys = set(response)
    if not INPUT_RESPONSE_KEYS <= keys <= INPUT_RESPONSE_KEYS | INPUT_RESPONSE_OPTIONAL:
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    version = response["schemaVersion"]
    if isinstance(version, bool) or version not in (1, "1", "1.0"):
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    if response["kind"] != "cloud_resource_selection" or response["status"] not in ("selected", "canceled"):
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    for key in ("requestTaskId", "contextId", "inputId", "toolUseId", "selectorId"):
        if not isinstance(response[key], str) or not response[key]:
            raise invalid_params(INPUT_RESPONSE_MISMATCH)
    if (
        response["requestTaskId"] != task.id
        or response["contextId"] != task.context_id
        or response["inputId"] != pending.input_id
        or response["toolUseId"] != pending.tool_use_id
    ):
        raise invalid_params(INPUT_NOT_ACTIVE)
    selector = pending.envelope["selector"]
    label = response.get("label")
    value = response["value"]
    if response["selectorId"] != selector["selectorId"] or (label is not None and not isinstance(label, str)):
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    if response["status"] == "selected":
        option = next((o for o in selector["options"] if o["value"] == value), None)
        if option is None:
            raise invalid_params("The selected value is not one of the offered options.")
        label = label or option["label"]
    elif value is not None and not isinstance(value, str):
        raise invalid_params(INPUT_RESPONSE_MISMATCH)
    return {"status": response["status"], "selectorId": selector["selectorId"], "value": value, "label": label}


def _resolved_data(pending: Pending, decision: str) -> dict[str, Any]:
    return {
        "kind": "permission",
        "inputId": pending.input_id,
        "toolUseId": pending.tool_use_id,
        "toolName": pending.envelope.get("toolName"),
        "decision": decision,
        "candidateId": pending.extra.get("candidate"),
    }


def _permission_received(pending: Pending, decision: str) -> dict[str, Any]:
    return {
        "toolUseId": pending.tool_use_id,
        "kind": "permission",
        "inputId": pending.input_id,
        "decision": decision,
    }


def _partial_ack_locked(
    state: KernelState, task: Task, pipe: Pipeline, pending: Pending, decision: str, subscriber: queue.SimpleQueue[Any]
) -> None:
    envelope = state.pipeline_event_locked(
        pipe, "permission_resolved", _resolved_data(pending, decision), **pending.extra["coords"]
    )
    ack_status = {"state": WORKING}
    wait_status = {"state": INPUT_REQUIRED}
    ack_iac = {"pipeline": as_struct(envelope), "inputReceived": _permission_received(pending, decision)}
    waiting_iac = dict(wait_iac(pipe.waits), iacCodeSessionId=task.session_id)
    for status, iac in ((ack_status, ack_iac), (wait_status, waiting_iac)):
        state.apply_status_locked(task, status, 1)
        update = {"taskId": task.id, "contextId": task.context_id, "status": status, "metadata": {"iac_code": iac}}
        subscriber.put(({"statusUpdate": update}, 1))
    subscriber.put(CLOSE)


def _script_pipeline_permission(run: Run, *, pipe: Pipeline, pending: Pending, decision: str, unary: bool) -> None:
    """The last pending permission was answered: acknowledge, then resume the pipeline."""
    runner = pipe.runner
    assert runner is not None
    runner.run = run
    envelope = runner.event("permission_resolved", _resolved_data(pending, decision), **pending.extra["coords"])
    runner.send(envelope, extra={"inputReceived": _permission_received(pending, decision)})
    run.state.signal(run.task, ACK)
    if unary:
        # The unary caller follows with GetTask + SubscribeToTask: give it a moment to attach.
        deadline = time.monotonic() + PIPELINE_SUBSCRIBE_GRACE
        while not run.task.attached.wait(0.02):
            if run.task.cancel_event.is_set():
                raise Canceled()
            if time.monotonic() >= deadline:
                break
    with run.state.lock:
        answers, pipe.answers = pipe.answers, []
    resume_pipeline(run, pipe=pipe, value=answers)


def start_pipeline(run: Run, *, pipe: Pipeline, task_frame: dict[str, Any]) -> None:
    """A new pipeline turn: the ``task`` frame, then ``pipeline_started`` (no plain SUBMITTED/WORKING)."""
    run.task_frame(task_frame)
    resume_pipeline(run, pipe=pipe, value=None)


def resume_pipeline(run: Run, *, pipe: Pipeline, value: Any) -> None:
    """Drive the pipeline script until its next wait (stream closes) or its end."""
    runner = pipe.runner
    assert runner is not None and pipe.gen is not None
    runner.run = run
    try:
        envelopes, waits = pipe.gen.send(value)
    except StopIteration:
        return
    with run.state.lock:
        pipe.waits = list(waits)
    runner.send(*envelopes, extra=wait_iac(waits), close=True)
