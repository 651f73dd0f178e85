"""A JSON-RPC client of the scripted kernel, for the tests that pin its wire dialect.

Built on ``requests`` and strict on purpose: every SSE block must be one ``data: `` line of
JSON or a comment, with LF line ends, as the real kernel's captures show. (The real-kernel
harness has its own standard-library reader, tolerant of CRLF and multi-line data, since it
reads a kernel that is not ours.)

``rpc`` posts one JSON-RPC request (bearer auth from the kernel's token, ``A2A-Version: 1.0``);
``message`` builds ``SendMessage`` params; ``SSE`` reads a streaming answer frame by frame
(``open_stream`` and ``frames`` also insist on the SSE content type); ``kind``, ``update``,
``state``, ``iac`` and ``text_of`` look into one frame; ``rpc_error`` insists on a JSON error;
``pipeline_state`` and ``journal`` read the pipeline side route.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from agui_adapter.scripted_kernel import ScriptedKernel

EVENT_STREAM = "text/event-stream; charset=utf-8"


def a2a_headers(token: str | None) -> dict[str, str]:
    """Bearer auth (when there is a token) and ``A2A-Version: 1.0``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers["A2A-Version"] = "1.0"
    return headers


def rpc(
    kernel: ScriptedKernel,
    method: str,
    params: dict[str, Any],
    *,
    rid: Any = "req-1",
    headers: dict[str, str] | None = None,
    stream: bool = False,
) -> requests.Response:
    """One JSON-RPC request; ``headers`` default to the kernel's own token and ``A2A-Version``."""
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    return requests.post(
        kernel.url,
        json=body,
        headers=a2a_headers(kernel.token) if headers is None else headers,
        stream=stream,
        timeout=10,
    )


def message(
    text: str | None = None,
    *,
    context_id: str | None = None,
    cwd: str | None = None,
    task_id: str | None = None,
    parts: list[dict[str, Any]] | None = None,
    **iac: Any,
) -> dict[str, Any]:
    """``SendMessage`` params: a user message, its ``metadata.iac_code`` from ``cwd`` and ``iac``."""
    msg: dict[str, Any] = {
        "messageId": "msg-" + uuid.uuid4().hex[:8],
        "role": "ROLE_USER",
        "parts": parts if parts is not None else [{"text": text}],
    }
    if context_id:
        msg["contextId"] = context_id
    if task_id:
        msg["taskId"] = task_id
    if cwd is not None:
        iac["cwd"] = cwd
    if iac:
        msg["metadata"] = {"iac_code": iac}
    return {"message": msg, "configuration": {"acceptedOutputModes": ["text/plain"]}}


def new_ctx(prefix: str = "ctx-") -> str:
    """A fresh context id."""
    return prefix + uuid.uuid4().hex[:12]


class SSE:
    """Incremental SSE reader: iterate JSON frames; comments are collected."""

    def __init__(self, response: requests.Response) -> None:
        self.response = response
        self.comments: list[str] = []
        self._chunks = response.iter_content(chunk_size=None)
        self._buffer = b""

    def __iter__(self) -> SSE:
        return self

    def __next__(self) -> dict[str, Any]:
        while True:
            end = self._buffer.find(b"\n\n")
            if end >= 0:
                block, self._buffer = (
                    self._buffer[:end].decode("utf-8"),
                    self._buffer[end + 2 :],
                )
                if block.startswith(":"):
                    self.comments.append(block)
                    continue
                assert block.startswith("data: "), block
                return json.loads(block[len("data: ") :])
            self._buffer += next(self._chunks)


def open_stream(response: requests.Response) -> SSE:
    """The reader of a streaming answer, which must be an SSE stream."""
    assert response.headers["Content-Type"] == EVENT_STREAM, response.text
    return SSE(response)


def frames(response: requests.Response) -> list[dict[str, Any]]:
    """Every frame of a streaming answer, which must be an SSE stream."""
    return list(open_stream(response))


def kind(frame: dict[str, Any]) -> str:
    (key,) = frame["result"].keys()
    return key


def update(frame: dict[str, Any]) -> dict[str, Any]:
    return frame["result"]["statusUpdate"]


def state(frame: dict[str, Any]) -> str:
    return update(frame)["status"]["state"]


def iac(frame: dict[str, Any]) -> dict[str, Any]:
    return update(frame).get("metadata", {}).get("iac_code", {})


def text_of(frame: dict[str, Any]) -> str | None:
    msg = update(frame)["status"].get("message")
    return "".join(p["text"] for p in msg["parts"]) if msg else None


def rpc_error(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    return response.json()["error"]


def pipeline_state(kernel: ScriptedKernel, **params: Any) -> requests.Response:
    """``GET iac-code/pipeline/state`` with ``params``."""
    return requests.get(
        kernel.url + "iac-code/pipeline/state", params=params, headers=a2a_headers(kernel.token), timeout=10
    )


def journal(kernel: ScriptedKernel, task_id: str, after: int = 0) -> list[dict[str, Any]]:
    """The pipeline events of a task after sequence ``after``, as the kernel journaled them."""
    response = pipeline_state(kernel, taskId=task_id, afterSequence=after, includeSnapshot="false")
    assert response.status_code == 200, response.text
    return response.json()["events"]
