"""Answers to pipeline waits: checking them, acknowledging them, resuming the pipeline.

Why: a pipeline pauses at question and resource waits (the stream closes in
INPUT_REQUIRED) and, inside a candidate's step, at permission waits while it
keeps running (the task stays WORKING). An answer arrives as a new request
(streaming or unary) and must match an active wait exactly (else the kernel's
-32602 texts); a question's answer then drives the pipeline generator of
:mod:`agui_adapter.scripted_kernel.pipeline_scripts` on a worker, a permission's answer is
handed to the pipeline that waits for it. This module is that hand-over
between the request and the script.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable
from typing import Any

from agui_adapter.scripted_kernel.frames import Run
from agui_adapter.scripted_kernel.pipeline_journal import Pipeline, match_option, wait_iac
from agui_adapter.scripted_kernel.pipeline_scripts import confirmation_action
from agui_adapter.scripted_kernel.tasks import Pending, Task
from agui_adapter.scripted_kernel.user_message import PERMISSION_FIELDS_MISMATCH, PERMISSION_NOT_ACTIVE
from agui_adapter.scripted_kernel.wire import CLOSE, WORKING, invalid_params

INPUT_NOT_ACTIVE = "input_resume_invalid: pending input is not active."
INPUT_RESPONSE_MISMATCH = "Input response payload fields do not match schemaVersion 1."
NO_OPTION_TEXT = "The answer does not match any option."
INPUT_RESPONSE_KEYS = frozenset(
    {"schemaVersion", "kind", "status", "requestTaskId", "contextId", "inputId", "toolUseId", "selectorId", "value"}
)
INPUT_RESPONSE_OPTIONAL = frozenset({"label", "source", "optionsEmpty"})


def pipeline_answer_locked(
    task: Task,
    pipe: Pipeline,
    *,
    context_id: str | None,
    answer: dict[str, Any] | None,
    response: dict[str, Any] | None,
    text: str,
) -> Callable[[Run], None]:
    """Validate an answer to a pipeline question wait (lock held); returns the continuation script."""
    waits = pipe.waits
    pending = waits[0]
    if answer is not None:  # a step's permission (ros_deploy in deploying)
        if (
            pending.kind != "permission"
            or answer["inputId"] != pending.input_id
            or answer["toolUseId"] != pending.tool_use_id
            or answer["requestTaskId"] != task.id
            or answer.get("contextId", task.context_id) != task.context_id
            or (context_id is not None and context_id != task.context_id)
        ):
            raise invalid_params(PERMISSION_NOT_ACTIVE)
        pipe.waits = []
        return functools.partial(_resume_after_permission, pipe=pipe, pending=pending, decision=answer["decision"])
    if context_id is not None and context_id != task.context_id:
        raise invalid_params("message.contextId does not match the task's contextId.")
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
        if pending.kind == "deployment_confirmation":
            chosen = confirmation_action(pending.envelope["options"], reply)
            if chosen is None:
                raise invalid_params(NO_OPTION_TEXT)
            pipe.waits = []
            value = {"action": chosen[0], "text": chosen[1]}
            return functools.partial(resume_pipeline, pipe=pipe, value=value)
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


def sideband_answer_locked(
    task: Task,
    pipe: Pipeline,
    *,
    context_id: str | None,
    answer: dict[str, Any],
    unary: bool,
    subscriber: queue.SimpleQueue[Any],
) -> None:
    """An answer to a candidate-step permission, while the pipeline runs (lock held).

    The waiting pipeline takes it (``permission_resolved`` on its own stream); the answering
    request only gets an acknowledgement: a unary ``SendMessage`` the ``permission_ack`` Message
    (tests/data/a2a-selling/08, built by the app), a streaming one (not observed on the real
    kernel, a scripted choice) one WORKING frame with ``inputReceived``.
    """
    match = next(
        (w for w in pipe.side_waits if w.input_id == answer["inputId"] and w.tool_use_id == answer["toolUseId"]),
        None,
    )
    if (
        match is None
        or answer["requestTaskId"] != task.id
        or answer.get("contextId", task.context_id) != task.context_id
        or (context_id is not None and context_id != task.context_id)
    ):
        raise invalid_params(PERMISSION_NOT_ACTIVE)
    pipe.side_waits.remove(match)
    pipe.side_answers.put((match, answer["decision"]))
    if not unary:
        received = {
            "toolUseId": match.tool_use_id,
            "kind": "permission",
            "inputId": match.input_id,
            "decision": answer["decision"],
        }
        update = {
            "taskId": task.id,
            "contextId": task.context_id,
            "status": {"state": WORKING},
            "metadata": {"iac_code": {"inputReceived": received, "iacCodeSessionId": task.session_id}},
        }
        subscriber.put(({"statusUpdate": update}, 1))
    subscriber.put(CLOSE)


def _resume_after_permission(run: Run, *, pipe: Pipeline, pending: Pending, decision: str) -> None:
    """A step's permission was answered: ``inputReceived`` (no envelope, tests/data/a2a-selling/11), then on."""
    received = {"toolUseId": pending.tool_use_id, "kind": "permission", "inputId": pending.input_id}
    run.status(WORKING, metadata={"iac_code": {"inputReceived": received, "iacCodeSessionId": run.sid}})
    resume_pipeline(run, pipe=pipe, value=decision)


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
    # a backup_committed frame after an announced wait carries no input (tests/data/a2a-selling/10)
    announced = envelopes[-1]["eventType"] == "backup_committed"
    runner.send(*envelopes, extra=None if announced else wait_iac(waits), close=True)
