"""Submissions: turning a SendMessage into a task and a script running on a worker.

Why: one message can be a new turn, a follow-up to an idle task, a permission
or question answer, an answer to a pipeline wait, or guidance for a running
pipeline, each with the real kernel's rules for contexts, workspaces and busy
tasks. Deciding which (and failing the way the real kernel fails) is this
module's one job; the scripts then run on a worker thread and are broadcast to
every stream attached to the task, so a client that goes away does not stop it.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import uuid
from collections.abc import Callable
from typing import Any

from agui_adapter.scripted_kernel.directives import Directives, Turn
from agui_adapter.scripted_kernel.frames import PipeRun, Run
from agui_adapter.scripted_kernel.pipeline_journal import Pipeline
from agui_adapter.scripted_kernel.pipeline_scripts import pipeline_body
from agui_adapter.scripted_kernel.pipeline_waits import (
    INPUT_NOT_ACTIVE,
    INPUT_RESPONSE_MISMATCH,
    pipeline_answer_locked,
    sideband_answer_locked,
    start_pipeline,
)
from agui_adapter.scripted_kernel.tasks import Canceled, Context, KernelState, Task
from agui_adapter.scripted_kernel.turn_scripts import script_ask_answer, script_permission_answer, script_turn
from agui_adapter.scripted_kernel.user_message import (
    ID_RE,
    PERMISSION_FIELDS_MISMATCH,
    PERMISSION_NOT_ACTIVE,
    echo_message,
    inspect_images,
    language_of,
    permission_answer,
    pipeline_name,
)
from agui_adapter.scripted_kernel.wire import (
    CLOSE,
    FAILED,
    SUBMITTED,
    TERMINAL_STATES,
    invalid_params,
    now_iso,
    task_not_found,
)

BUSY_TEXT = "Task is already working."
BAD_CWD_TEXT = "Invalid A2A workspace metadata."
OTHER_CWD_TEXT = "ValueError: A2A context belongs to a different workspace"


class Submissions:
    """Validates a message, updates the task store, and starts the script it asks for."""

    def __init__(self, state: KernelState) -> None:
        self.state = state

    def submit(self, params: dict[str, Any], *, unary: bool = False) -> tuple[Task, queue.SimpleQueue[Any]]:
        """The task the message goes to and a queue subscribed to its frames (ends with ``CLOSE``)."""
        msg = params.get("message")
        if not isinstance(msg, dict):
            raise invalid_params("params.message is required.")
        if msg.get("role") != "ROLE_USER":
            raise invalid_params("message.role must be ROLE_USER.")
        if not isinstance(msg.get("messageId"), str) or not msg["messageId"]:
            raise invalid_params("message.messageId is required.")
        parts = msg.get("parts")
        if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
            raise invalid_params("message.parts must be a non-empty list of parts.")
        context_id, task_id = msg.get("contextId"), msg.get("taskId")
        for name, value in (("contextId", context_id), ("taskId", task_id)):
            if value is not None and (not isinstance(value, str) or not ID_RE.match(value)):
                raise invalid_params(f"message.{name} is not a valid identifier.")
        metadata = msg.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise invalid_params("message.metadata must be an object.")
        iac = (metadata or {}).get("iac_code") or {}
        if not isinstance(iac, dict):
            raise invalid_params("metadata.iac_code must be an object.")
        text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str))
        answer = permission_answer(parts)
        if task_id is None and answer is not None:
            task_id = answer["requestTaskId"]
        response = iac.get("inputResponse")
        if response is not None:
            if not isinstance(response, dict):
                raise invalid_params(INPUT_RESPONSE_MISMATCH)
            if task_id is None:
                task_id = response.get("requestTaskId")
                if not isinstance(task_id, str) or not task_id:
                    raise invalid_params(INPUT_NOT_ACTIVE)
        if task_id is not None:
            submitted = self._submit_to_task(task_id, context_id, answer, text, iac, response=response, unary=unary)
        else:
            submitted = self._submit_new_turn(msg, context_id, parts, text, iac)
        self.state.persist()
        return submitted

    def _submit_new_turn(
        self,
        msg: dict[str, Any],
        context_id: str | None,
        parts: list[dict[str, Any]],
        text: str,
        iac: dict[str, Any],
    ) -> tuple[Task, queue.SimpleQueue[Any]]:
        directives = Directives.parse(text)
        pipeline = pipeline_name(iac)
        image_types, image_error = inspect_images(parts)
        cwd = iac.get("cwd")
        default_cwd = self.state.default_cwd()
        subscriber: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self.state.lock:
            context_id = context_id or str(uuid.uuid4())
            ctx = self.state.contexts.get(context_id)
            task = self.state.new_task_locked(context_id, ctx.session_id if ctx else None)
            task_obj: dict[str, Any] = {
                "id": task.id,
                "contextId": context_id,
                "status": {"state": SUBMITTED},
                "history": [echo_message(msg, task.id, context_id)],
            }
            failure: str | None = None
            if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
                failure = BAD_CWD_TEXT
                task_obj["metadata"] = {}
            elif ctx is not None and cwd is not None and ctx.cwd not in (None, os.path.normpath(cwd)):
                failure = OTHER_CWD_TEXT
            elif ctx is not None and ctx.running_task_id is not None:
                failure = BUSY_TEXT
                running = self.state.tasks[ctx.running_task_id]
                task_obj["metadata"] = {
                    "iac_code": {
                        "executionControl": self.state.execution_control_locked(running),
                        "iacCodeSessionId": ctx.session_id,
                    }
                }
            elif image_error is not None:
                failure = image_error
            if failure is not None:
                status = {
                    "state": FAILED,
                    "message": {
                        "messageId": f"{task.id}-4",
                        "contextId": context_id,
                        "taskId": task.id,
                        "role": "ROLE_AGENT",
                        "parts": [{"text": failure}],
                    },
                    "timestamp": now_iso(),
                }
                task.status = status
                update = {"taskId": task.id, "contextId": context_id, "status": status}
                subscriber.put(({"task": task_obj}, 1))
                subscriber.put(({"statusUpdate": update}, 1))
                subscriber.put(CLOSE)
                return task, subscriber
            if ctx is None:
                ctx = Context(context_id, session_id=str(uuid.uuid4()))
                self.state.contexts[context_id] = ctx
                task.session_id = ctx.session_id
            if isinstance(cwd, str) and ctx.cwd is None:
                ctx.cwd = os.path.normpath(cwd)
            ctx.turns += 1
            if pipeline is None:  # a pipeline's steps talk in sessions of their own
                user = {"role": "user", "content": text, "token_count": 0, "elapsed_seconds": 0.0, "metadata": {}}
                ctx.conversation.append(user)
            task.cwd = ctx.cwd or default_cwd
            task.language = language_of(iac)
            task.running = True
            ctx.running_task_id = task.id
            task.subscribers.append(subscriber)
            pipe: Pipeline | None = None
            if pipeline is not None:
                pipe = Pipeline(
                    task.id,
                    context_id,
                    ctx.session_id,
                    pipeline,
                    text,
                    directives.flags,
                    rich=iac.get("candidatePresentation") == "rich-v1",
                    language=task.language,
                )
                pipe.runner = PipeRun(self.state, pipe)
                pipe.gen = pipeline_body(pipe.runner)
                self.state.pipelines[task.id] = pipe
                self.state.context_pipelines[context_id] = task.id
            turn = Turn(directives, dict(iac), tuple(image_types), ctx.turns)
        script: Callable[[Run], None]
        if pipe is not None:
            script = functools.partial(start_pipeline, pipe=pipe, task_frame={"task": task_obj})
        else:
            script = functools.partial(script_turn, turn=turn, task_frame={"task": task_obj})
        self._spawn(task, script)
        return task, subscriber

    @staticmethod
    def _guidance_ack(task: Task, pipe: Pipeline, text: str) -> dict[str, Any]:
        return {
            "statusUpdate": {
                "taskId": task.id,
                "contextId": task.context_id,
                "status": {"state": "TASK_STATE_WORKING", "timestamp": now_iso()},
                "metadata": {
                    "iac_code": {
                        "iacCodeSessionId": pipe.session_id,
                        "guidanceReceived": {"textLength": float(len(text.strip()))},
                    }
                },
            }
        }

    def _submit_to_task(
        self,
        task_id: str,
        context_id: str | None,
        answer: dict[str, Any] | None,
        text: str,
        iac: dict[str, Any],
        *,
        response: dict[str, Any] | None = None,
        unary: bool = False,
    ) -> tuple[Task, queue.SimpleQueue[Any]]:
        subscriber: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                if response is not None:
                    raise invalid_params(INPUT_NOT_ACTIVE)
                raise (invalid_params(PERMISSION_NOT_ACTIVE) if answer is not None else task_not_found())
            ctx = self.state.contexts.get(task.context_id)
            pending = task.pending
            pipe = self.state.pipelines.get(task.id)
            script: Callable[[Run], None]
            if answer is not None and pipe is not None and pipe.side_waits and task.running:
                # a candidate-step permission: the running pipeline takes the answer
                sideband_answer_locked(
                    task, pipe, context_id=context_id, answer=answer, unary=unary, subscriber=subscriber
                )
                return task, subscriber
            if pipe is not None and pipe.waits and not task.running:
                script = pipeline_answer_locked(
                    task, pipe, context_id=context_id, answer=answer, response=response, text=text
                )
            elif response is not None:
                raise invalid_params(INPUT_NOT_ACTIVE)
            elif answer is not None:
                if (
                    (context_id is not None and context_id != task.context_id)
                    or answer.get("contextId", task.context_id) != task.context_id
                    or answer["requestTaskId"] != task.id
                    or task.running
                    or pending is None
                    or pending.kind != "permission"
                    or answer["inputId"] != pending.input_id
                    or answer["toolUseId"] != pending.tool_use_id
                ):
                    raise invalid_params(PERMISSION_NOT_ACTIVE)
                script = functools.partial(
                    script_permission_answer,
                    pending=pending,
                    decision=answer["decision"],
                )
                task.pending = None
            else:
                if context_id is not None and context_id != task.context_id:
                    raise invalid_params("message.contextId does not match the task's contextId.")
                if task.running and pipe is not None and text.strip():
                    # Guidance for a running pipeline: acknowledged on its own short stream.
                    pipe.guidance.append(text.strip())
                    ack = self._guidance_ack(task, pipe, text)
                    delay = (Directives.parse(text).silent or 0.0) * self.state.delay_scale

                    def acknowledge(ack: dict[str, Any] = ack, subscriber: Any = subscriber) -> None:
                        subscriber.put((ack, 1))
                        subscriber.put(CLOSE)

                    if delay > 0:  # ``[SILENT n]``: the acknowledgment comes n x delay_scale s later
                        timer = threading.Timer(delay, acknowledge)
                        timer.daemon = True
                        timer.start()
                    else:
                        acknowledge()
                    return task, subscriber
                if task.running:
                    raise invalid_params(BUSY_TEXT)
                if pending is not None and pending.kind == "ask_user_question":
                    reply = text.strip()
                    if not reply:
                        raise invalid_params("An answer to the pending question is required.")
                    script = functools.partial(script_ask_answer, pending=pending, answer=reply)
                    task.pending = None
                elif pending is not None:
                    raise invalid_params(PERMISSION_FIELDS_MISMATCH)
                elif task.status["state"] in TERMINAL_STATES:
                    raise invalid_params(f"Task {task.id} is in terminal state: {task.status['state']}")
                else:
                    # A follow-up turn addressed to an idle task continues that task.
                    if ctx is None:
                        raise task_not_found()
                    cwd = iac.get("cwd")
                    if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
                        raise invalid_params(BAD_CWD_TEXT)
                    if cwd is not None and ctx.cwd not in (None, os.path.normpath(cwd)):
                        raise invalid_params(OTHER_CWD_TEXT)
                    if ctx.running_task_id is not None:
                        raise invalid_params(BUSY_TEXT)
                    ctx.turns += 1
                    turn = Turn(Directives.parse(text), dict(iac), (), ctx.turns)
                    script = functools.partial(script_turn, turn=turn, task_frame=None)
            task.running = True
            if ctx is not None:
                ctx.running_task_id = task.id
            task.subscribers.append(subscriber)
        self._spawn(task, script)
        return task, subscriber

    def _spawn(self, task: Task, script: Callable[[Run], None]) -> None:
        with self.state.lock:
            if self.state.closing:  # stop() raced with this request: end the stream at once
                task.canceled = True
                self.state.finish_locked(task)
                return
        run = Run(self.state, task)
        thread = threading.Thread(
            target=self._worker,
            args=(run, script),
            name=f"scripted-task-{task.id[:8]}",
            daemon=True,
        )
        thread.start()

    def _worker(self, run: Run, script: Callable[[Run], None]) -> None:
        try:
            script(run)
        except Canceled:
            pass
        except Exception as exc:  # noqa: BLE001 - a broken script must not leave streams hanging
            try:
                run.fail_now(f"{type(exc).__name__}: {exc}")
            except Canceled:
                pass
        finally:
            self.state.finish(run.task)
            self.state.persist()
