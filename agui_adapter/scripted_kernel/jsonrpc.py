"""The scripted kernel's HTTP app: routes, JSON-RPC dispatch and the A2A methods.

Why: the adapter reaches its kernel over real HTTP (JSON-RPC 2.0 on ``POST /``,
SSE for the streaming methods, a few REST routes of the iac-code extension);
this WSGI app is that surface, with the real kernel's status codes and error
objects, and nothing of the scripts themselves.
"""

from __future__ import annotations

import hmac
import json
import os
import queue
from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Request, Response

from agui_adapter.scripted_kernel.submissions import Submissions
from agui_adapter.scripted_kernel.tasks import KernelState, Task
from agui_adapter.scripted_kernel.user_message import permission_ack, permission_answer
from agui_adapter.scripted_kernel.wire import (
    A2A_VERSION,
    ACK,
    CLOSE,
    KERNEL_VERSION,
    RpcError,
    invalid_params,
    json_response,
    rpc_error,
    sse_response,
    task_not_found,
    version_not_supported,
)

_Handler = Callable[[Any, dict[str, Any]], Any]


class ScriptedKernelApp:
    """The WSGI application. Construct it with :func:`create_app`."""

    def __init__(self, state: KernelState) -> None:
        self.state = state
        self.submissions = Submissions(state)
        self.routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("POST", "/"): self._rpc,
            ("GET", "/health"): self._health,
            ("GET", "/.well-known/agent-card.json"): self._agent_card,
            ("GET", "/iac-code/readiness"): self._readiness,
            ("POST", "/iac-code/session/ensure-restored"): self._ensure_restored,
            ("GET", "/iac-code/pipeline/state"): self._pipeline_state,
            ("GET", "/iac-code/session/recovery"): self._session_recovery,
            ("GET", "/_scripted/requests"): self._scripted_requests,
            ("POST", "/_scripted/reset"): self._scripted_reset,
        }
        self.methods: dict[str, _Handler] = {
            "SendStreamingMessage": self._m_send_streaming,
            "SendMessage": self._m_send,
            "GetTask": self._m_get_task,
            "CancelTask": self._m_cancel_task,
            "SubscribeToTask": self._m_subscribe,
            "ListTasks": self._m_list_tasks,
        }

    # ----------------------------------------------------------- WSGI plumbing

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        request = Request(environ)
        if not self._authorized(request):
            response = json_response({"error": "Unauthorized"}, 401)
        else:
            handler = self.routes.get((request.method, request.path))
            if handler is not None:
                response = handler(request)
            elif any(path == request.path for _, path in self.routes):
                response = json_response({"error": "Method Not Allowed"}, 405)
            else:
                response = json_response({"error": "Not Found"}, 404)
        return response(environ, start_response)

    def _authorized(self, request: Request) -> bool:
        token = self.state.token
        if not token:
            return True
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode("utf-8"), token.encode("utf-8"))

    # ----------------------------------------------------------- plain routes

    def _health(self, request: Request) -> Response:
        return json_response({"status": "healthy", "version": KERNEL_VERSION, "mode": "normal"})

    def _agent_card(self, request: Request) -> Response:
        base = request.host_url
        extensions = [
            "urn:iac-code:a2a:artifact-metadata:v1",
            "urn:iac-code:a2a:execution-control:v1",
            "urn:iac-code:a2a:thinking-exposure:v1",
            "urn:iac-code:a2a:pipeline-events:v1",
        ]
        card = {
            "name": "iac-code",
            "description": "Scripted iac-code A2A kernel (deterministic, for development and tests).",
            "supportedInterfaces": [
                {
                    "url": base,
                    "protocolBinding": "JSONRPC",
                    "protocolVersion": A2A_VERSION,
                }
            ],
            "provider": {"organization": "iac-code"},
            "version": KERNEL_VERSION,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extensions": [{"uri": uri} for uri in extensions],
            },
            "defaultInputModes": [
                "text/plain",
                "application/json",
                "image/png",
                "image/jpeg",
            ],
            "defaultOutputModes": ["text/plain"],
            "skills": [],
        }
        response = json_response(card)
        response.headers["Cache-Control"] = "public, max-age=60"
        return response

    def _readiness(self, request: Request) -> Response:
        return json_response(
            {
                "schemaVersion": 1,
                "llm": {
                    "ready": True,
                    "source": "scripted",
                    "provider": "scripted",
                    "providerDisplay": "Scripted",
                    "model": "scripted",
                    "missing": [],
                },
                "cloud": {
                    "ready": False,
                    "provider": "aliyun",
                    "mode": None,
                    "regionId": None,
                    "missing": ["credentials"],
                },
            }
        )

    def _ensure_restored(self, request: Request) -> Response:
        bad = json_response({"error": "Invalid session restore request."}, 400)
        try:
            body = json.loads(request.get_data() or b"null")
        except ValueError:
            return bad
        if not isinstance(body, dict):
            return bad
        cwd, session_id, task_id = (
            body.get("cwd"),
            body.get("sessionId"),
            body.get("taskId"),
        )
        if not (isinstance(cwd, str) and os.path.isabs(cwd)):
            return bad
        if not (isinstance(session_id, str) and session_id):
            return bad
        if task_id is not None and not isinstance(task_id, str):
            return bad
        wanted_cwd = os.path.normpath(cwd)
        with self.state.lock:
            if session_id in self.state.backup_not_ready:
                return json_response(
                    {
                        "error": {
                            "code": "SESSION_BACKUP_NOT_READY",
                            "retryable": True,
                            "message": "Session backup is still synchronizing. Retry after 3 seconds.",
                        }
                    },
                    409,
                )
            found = any(
                ctx.session_id == session_id and ctx.cwd in (None, wanted_cwd) for ctx in self.state.contexts.values()
            )
            if found and task_id:
                task = self.state.tasks.get(task_id)
                found = task is not None and task.session_id == session_id
        if found:
            return json_response({"status": "current"})
        return json_response({"status": "not_found"}, 404)

    def _pipeline_state(self, request: Request) -> Response:
        task_id = request.args.get("taskId") or None
        context_id = request.args.get("contextId") or None
        if task_id is None and context_id is None:
            return json_response({"error": "taskId or contextId is required."}, 400)
        try:
            snapshot = self.state.pipeline_snapshot(task_id, context_id, dict(request.args))
        except ValueError as exc:
            return json_response({"error": str(exc)}, 400)
        if snapshot is None:
            return json_response({"error": "A2A pipeline state not found"}, 404)
        return json_response(snapshot)

    def _session_recovery(self, request: Request) -> Response:
        """The context's current execution and the session's conversation (``messages``), as
        iac-code 0.16.0 answers them; another execution than the current one is a conflict."""
        context_id = request.args.get("contextId") or ""
        execution_id = request.args.get("executionId") or ""
        if not context_id or not execution_id:
            return json_response({"error": "contextId and executionId are required."}, 400)
        with self.state.lock:
            ctx = self.state.contexts.get(context_id)
            tasks = [t for t in self.state.tasks.values() if t.context_id == context_id]
            if ctx is None or not tasks:
                return json_response({"error": "Execution was not found"}, 404)
            task = max(tasks, key=lambda t: t.seq)
            if task.execution_id != execution_id:
                return json_response({"error": "executionId does not identify the current execution"}, 409)
            snapshot = self.state.snapshot_locked(task)
            control = snapshot["metadata"]["iac_code"]["executionControl"]
            output = [m["parts"][0]["text"] for m in snapshot.get("history", []) if m.get("parts")][-1:]
            body = {
                "contextId": context_id,
                "taskId": task.id,
                "executionId": task.execution_id,
                "revision": 0,
                "executionStatus": control["executionStatus"],
                "outputText": output,
                "task": snapshot,
                "messages": [dict(m) for m in ctx.conversation],
                "executionControl": control,
            }
        return json_response(body)

    def _scripted_requests(self, request: Request) -> Response:
        return json_response(self.state.requests)

    def _scripted_reset(self, request: Request) -> Response:
        self.state.reset_requests()
        return json_response({"status": "reset"})

    # ----------------------------------------------------------- JSON-RPC

    def _rpc(self, request: Request) -> Response:
        try:
            body = json.loads(request.get_data())
        except ValueError:
            return rpc_error(None, RpcError(-32700, "Parse error"))
        if not isinstance(body, dict):
            return rpc_error(None, RpcError(-32600, "Invalid Request"))
        rid = body.get("id")
        method = body.get("method")
        params = body.get("params")
        version = request.headers.get("A2A-Version")
        headers: dict[str, Any] = {"authorization": "Authorization" in request.headers, "a2a-version": version}
        for name in ("x-request-id", "traceparent", "tracestate"):  # what a client passes on, when it does
            if name in request.headers:
                headers[name] = request.headers[name]
        self.state.log_request({"method": method, "params": params, "headers": headers, "id": rid})
        if body.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return rpc_error(rid, RpcError(-32600, "Invalid Request"))
        if (version or "").strip() != A2A_VERSION:
            return rpc_error(rid, version_not_supported(version))
        handler = self.methods.get(method)
        if handler is None:
            return rpc_error(rid, RpcError(-32601, "Method not found"))
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return rpc_error(rid, invalid_params("params must be an object."))
        try:
            outcome = handler(rid, params)
        except RpcError as exc:
            return rpc_error(rid, exc)
        if isinstance(outcome, Response):
            return outcome
        return json_response({"result": outcome, "id": rid, "jsonrpc": "2.0"})

    @staticmethod
    def _task_id_param(params: dict[str, Any]) -> str:
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise invalid_params("params.id is required.")
        return task_id

    def _m_send_streaming(self, rid: Any, params: dict[str, Any]) -> Response:
        task, subscriber = self.submissions.submit(params)
        return self._sse_response(task, subscriber, rid)

    def _m_send(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        message = params.get("message")
        parts = message.get("parts") if isinstance(message, dict) else None
        well_formed = isinstance(parts, list) and all(isinstance(p, dict) for p in parts)
        answer = permission_answer(parts) if well_formed else None
        with self.state.lock:
            sideband = answer is not None and answer["requestTaskId"] in self.state.pipelines
        task, subscriber = self.submissions.submit(params, unary=True)
        try:
            # Until the turn ends, or until a resumed pipeline acknowledged the answer.
            while (item := subscriber.get()) is not CLOSE and item is not ACK:
                pass
        finally:
            self.state.unsubscribe(task, subscriber)
        if sideband:
            assert answer is not None
            return {"message": permission_ack(task, answer)}
        with self.state.lock:
            return {"task": self.state.snapshot_locked(task)}

    def _m_get_task(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        task_id = self._task_id_param(params)
        history_length = params.get("historyLength")
        if history_length is not None and (
            isinstance(history_length, bool) or not isinstance(history_length, int) or history_length < 0
        ):
            raise invalid_params("historyLength must be a non-negative integer.")
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                raise task_not_found()
            return self.state.snapshot_locked(task, history_length)

    def _m_cancel_task(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        return self.state.cancel(self._task_id_param(params))

    def _m_subscribe(self, rid: Any, params: dict[str, Any]) -> Response:
        task_id = self._task_id_param(params)
        subscriber: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                raise task_not_found()
            if not task.running:
                raise task_not_found(f"Task {task_id} is not active")
            subscriber.put(({"task": self.state.snapshot_locked(task)}, 1))
            task.subscribers.append(subscriber)
            task.attached.set()
        return self._sse_response(task, subscriber, rid)

    def _m_list_tasks(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        page_size = params.get("pageSize", 50)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 100:
            raise invalid_params("pageSize must be between 1 and 100.")
        token = params.get("pageToken") or "0"
        if not (isinstance(token, str) and token.isdigit()):
            raise invalid_params("Invalid pageToken.")
        history_length = params.get("historyLength")
        if history_length is not None and (isinstance(history_length, bool) or not isinstance(history_length, int)):
            raise invalid_params("historyLength must be an integer.")
        start = int(token)
        with self.state.lock:
            tasks = sorted(self.state.tasks.values(), key=lambda t: t.seq, reverse=True)
            if params.get("contextId"):
                tasks = [t for t in tasks if t.context_id == params["contextId"]]
            if params.get("status"):
                tasks = [t for t in tasks if t.status["state"] == params["status"]]
            page = tasks[start : start + page_size]
            items = []
            for task in page:
                snap = self.state.snapshot_locked(task, history_length or 0)
                snap["history"] = snap.get("history", [])
                if not params.get("includeArtifacts"):
                    snap.pop("artifacts", None)
                items.append(snap)
        next_token = str(start + page_size) if start + page_size < len(tasks) else ""
        return {
            "tasks": items,
            "pageSize": page_size,
            "totalSize": len(tasks),
            "nextPageToken": next_token,
        }

    def _sse_response(self, task: Task, subscriber: queue.SimpleQueue[Any], rid: Any) -> Response:
        return sse_response(
            subscriber, rid, self.state.keepalive_seconds, lambda: self.state.unsubscribe(task, subscriber)
        )


def create_app(
    state: KernelState | None = None,
    *,
    token: str | None = None,
    delay_scale: float = 1.0,
    keepalive_seconds: float = 15.0,
    state_dir: str | None = None,
) -> ScriptedKernelApp:
    """The scripted kernel as a WSGI app (keyword options apply when ``state`` is None)."""
    if state is None:
        state = KernelState(token, delay_scale=delay_scale, keepalive_seconds=keepalive_seconds, state_dir=state_dir)
    return ScriptedKernelApp(state)
