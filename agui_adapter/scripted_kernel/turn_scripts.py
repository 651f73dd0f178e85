"""The normal-turn scripts: what the kernel does for a chat turn and its directives.

Why: each directive (``[TOOL]``, ``[WRITE]``, ``[ASK]``, ``[FAIL]``, ...) is a
small story told with the frame builders of :mod:`agui_adapter.scripted_kernel.frames`;
they live together so that adding one is adding one function here (the README
beside this module documents what each one sends).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from typing import Any

from agui_adapter.scripted_kernel.directives import Turn
from agui_adapter.scripted_kernel.frames import Run
from agui_adapter.scripted_kernel.pipeline_journal import match_option
from agui_adapter.scripted_kernel.tasks import Pending
from agui_adapter.scripted_kernel.wire import FAILED, WORKING, random_hex

_SENSITIVE_WORDS = ("key", "secret", "token", "password", "authorization")

DEFAULT_PIECES = ("Hello", " from the", " scripted kernel.")
SLOW_PIECES = (
    "Slowly",
    " counting:",
    " one,",
    " two,",
    " three,",
    " four,",
    " five,",
    " six,",
    " seven,",
    " eight.",
)
THINKING_PIECES = ("Let me think", " about this.")
FAIL_TEXT = "RetryableError: InternalServerError: Error code: 500 - scripted upstream failure"


WRITE_PATH = "hello.txt"
WRITE_CONTENT = "hello from scripted kernel\n"
READ_PATH = "notes.md"
READ_SAMPLE = b"# Notes\n\nSample file served by the scripted kernel.\n"
ASK_PROMPT = "Which region should host the site?"
ASK_OPTIONS = (
    {"id": "hz", "label": "cn-hangzhou"},
    {"id": "sh", "label": "cn-shanghai"},
)


# Texts the real kernel localises (taken from captures 02 and 17); other
# supported languages keep the English texts but report their code in ``language``.
_PERMISSION_TEXTS: dict[str, dict[str, str]] = {
    "en": {
        "title": "Change a workspace file",
        "purpose": "Write a file needed for the requested infrastructure task.",
        "prompt": "Change a workspace file Allow once?",
        "allow_once": "Allow once",
        "deny": "Deny",
        "wrote": "Successfully wrote {lines} lines to {path}",
    },
    "zh": {
        "title": "修改工作区文件",
        "purpose": "写入当前基础设施任务所需的文件。",
        "prompt": "是否允许本次操作：修改工作区文件？",
        "allow_once": "仅允许一次",
        "deny": "拒绝",
        "wrote": "成功写入 {lines} 行到 {path}",
    },
}


def _split_text(text: str, pieces: int = 3) -> list[str]:
    """Split ``text`` into up to ``pieces`` deltas on word boundaries (lossless)."""
    tokens = re.findall(r"\s*\S+|\s+$", text) or [text]
    size = -(-len(tokens) // pieces)
    return ["".join(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def _redact(value: Any) -> Any:
    """``value`` without any key that looks like a secret, at any depth ([ECHO])."""
    if isinstance(value, dict):
        return {k: _redact(v) for k, v in value.items() if not any(word in str(k).lower() for word in _SENSITIVE_WORDS)}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _artifact_for(path: str, data: bytes, media_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(artifact for the artifactUpdate frame, ``artifact`` of the tool status)."""
    artifact_id = str(uuid.uuid4())
    filename = os.path.basename(path)
    uri = f"iac-code-artifact://{artifact_id}/{filename}"
    common = {"uri": uri, "byteSize": float(len(data)), "sha256": hashlib.sha256(data).hexdigest(), "sourcePath": path}
    meta = dict(common, mediaType=media_type)
    artifact = {
        "artifactId": artifact_id,
        "name": filename,
        "parts": [
            {
                "url": uri,
                "metadata": dict(meta),
                "filename": filename,
                "mediaType": media_type,
            }
        ],
        "metadata": dict(meta),
    }
    tool_artifact = dict(common, artifactId=artifact_id, mediaType=media_type, filename=filename)
    return artifact, tool_artifact


# --------------------------------------------------------------------------- scripts


def script_turn(run: Run, *, turn: Turn, task_frame: dict[str, Any] | None) -> None:
    """A normal turn (``task_frame``: the ``task`` frame that opens a new task's stream)."""
    if task_frame is not None:
        run.task_frame(task_frame)
    run.opening(new_task=task_frame is not None)
    d = turn.directives
    if d.silent:
        run.sleep(d.silent)
    if "THINK" in d:
        for piece in THINKING_PIECES:
            run.thinking(piece)
    if "FAIL" in d:
        _script_fail(run)
        return
    if "WRITE" in d:
        _script_write(run, auto="AUTO" in d, slow="SLOW" in d)
        return
    if "ASK" in d:
        _script_ask(run)
        return
    used_tool = "TOOL" in d or "PROGRESS" in d
    if used_tool:
        _script_read_tool(run, progress="PROGRESS" in d)
    if d.fast is not None:
        run.fast(d.fast)
    elif "SLOW" in d:
        for piece in SLOW_PIECES:
            run.sleep(1.0)
            run.delta(piece)
    else:
        reply = _reply_text(run, turn)
        if reply:
            run.deltas(_split_text(reply))
        elif used_tool:
            run.delta("Done.")
        else:
            run.deltas(DEFAULT_PIECES)
    run.finish_reply()


def _reply_text(run: Run, turn: Turn) -> str:
    d = turn.directives
    lines: list[str] = []
    if "IMAGES" in d:
        types = ", ".join(turn.image_types) or "none"
        lines.append(f"Received {len(turn.image_types)} image(s): {types}")
    if "ECHO" in d:
        lines.append(d.rest)
        lines.append("iac_code keys: " + (", ".join(sorted(turn.iac)) or "(none)"))
        values = json.dumps(_redact(turn.iac), sort_keys=True, ensure_ascii=False)
        lines.append("iac_code values: " + values)
    if "RECALL" in d:
        lines.append(f"This context has seen {turn.turns} user turns.")
    return "\n".join(lines)


def _script_fail(run: Run) -> None:
    error = {"errorId": random_hex(12), "retryable": False}
    run.status(
        FAILED,
        message=run.message(FAIL_TEXT, f"{run.tid}-message"),
        metadata=run.meta(before={"error": error}),
    )
    run.usage(zero=True)
    run.status(
        WORKING,
        timestamp=True,
        metadata=run.meta(before={"assistantFinal": {"complete": True}}),
    )
    run.end_turn()


def _script_read_tool(run: Run, *, progress: bool) -> None:
    run.delta("I will read the file.")
    tool_use_id = "call_read_" + random_hex(12)
    run.tool_call(tool_use_id, "read_file", {"path": READ_PATH})
    run.end_llm_call()
    path = os.path.join(run.task.cwd, READ_PATH)
    if progress:
        for step in (1, 2):
            mcp = {
                "serverName": "scripted",
                "toolName": "read_file",
                "progress": float(step),
                "total": 2.0,
                "message": f"Reading {READ_PATH} ({step}/2)",
            }
            run.tool(
                {
                    "status": "progress",
                    "toolUseId": tool_use_id,
                    "name": "read_file",
                    "mcp": mcp,
                    "mcpProgress": dict(mcp),
                }
            )
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError:
        data = READ_SAMPLE
    artifact, tool_artifact = _artifact_for(path, data, "text/markdown")
    run.artifact(artifact)
    lines = data.count(b"\n") or 1
    run.tool(
        {
            "toolUseId": tool_use_id,
            "result": f"Read {lines} lines from {path}",
            "name": "read_file",
            "status": "completed",
            "artifact": tool_artifact,
        }
    )


def write_permission_shown(language: str, path: str, content: str) -> dict[str, Any]:
    """What a ``write_file`` permission shows (its envelope's keys after ``toolName``, capture 02)."""
    texts = _PERMISSION_TEXTS.get(language, _PERMISSION_TEXTS["en"])
    fingerprint = hashlib.sha256(content.encode("utf-8")).hexdigest()[:16]
    summary = json.dumps(
        {"content": {"fingerprint": f"sha256:{fingerprint}", "length": len(content), "type": "str"}, "path": path},
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    )
    return {
        "title": texts["title"],
        "purpose": texts["purpose"],
        "effect": "file_change",
        "target": path,
        "isReadOnly": False,
        "prompt": texts["prompt"],
        "safeSummary": f"write_file: {summary}",
        "options": [
            {"id": "allow_once", "label": texts["allow_once"]},
            {"id": "deny", "label": texts["deny"]},
        ],
    }


def write_file_result(language: str, cwd: str, path: str, content: str) -> tuple[bool, str]:
    """Write ``content`` to ``path`` inside ``cwd``; ``(is_error, result text)`` as write_file reports it."""
    texts = _PERMISSION_TEXTS.get(language, _PERMISSION_TEXTS["en"])
    target = os.path.join(cwd, path)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(content.encode("utf-8"))
    except OSError as exc:
        return True, f"Error: {exc}"
    return False, texts["wrote"].format(lines=content.count("\n"), path=target)


def _script_write(run: Run, *, auto: bool = False, slow: bool = False) -> None:
    language = run.task.language
    run.delta("I will write the file now.")
    tool_use_id = "call_write_" + random_hex(12)
    tool_input = {"content": WRITE_CONTENT, "path": WRITE_PATH}
    run.tool_call(tool_use_id, "write_file", tool_input)
    run.end_llm_call()
    if auto:  # a kernel that approves permissions itself (``auto_approve_permissions``) asks nobody
        _run_write(run, tool_use_id, "write_file", tool_input, "allow_once", slow=slow)
        return
    shown = write_permission_shown(language, WRITE_PATH, WRITE_CONTENT)
    run.interrupt(
        Pending.for_permission(
            task_id=run.tid,
            context_id=run.cid,
            language=language,
            tool_use_id=tool_use_id,
            tool_name="write_file",
            shown=shown,
            extra={"path": WRITE_PATH, "content": WRITE_CONTENT},
        )
    )


def script_permission_answer(run: Run, *, pending: Pending, decision: str) -> None:
    received = {
        "toolUseId": pending.tool_use_id,
        "kind": "permission",
        "inputId": pending.input_id,
    }
    run.status(WORKING, metadata={"iac_code": {"inputReceived": received}})
    name = pending.envelope.get("toolName", "write_file")
    _run_write(run, pending.tool_use_id, name, pending.extra, decision)


def _run_write(run: Run, tool_use_id: str, name: str, extra: dict[str, Any], decision: str, slow: bool = False) -> None:
    """The permitted (or denied) write: the file, its ``artifactUpdate``, the tool's end, the reply."""
    texts = _PERMISSION_TEXTS.get(run.task.language, _PERMISSION_TEXTS["en"])
    tool_artifact: dict[str, Any] | None = None
    if decision == "allow_once":
        path = os.path.join(run.task.cwd, extra["path"])
        data = extra["content"].encode("utf-8")
        try:
            os.makedirs(run.task.cwd, exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            result = f"Error: {exc}"
        else:
            artifact, tool_artifact = _artifact_for(path, data, "text/plain")
            run.artifact(artifact)
            result = texts["wrote"].format(lines=data.count(b"\n") or 1, path=path)
    else:
        result = f"The user denied permission to run {name}."
    outcome: dict[str, Any] = {
        "toolUseId": tool_use_id,
        "result": result,
        "name": name,
        "status": "failed" if tool_artifact is None else "completed",
    }
    if tool_artifact is not None:
        outcome["artifact"] = tool_artifact
    run.tool(outcome)
    if slow:
        for piece in ["Tool finished. ", "Result: ", result]:
            run.sleep(1.0)
            run.delta(piece)
    else:
        run.deltas(["Tool finished. ", "Result: ", result])
    run.finish_reply()


def _script_ask(run: Run) -> None:
    run.delta("I need one detail before I continue.")
    tool_use_id = "call_ask_" + random_hex(12)
    options = [dict(option) for option in ASK_OPTIONS]
    tool_input = {"question": ASK_PROMPT, "options": [o["label"] for o in options]}
    run.tool_call(tool_use_id, "ask_user_question", tool_input, deltas=False)
    run.end_llm_call()
    input_id = f"ask-{tool_use_id}"
    envelope = {
        "schemaVersion": 1.0,
        "kind": "ask_user_question",
        "required": True,
        "requestTaskId": run.tid,
        "contextId": run.cid,
        "inputId": input_id,
        "toolUseId": tool_use_id,
        "prompt": ASK_PROMPT,
        "allowFreeText": True,
        "options": options,
    }
    run.interrupt(Pending("ask_user_question", input_id, tool_use_id, envelope))


def script_ask_answer(run: Run, *, pending: Pending, answer: str) -> None:
    received: dict[str, Any] = {
        "kind": "ask_user_question",
        "inputId": pending.input_id,
        "toolUseId": pending.tool_use_id,
    }
    option = match_option(pending.envelope.get("options", []), answer)
    if option is not None:
        received["selectedId"] = option["id"]
        received["selectedLabel"] = option["label"]
        choice = option["label"]
    else:
        received["freeText"] = answer
        choice = answer
    run.status(WORKING, metadata={"iac_code": {"inputReceived": received}})
    run.tool(
        {
            "toolUseId": pending.tool_use_id,
            "result": f"User answered: {answer}",
            "name": "ask_user_question",
            "status": "completed",
        }
    )
    run.deltas(["You chose ", choice, "."])
    run.finish_reply()
