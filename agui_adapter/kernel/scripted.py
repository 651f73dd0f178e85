"""A deterministic A2A 1.0 JSON-RPC server that speaks the iac-code 0.16.0 dialect.

Why this module exists
----------------------
The adapter's execution kernel is ``iac-code a2a``: a JSON-RPC/SSE server on
loopback. That server needs a 389 MB install, an LLM, and seconds per turn, so
the adapter also needs a kernel that is always there, fast and deterministic:
for ``python run.py`` when no real kernel is installed, for the fast tests, and
for throughput benchmarks. This module is that kernel. It is a small Werkzeug
app reached over real HTTP, never an in-process shortcut, so the adapter's A2A
client path is always exercised. Its frames copy the real kernel's wire shapes
(field names, nesting, which keys are present, floats inside metadata,
messageId conventions, frame order) as seen in the captured traffic; the
*texts* are scripted.

Wire surface
------------
* ``POST /`` JSON-RPC 2.0 with the ``A2A-Version: 1.0`` header (else -32009).
  Methods: ``SendStreamingMessage``, ``SendMessage``, ``GetTask``,
  ``CancelTask``, ``SubscribeToTask``, ``ListTasks``; anything else is -32601.
  Errors are always HTTP 200 ``application/json`` with one JSON-RPC error
  object, also for the streaming methods.
* Streams are ``text/event-stream; charset=utf-8`` frames
  ``data: <compact JSON-RPC response>`` with the request id echoed, plus a
  ``: ping - <timestamp>`` comment after ``keepalive_seconds`` of silence.
* ``GET /health``, ``GET /.well-known/agent-card.json``,
  ``GET /iac-code/readiness``, ``POST /iac-code/session/ensure-restored``,
  ``GET /iac-code/pipeline/state`` (pipeline snapshot and journal, see
  "Pipeline mode"; :meth:`KernelState.pipeline_snapshot` builds the body).
* Test hooks: ``GET /_scripted/requests`` (the JSON-RPC request log) and
  ``POST /_scripted/reset`` (clears it).
* With a token configured, every route needs ``Authorization: Bearer <token>``
  (else 401 ``{"error":"Unauthorized"}``).

Directives
----------
The user text (the concatenated text parts of a new turn) chooses the script.
Directives may be combined: ``[SILENT n]`` and ``[THINK]`` prefix any script;
``[FAIL]`` wins over ``[WRITE]``, which wins over ``[ASK]``; ``[TOOL]`` or
``[PROGRESS]`` run a tool before the reply; the reply text comes from
``[FAST n]``, else ``[SLOW]``, else ``[IMAGES]``/``[ECHO]``/``[RECALL]`` (one
line each, in that order), else the default.

``(none)``
    Deltas ``"Hello"``, ``" from the"``, ``" scripted kernel."``; the final
    repeat is ``"Hello from the scripted kernel."``.
``[THINK]``
    Two ``iac_code.thinking`` (``raw_thinking``) frames before the text.
``[TOOL]``
    Text ``"I will read the file."``, then a ``read_file`` trace for
    ``notes.md`` in the cwd (``started``, two ``input_delta``,
    ``input_complete``, usage), an ``artifactUpdate`` and the ``completed``
    tool status with ``result`` and ``artifact``, then the reply (``"Done."``
    unless another directive supplies one). ``notes.md`` is read if it exists,
    otherwise a built-in sample stands in (nothing is written).
``[PROGRESS]``
    Like ``[TOOL]`` with two MCP ``progress`` tool frames before completion.
``[WRITE]``
    A ``write_file`` permission wait (capture 02): the stream ends in
    INPUT_REQUIRED with ``iac_code.input`` and ``iac_code.permission``. Answer
    with the six-key permission data part (``allow_once`` writes ``hello.txt``
    into the cwd; ``deny`` writes nothing); ``SendMessage`` works as well.
``[ASK]``
    An ``ask_user_question`` wait ("Which region should host the site?",
    options ``hz``/``cn-hangzhou`` and ``sh``/``cn-shanghai``, free text
    allowed). Answer with a text message carrying the task's ``taskId``; a
    label or id selects the option, anything else is free text.
``[SLOW]``
    Ten text deltas, one per second x ``delay_scale``.
``[SILENT n]``
    After the WORKING frame, no frame for ``n`` x ``delay_scale`` seconds
    (keep-alive comments still flow), then the rest of the script.
``[FAIL]``
    LLM failure (capture 23): FAILED with ``iac_code.error``, then a zero
    usage frame, ``assistantFinal`` without message, INPUT_REQUIRED.
``[IMAGES]``
    Reply ``Received N image(s): <mediaType list>`` counting image parts of
    shape ``{"data":{"filename","bytes"},"mediaType":"image/..."}`` or
    ``{"raw":...,"mediaType":"image/..."}``. Image data is validated on every
    turn: bad base64 fails the task at once.
``[ECHO]``
    Reply with three lines: the user text without directives;
    ``iac_code keys: <sorted, comma separated>``; ``iac_code values: <JSON>``
    where any key containing ``key``, ``secret``, ``token``, ``password`` or
    ``authorization`` is left out (at any depth).
``[RECALL]``
    Reply ``This context has seen N user turns.`` (this turn included).
``[FAST n]``
    ``n`` deltas ``"x"`` sent as fast as possible (one pre-serialised frame,
    256 frames per write), then usage / final (``"x" * n``) / INPUT_REQUIRED.

Pipeline mode
-------------
A new turn whose metadata has ``iac_code.run_mode == "pipeline"`` runs a
scripted pipeline instead (``pipeline_name`` ``selling`` - the default, also
for ``""`` - or ``selling_solution_first``, which differs only in its name;
any other name is -32602; ``candidatePresentation: "rich-v1"`` adds
``summary``, ``architectureDiagram``, ``totalMonthlyCost`` and ``costItems``
to candidate options). The normal directives above are ignored there.

Every pipeline event is an envelope ``{schemaVersion:"1.0", extensionUri:
"urn:iac-code:a2a:pipeline-events:v1", eventId:"evt-<32hex>", sequence,
createdAt, eventType, scope, pipelineRunId (= contextId), taskId, contextId,
pipelineName, status, data, iacCodeSessionId, step?, candidate?,
candidateStep?, input?, visibility?}``. Live, one statusUpdate carries one
envelope as ``iac_code.pipeline`` (numbers as floats), or a burst of them as
``iac_code.pipelineBatch {schemaVersion, extensionUri, events}``; the task
state follows the (last) envelope's status: working -> WORKING,
input_required -> INPUT_REQUIRED, completed -> COMPLETED, failed -> FAILED.
As in captures 33/34/38, a pipeline turn sends the ``task`` frame and then
``pipeline_started`` (no plain SUBMITTED/WORKING frames), answer streams start
with the first envelope (no ``task`` frame), and pipeline frames carry the
session id only inside the envelope. Sequences are per pipelineRunId and go
on across pipelines of one context.

Every envelope is also journaled (integers, as the REST endpoint shows them).
``GET /iac-code/pipeline/state?taskId=`` (or ``contextId=``, the context's
latest pipeline) returns ``{"snapshot": {...}, "events": []}``;
``afterSequence=N&includeSnapshot=false`` returns ``{"fromSequence": N,
"lastSequence": M, "events": [journal envelopes with sequence > N]}``;
``afterSequence=N`` alone returns the snapshot and those events; ``lean=1``
leaves ``display.toolResults`` out of the snapshot. No ids: 400; a bad
``afterSequence``: 400; not a pipeline task: 404 ``{"error": "A2A pipeline
state not found"}``.

The default run: ``pipeline_started`` (data totalSteps, stepNames, userRequest,
pipelineType), then for each of ``intent_parsing``, ``architecture_planning``,
``evaluate_candidates``, ``confirm_and_select``, ``deploying``:
``step_started``, ``context_usage``, ``message_started``, ``text_delta``
(``"Working on <step>."``), ``tool_started`` (``complete_step``), a batch
[``usage``, ``context_usage``], ``tool_result``, ``step_completed``. The end
repeats capture 38: ``pipeline_completed`` and ``pipeline_handoff_ready``
(visibility ``pending_backup``) exist only in the journal (n, n+1); live come
``pipeline_completed`` n+2, ``backup_committed`` n+4, ``pipeline_handoff_ready``
n+3, ``backup_committed`` n+5 (visibility ``committed``, state COMPLETED), and
the stream closes. The context is then back in normal chat: a later turn
without ``run_mode: pipeline`` is a normal turn; the pipeline task is terminal.

Pipeline directives (combine freely):

``[PIPE-ASK]``
    intent_parsing asks: ``tool_started`` (ask_user_question), batch
    [usage, context_usage], then ``input_required`` (data and ``input`` as in
    capture 34) in the INPUT_REQUIRED statusUpdate that also carries
    ``iac_code.input {schemaVersion:1.0, kind:"ask_user_question", required,
    requestTaskId, contextId, inputId:"ask-<toolUseId>", toolUseId, prompt,
    allowFreeText:true, options:[hz/cn-hangzhou, sh/cn-shanghai]}``; the stream
    closes. Answer: a text message with the task's ``taskId`` (label or id
    selects an option, anything else is free text) -> ``input_received`` (data
    kind, inputId, toolUseId, question, options, allowFreeText, selectedId,
    selectedLabel, freeText, freeTextLength, answerTextLength), then the step
    goes on.
``[PIPE-CANDIDATES]``
    evaluate_candidates runs candidates ``c1`` (Plan A) and ``c2`` (Plan B):
    ``candidate_started`` x2, ``candidate_step_started`` x2,
    ``message_started`` x2, ``text_delta`` c1, c2, then a batch c1, c2 (scope
    ``candidate`` with ``candidate {id, runId, subPipelineId}`` and
    ``candidateStep {id:"price_estimation", runId}``),
    ``candidate_step_completed`` x2, ``candidate_completed`` x2.
    confirm_and_select then waits for ``candidate_selection`` (inputId
    ``select-<toolUseId>``, options c1/c2, no free text; answer the label or
    id -> ``input_received`` + ``candidate_selected``) and deploying for
    ``deployment_confirmation`` (inputId ``confirm-<toolUseId>``, options
    ``confirm``/``Confirm`` and ``cancel``/``Cancel``; cancel ends the
    pipeline with ``earlyExit: true`` and outcome ``early_exit``). Text that
    matches no option is -32602.
``[PIPE-PERMS]``
    evaluate_candidates runs the candidates (as above, without the later
    waits unless ``[PIPE-CANDIDATES]`` is given too) and each asks for a
    ``describe_prices`` permission: ``tool_started`` per candidate, then one
    INPUT_REQUIRED statusUpdate with a batch of two ``permission_requested``
    envelopes, ``iac_code.input`` (the first), ``iac_code.permission`` and
    ``iac_code.pendingPermissions: [env1, env2]`` (capture 02 envelopes plus
    ``scope:"candidate"`` and ``subPipelineId``). Answer each with the six-key
    permission data part (``SendMessage`` or ``SendStreamingMessage``). The
    first answer is acknowledged in place (WORKING with ``inputReceived
    {toolUseId, kind, inputId, decision}`` and a ``permission_resolved``
    envelope, then INPUT_REQUIRED listing the remaining wait; unary returns
    that task). The last answer gets the same acknowledgement and the pipeline
    continues: a streaming answer carries the continuation; a unary one
    returns the (WORKING) task at once and the continuation waits up to
    ``PIPELINE_SUBSCRIBE_GRACE`` seconds for a ``SubscribeToTask`` (first the
    current Task, then the live updates until the turn ends). Candidate
    ``tool_result`` is an error for ``deny``.
``[PIPE-RESOURCE]``
    architecture_planning waits for ``cloud_resource_selection``
    (``iac_code.input`` and the same envelope as ``iac_code.inputRequired``:
    inputId ``resource-<toolUseId>``, prompt, ``selector {selectorId:"vpc",
    options:[{value:"vpc-1", label:"default VPC"}]}``). Answer with any text
    part and ``iac_code.inputResponse {schemaVersion:1, kind, status:
    "selected"|"canceled", requestTaskId, contextId, inputId, toolUseId,
    selectorId, value, label?, source?, optionsEmpty?}`` (``message.taskId``
    optional) -> ``input_received`` (kind, inputId, toolUseId, selectorId,
    status, value, label). Wrong keys/values, an unknown value or a plain text
    answer: -32602.
``[PIPE-FAIL]``
    architecture_planning fails (capture 33): ``step_failed`` (FAILED), then
    ``pipeline_error``, and the end pattern with ``pipeline_failed`` (data
    totalSteps, failed) and a handoff with outcome ``failed`` - five more
    FAILED frames after the first before the stream closes.
``[PIPE-OOO]``
    In architecture_planning the usage pair goes out reversed (n+1, then n) as
    two frames, and the step's ``tool_result`` (n+2) exists only in the journal.
``[PIPE-SLOW]``
    0.5 s x ``delay_scale`` between steps.

Answers to pipeline waits: a permission answer that names no pending wait is
-32602 ``permission_resume_invalid: pending permission is not active.``
(capture 18); an ``inputResponse`` for no pending wait is -32602
``input_resume_invalid: pending input is not active.``; text for a permission
wait is -32602.
``CancelTask`` on a running pipeline adds a ``pipeline_canceled`` envelope to
the CANCELED frame. All pipeline state lives in :class:`KernelState`, so a
restarted adapter can read the snapshot and answer the same waits.

Context and task rules follow the real kernel: a context maps to one session
id and is bound to its first cwd; a relative cwd fails the task with
``Invalid A2A workspace metadata.``; a new turn while another task of the
context is running fails with ``Task is already working.``; a normal turn ends
in INPUT_REQUIRED without ``iac_code.input``. The script of a task runs in a
worker thread and is broadcast to every stream attached to the task, so a
client that goes away does not stop the task (as with the real kernel), and
``CancelTask`` from another request closes the live streams.

Scripted choices where the captures say nothing
-----------------------------------------------
* The final repeat (``<taskId>-2``) holds the text of the *last* LLM call of
  the turn (after a tool, only the text that followed it), as in capture 04.
* A text message whose ``taskId`` names an idle INPUT_REQUIRED task without a
  pending input continues that task (no ``task`` frame, WORKING first).
  Addressing a running task, a terminal task, or a pending permission with
  anything but a permission answer is a -32602 error.
* A permission answer may also come as the text transport
  ``IAC_CODE_PERMISSION:{...}`` (six keys + ``contextId``; ``taskId`` optional).
* ``executionControl`` is synthesised; ``blockers`` follows captures 05/14/31/49
  (capture 03 shows ``[]`` for a streamed wait instead).
* Only English and Chinese permission texts exist; other supported languages
  report their code in ``language`` but keep the English texts.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import functools
import hashlib
import hmac
import json
import os
import queue
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

__all__ = [
    "A2A_VERSION",
    "Directives",
    "KernelState",
    "RpcError",
    "ScriptedKernel",
    "ScriptedKernelApp",
    "create_app",
]

A2A_VERSION = "1.0"
KERNEL_VERSION = "scripted"

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
COMPLETED = "TASK_STATE_COMPLETED"
REJECTED = "TASK_STATE_REJECTED"
TERMINAL_STATES = frozenset({FAILED, CANCELED, COMPLETED, REJECTED})

#: Frames joined into one write for bulk ([FAST]) and drained streams.
FRAMES_PER_WRITE = 256
#: Request-log entries kept (oldest dropped first) so benchmarks cannot grow it forever.
MAX_LOGGED_REQUESTS = 50_000

_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_SUPPORTED_LANGUAGES = frozenset({"en", "zh", "es", "fr", "de", "ja", "pt"})
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
CANCEL_TEXT = "Task canceled."
BUSY_TEXT = "Task is already working."
BAD_CWD_TEXT = "Invalid A2A workspace metadata."
OTHER_CWD_TEXT = "ValueError: A2A context belongs to a different workspace"
PERMISSION_NOT_ACTIVE = "permission_resume_invalid: pending permission is not active."
PERMISSION_FIELDS_MISMATCH = "Permission response payload fields do not match schemaVersion 1."
PERMISSION_TEXT_PREFIX = "IAC_CODE_PERMISSION:"
PERMISSION_KEYS = frozenset({"schemaVersion", "kind", "requestTaskId", "inputId", "toolUseId", "decision"})
PERMISSION_DECISIONS = frozenset({"allow_once", "deny"})

WRITE_PATH = "hello.txt"
WRITE_CONTENT = "hello from scripted kernel\n"
READ_PATH = "notes.md"
READ_SAMPLE = b"# Notes\n\nSample file served by the scripted kernel.\n"
ASK_PROMPT = "Which region should host the site?"
ASK_OPTIONS = (
    {"id": "hz", "label": "cn-hangzhou"},
    {"id": "sh", "label": "cn-shanghai"},
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

# Texts the real kernel localises (taken from captures 02 and 17); other
# supported languages keep the English texts but report their language code.
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

_CLOSE = object()  # end-of-stream sentinel put on subscriber queues
_ACK = object()  # "answer acknowledged": unary SendMessage returns; streams ignore it
_UTC = timezone.utc  # noqa: UP017 - datetime.UTC needs Python 3.11; we support 3.10


# --------------------------------------------------------------------------- helpers


def _dumps(obj: Any) -> str:
    """Compact JSON as the real kernel writes it (non-ASCII kept as is)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _now_iso() -> str:
    return datetime.now(_UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _struct(value: Any) -> Any:
    """Mimic a protobuf ``Struct`` round trip: every number becomes a float."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: _struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_struct(v) for v in value]
    return value


def _hex(n: int = 12) -> str:
    return uuid.uuid4().hex[:n]


def _split_text(text: str, pieces: int = 3) -> list[str]:
    """Split ``text`` into up to ``pieces`` deltas on word boundaries (lossless)."""
    tokens = re.findall(r"\s*\S+|\s+$", text) or [text]
    size = -(-len(tokens) // pieces)
    return ["".join(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _redact(v) for k, v in value.items() if not any(word in str(k).lower() for word in _SENSITIVE_WORDS)}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _language(iac: dict[str, Any]) -> str:
    raw = iac.get("preferredLanguage", iac.get("preferred_language"))
    if isinstance(raw, str):
        code = raw.strip().lower().replace("_", "-").split("-")[0]
        if code in _SUPPORTED_LANGUAGES:
            return code
    return "en"


def _type_name(value: Any) -> str:
    return {
        str: "str",
        bool: "bool",
        int: "int",
        float: "float",
        list: "list",
        dict: "dict",
    }.get(type(value), "str")


def _echo_part(part: dict[str, Any]) -> dict[str, Any]:
    """A user part as the kernel stores it: proto field order, Struct numbers."""
    out: dict[str, Any] = {}
    for key in ("text", "raw", "url", "data", "metadata", "filename", "mediaType"):
        if key in part and part[key] is not None:
            out[key] = _struct(part[key]) if key in ("data", "metadata") else part[key]
    return out


def _echo_message(msg: dict[str, Any], task_id: str, context_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messageId": msg["messageId"],
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_USER",
        "parts": [_echo_part(p) for p in msg["parts"]],
    }
    if isinstance(msg.get("metadata"), dict):
        out["metadata"] = _struct(msg["metadata"])
    for key in ("extensions", "referenceTaskIds"):
        if msg.get(key):
            out[key] = msg[key]
    return out


def _decode_base64(payload: Any) -> bytes | None:
    if not isinstance(payload, str):
        return None
    text = "".join(payload.split())
    if not text or not re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", text):
        return None
    text = text.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _inspect_images(parts: list[dict[str, Any]]) -> tuple[list[str], str | None]:
    """Media types of the image parts, or an error text when one does not decode."""
    media_types: list[str] = []
    for part in parts:
        media_type = part.get("mediaType")
        if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
            continue
        data = part.get("data")
        if isinstance(data, dict) and "bytes" in data and "filename" in data:
            payload = data.get("bytes")
        elif "raw" in part:
            payload = part.get("raw")
        else:
            continue
        if not _decode_base64(payload):
            return (
                media_types,
                "ValueError: Invalid image part: data is not valid base64.",
            )
        media_types.append(media_type)
    return media_types, None


def _artifact_for(path: str, data: bytes, media_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(artifact for the artifactUpdate frame, ``artifact`` of the tool status)."""
    artifact_id = str(uuid.uuid4())
    filename = os.path.basename(path)
    uri = f"iac-code-artifact://{artifact_id}/{filename}"
    digest = hashlib.sha256(data).hexdigest()
    meta = {
        "uri": uri,
        "byteSize": float(len(data)),
        "sha256": digest,
        "sourcePath": path,
        "mediaType": media_type,
    }
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
    tool_artifact = {
        "uri": uri,
        "byteSize": float(len(data)),
        "sha256": digest,
        "sourcePath": path,
        "artifactId": artifact_id,
        "mediaType": media_type,
        "filename": filename,
    }
    return artifact, tool_artifact


# --------------------------------------------------------------------------- errors


class RpcError(Exception):
    """A JSON-RPC error in the a2a-sdk shape (``data`` is a google.rpc.ErrorInfo list)."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason

    def to_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason:
            error["data"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }
            ]
        return error


def _task_not_found(message: str = "Task not found") -> RpcError:
    return RpcError(-32001, message, "TASK_NOT_FOUND")


def _not_cancelable() -> RpcError:
    return RpcError(-32002, "Task cannot be canceled", "TASK_NOT_CANCELABLE")


def _invalid_params(message: str) -> RpcError:
    return RpcError(-32602, message, "INVALID_PARAMS")


def _version_not_supported(version: str | None) -> RpcError:
    seen = version if version else "0.3"
    return RpcError(
        -32009,
        f"A2A version '{seen}' is not supported by this handler. Expected version '{A2A_VERSION}'.",
        "VERSION_NOT_SUPPORTED",
    )


class _Canceled(Exception):
    """Raised inside a script when its task was canceled (or the kernel stops)."""


# --------------------------------------------------------------------------- directives


_DIRECTIVE_RE = re.compile(
    r"\[(?P<flag>THINK|TOOL|PROGRESS|WRITE|ASK|SLOW|FAIL|IMAGES|ECHO|RECALL"
    r"|PIPE-(?:ASK|CANDIDATES|PERMS|RESOURCE|FAIL|OOO|SLOW))\]"
    r"|\[(?P<arg>SILENT|FAST)\s+(?P<num>\d+(?:\.\d*)?|\.\d+)\]"
)


@dataclass(frozen=True)
class Directives:
    """The script choices found in a turn's text (see the module docstring)."""

    flags: frozenset[str] = frozenset()
    silent: float | None = None
    fast: int | None = None
    rest: str = ""

    @classmethod
    def parse(cls, text: str) -> Directives:
        flags: set[str] = set()
        silent: float | None = None
        fast: int | None = None
        for match in _DIRECTIVE_RE.finditer(text):
            if match.group("flag"):
                flags.add(match.group("flag"))
            elif match.group("arg") == "SILENT":
                silent = float(match.group("num"))
            else:
                fast = int(float(match.group("num")))
        rest = re.sub(r"[ \t]{2,}", " ", _DIRECTIVE_RE.sub("", text)).strip()
        return cls(frozenset(flags), silent, fast, rest)

    def __contains__(self, flag: str) -> bool:
        return flag in self.flags


# --------------------------------------------------------------------------- state


@dataclass
class _Context:
    context_id: str
    session_id: str
    cwd: str | None = None
    turns: int = 0
    running_task_id: str | None = None


@dataclass
class _Pending:
    kind: str  # "permission" | "ask_user_question"
    input_id: str
    tool_use_id: str
    envelope: dict[str, Any]
    permission: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Task:
    id: str
    context_id: str
    session_id: str | None
    status: dict[str, Any]
    seq: int
    cwd: str = ""
    language: str = "en"
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    pending: _Pending | None = None
    running: bool = False
    canceled: bool = False
    subscribers: list[queue.SimpleQueue[Any]] = field(default_factory=list)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    attached: threading.Event = field(default_factory=threading.Event)  # set by SubscribeToTask
    execution_id: str = field(default_factory=lambda: "exec-" + uuid.uuid4().hex)


@dataclass(frozen=True)
class _Turn:
    directives: Directives
    iac: dict[str, Any]
    image_types: tuple[str, ...]
    turns: int
    pipeline: _Pipeline | None = None


class KernelState:
    """All mutable kernel state, guarded by one short lock.

    The lock is never held while sleeping, writing to a socket or touching the
    file system; subscriber queues are unbounded so publishing never blocks.
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        delay_scale: float = 1.0,
        keepalive_seconds: float = 15.0,
        default_cwd: str | None = None,
    ) -> None:
        self.token = token or None
        self.delay_scale = max(0.0, float(delay_scale))
        self.keepalive_seconds = float(keepalive_seconds)
        self.instance_id = "instance-" + uuid.uuid4().hex
        self.lock = threading.Lock()
        self.contexts: dict[str, _Context] = {}
        self.tasks: dict[str, _Task] = {}
        self.pipelines: dict[str, _Pipeline] = {}  # by taskId
        self.context_pipelines: dict[str, str] = {}  # contextId -> taskId of its latest pipeline
        self.pipeline_sequences: dict[str, int] = {}  # contextId (= pipelineRunId) -> last sequence
        self._requests: list[dict[str, Any]] = []
        self._seq = 0
        self._default_cwd = default_cwd
        self.closing = False
        # Test knob: sessions whose backup is still "synchronizing" (ensure-restored answers 409).
        self.backup_not_ready: set[str] = set()

    # ----------------------------------------------------------- request log

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of the JSON-RPC request log."""
        with self.lock:
            return list(self._requests)

    def log_request(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self._requests.append(entry)
            if len(self._requests) > MAX_LOGGED_REQUESTS:
                del self._requests[: len(self._requests) - MAX_LOGGED_REQUESTS]

    def reset_requests(self) -> None:
        with self.lock:
            self._requests.clear()

    # ----------------------------------------------------------- extension points

    def pipeline_snapshot(
        self, task_id: str | None, context_id: str | None, args: dict[str, str]
    ) -> dict[str, Any] | None:
        """Body of ``GET /iac-code/pipeline/state``; ``None`` means 404 (not a pipeline task).

        Raises ``ValueError`` (HTTP 400) for a malformed ``afterSequence``.
        """
        raw_after = args.get("afterSequence")
        after: int | None = None
        if raw_after not in (None, ""):
            try:
                number = float(str(raw_after))  # "7" and "7.0" (a live sequence) alike
            except ValueError:
                number = -1.0
            after = int(number) if number.is_integer() else -1
            if after < 0:
                raise ValueError("afterSequence must be a non-negative integer.")
        include = str(args.get("includeSnapshot", "true")).strip().lower() not in ("false", "0", "no")
        lean = str(args.get("lean", "")).strip().lower() in ("1", "true", "yes")
        with self.lock:
            pipe: _Pipeline | None = None
            if task_id is not None:
                pipe = self.pipelines.get(task_id)
                if pipe is not None and context_id is not None and pipe.context_id != context_id:
                    pipe = None
            elif context_id is not None:
                pipe = self.pipelines.get(self.context_pipelines.get(context_id, ""))
            if pipe is None:
                return None
            events = [e for e in pipe.journal if e["sequence"] > (after or 0)]
            last = pipe.seq
            if not include:
                return {"fromSequence": after or 0, "lastSequence": last, "events": events}
            body: dict[str, Any] = {"snapshot": pipe.snapshot(lean=lean)}
            if after is None:
                body["events"] = []
            else:
                body.update({"fromSequence": after, "lastSequence": last, "events": events})
            return body

    def pipeline_event_locked(
        self,
        pipe: _Pipeline,
        event_type: str,
        data: dict[str, Any] | None = None,
        *,
        status: str = "working",
        step: dict[str, Any] | None = None,
        candidate: dict[str, Any] | None = None,
        candidate_step: dict[str, Any] | None = None,
        visibility: str | None = None,
        input_: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create one pipeline envelope, journal it and project it into the snapshot."""
        pipe.seq = self.pipeline_sequences.get(pipe.context_id, 0) + 1
        self.pipeline_sequences[pipe.context_id] = pipe.seq
        scope = "candidate" if candidate is not None else "step" if step is not None else "pipeline"
        envelope: dict[str, Any] = {
            "schemaVersion": "1.0",
            "extensionUri": PIPELINE_EXTENSION_URI,
            "eventId": "evt-" + uuid.uuid4().hex,
            "sequence": pipe.seq,
            "createdAt": datetime.now(_UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "eventType": event_type,
            "scope": scope,
            "pipelineRunId": pipe.context_id,
            "taskId": pipe.task_id,
            "contextId": pipe.context_id,
            "pipelineName": pipe.name,
            "status": status,
            "data": data if data is not None else {},
            "iacCodeSessionId": pipe.session_id,
        }
        for key, value in (
            ("step", step),
            ("candidate", candidate),
            ("candidateStep", candidate_step),
            ("input", input_),
            ("visibility", visibility),
        ):
            if value is not None:
                envelope[key] = value
        pipe.journal.append(envelope)
        pipe.apply(envelope)
        return envelope

    def signal(self, task: _Task, item: object) -> None:
        """Put a sentinel (``_ACK``) on every stream attached to the task."""
        with self.lock:
            for subscriber in task.subscribers:
                subscriber.put(item)

    def default_cwd(self) -> str:
        """Workspace for turns that never sent a cwd (created lazily, outside the repo)."""
        if self._default_cwd is None:
            self._default_cwd = tempfile.mkdtemp(prefix="scripted-kernel-")
        return self._default_cwd

    # ----------------------------------------------------------- tasks (lock held)

    def new_task_locked(self, context_id: str, session_id: str | None) -> _Task:
        self._seq += 1
        task = _Task(
            id=str(uuid.uuid4()),
            context_id=context_id,
            session_id=session_id,
            status={"state": SUBMITTED},
            seq=self._seq,
        )
        self.tasks[task.id] = task
        return task

    def execution_control_locked(self, task: _Task) -> dict[str, Any]:
        running = task.running
        status = {
            SUBMITTED: "working",
            WORKING: "working",
            INPUT_REQUIRED: "input-required",
            FAILED: "failed",
            CANCELED: "canceled",
            COMPLETED: "completed",
        }.get(task.status["state"], "working")
        # As observed: a live run holds execution + llm; an idle task keeps its
        # execution slot (captures 05, 14, 31, 49); a failed one holds nothing.
        if running:
            blockers = [
                {"kind": "execution", "count": 1.0},
                {"kind": "llm", "count": 1.0},
            ]
        elif task.status["state"] == FAILED:
            blockers = []
        else:
            blockers = [{"kind": "execution", "count": 1.0}]
        return {
            "releaseReady": False,
            "pauseReason": None,
            "blockers": blockers,
            "streamAvailable": bool(blockers),
            "executionId": task.execution_id,
            "commitError": None,
            "taskId": task.id,
            "pauseId": None,
            "persistedRevision": 0.0,
            "executionStatus": status,
            "backup": {"status": "not_requested"},
            "terminationReason": None,
            "contextId": task.context_id,
            "externalOperations": [],
            "phase": "running",
            "pauseComplete": False,
            "connectionEpoch": -1.0,
            "serverInstanceId": self.instance_id,
            "expiresAt": None,
            "revision": 0.0,
        }

    def snapshot_locked(self, task: _Task, history_length: int | None = None) -> dict[str, Any]:
        """The Task object as GetTask / CancelTask / SubscribeToTask return it."""
        snap: dict[str, Any] = {
            "id": task.id,
            "contextId": task.context_id,
            "status": task.status,
        }
        if task.artifacts:
            snap["artifacts"] = list(task.artifacts)
        history = task.history
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        if history:
            snap["history"] = list(history)
        iac: dict[str, Any] = {}
        pipe = self.pipelines.get(task.id)
        if pipe is not None and pipe.waits:
            iac.update(_wait_iac(pipe.waits))
        elif task.pending is not None:
            iac["input"] = task.pending.envelope
            if task.pending.permission is not None:
                iac["permission"] = task.pending.permission
        if task.session_id:
            iac["iacCodeSessionId"] = task.session_id
        iac["executionControl"] = self.execution_control_locked(task)
        snap["metadata"] = {"iac_code": iac}
        return snap

    def _apply_status_locked(self, task: _Task, status: dict[str, Any], repeat: int) -> None:
        # Like a2a-sdk's task manager: the replaced status message moves to history.
        previous = task.status.get("message")
        if previous is not None:
            task.history.append(previous)
        message = status.get("message")
        if message is not None and repeat > 1:
            task.history.extend([message] * (repeat - 1))
        task.status = status

    def finish_locked(self, task: _Task) -> None:
        task.running = False
        ctx = self.contexts.get(task.context_id)
        if ctx is not None and ctx.running_task_id == task.id:
            ctx.running_task_id = None
        for subscriber in task.subscribers:
            subscriber.put(_CLOSE)
        task.subscribers.clear()

    def publish(
        self,
        task: _Task,
        result: dict[str, Any],
        *,
        status: dict[str, Any] | None = None,
        repeat: int = 1,
        artifact: dict[str, Any] | None = None,
        pending: _Pending | None = None,
        close: bool = False,
    ) -> None:
        """Apply one event to the task and broadcast it to the attached streams."""
        with self.lock:
            if task.canceled:
                raise _Canceled()
            if status is not None:
                self._apply_status_locked(task, status, repeat)
            if artifact is not None:
                task.artifacts.append(artifact)
            if pending is not None:
                task.pending = pending
            item = (result, repeat)
            for subscriber in task.subscribers:
                subscriber.put(item)
            if close:
                self.finish_locked(task)

    def finish(self, task: _Task) -> None:
        with self.lock:
            if task.running:
                self.finish_locked(task)

    def unsubscribe(self, task: _Task, subscriber: queue.SimpleQueue[Any]) -> None:
        with self.lock:
            try:
                task.subscribers.remove(subscriber)
            except ValueError:
                pass

    def cancel(self, task_id: str) -> dict[str, Any]:
        """CancelTask: CANCELED goes to the live streams, which then close."""
        with self.lock:
            task = self.tasks.get(task_id)
            if task is None:
                raise _task_not_found()
            if not task.running:
                raise _not_cancelable()
            task.canceled = True
            pipe = self.pipelines.get(task.id)
            canceled_event: dict[str, Any] | None = None
            if pipe is not None:
                pipe.waits.clear()
                canceled_event = self.pipeline_event_locked(
                    pipe, "pipeline_canceled", {"reason": CANCEL_TEXT}, status="canceled"
                )
            status = {
                "state": CANCELED,
                "message": {
                    "messageId": f"{task.id}-5",
                    "contextId": task.context_id,
                    "taskId": task.id,
                    "role": "ROLE_AGENT",
                    "parts": [{"text": CANCEL_TEXT}],
                },
                "timestamp": _now_iso(),
            }
            update: dict[str, Any] = {
                "taskId": task.id,
                "contextId": task.context_id,
                "status": status,
            }
            if task.session_id:
                update["metadata"] = {"iac_code": {"iacCodeSessionId": task.session_id}}
            if canceled_event is not None:
                update["metadata"] = {"iac_code": {"pipeline": _struct(canceled_event)}}
            self._apply_status_locked(task, status, 1)
            for subscriber in task.subscribers:
                subscriber.put(({"statusUpdate": update}, 1))
            self.finish_locked(task)
            snapshot = self.snapshot_locked(task)
        task.cancel_event.set()
        return snapshot

    def shutdown(self) -> None:
        """Stop every running script and close every open stream."""
        with self.lock:
            self.closing = True
            for task in self.tasks.values():
                if task.running:
                    task.canceled = True
                    task.cancel_event.set()
                    self.finish_locked(task)


# --------------------------------------------------------------------------- a run


class _Run:
    """Frame builders for one run of a task's script (one worker thread)."""

    def __init__(self, state: KernelState, task: _Task) -> None:
        self.state = state
        self.task = task
        self.tid = task.id
        self.cid = task.context_id
        self.sid = task.session_id
        self.segment: list[str] = []  # text of the current LLM call

    def sleep(self, seconds: float) -> None:
        delay = seconds * self.state.delay_scale
        canceled = self.task.cancel_event.wait(delay) if delay > 0 else self.task.cancel_event.is_set()
        if canceled:
            raise _Canceled()

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
        pending: _Pending | None = None,
        close: bool = False,
    ) -> None:
        status: dict[str, Any] = {"state": state}
        if message is not None:
            status["message"] = message
        if timestamp:
            status["timestamp"] = _now_iso()
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

    def delta(self, text: str) -> None:
        self.segment.append(text)
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
        message = self.message("x", f"{self.tid}-message")
        self.status(WORKING, message=message, metadata=self.meta(), repeat=count)

    def thinking(self, text: str) -> None:
        self.status(
            WORKING,
            metadata=self.meta(after={"thinking": {"text": text, "type": "raw_thinking"}}),
        )

    def tool(self, payload: dict[str, Any]) -> None:
        self.status(WORKING, metadata=self.meta(before={"tool": payload}))

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

    def interrupt(self, pending: _Pending) -> None:
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
            args = _dumps(tool_input)
            cut = len(args) // 2
            for length in (cut, len(args) - cut):
                self.tool(
                    {
                        "toolUseId": tool_use_id,
                        "partialJsonLength": float(length),
                        "status": "input_delta",
                    }
                )
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
                "toolInput": _struct(tool_input),
            }
        )


# --------------------------------------------------------------------------- pipelines

PIPELINE_EXTENSION_URI = "urn:iac-code:a2a:pipeline-events:v1"
PIPELINE_NAMES = ("selling", "selling_solution_first")
PIPELINE_STEPS = (
    "intent_parsing",
    "architecture_planning",
    "evaluate_candidates",
    "confirm_and_select",
    "deploying",
)
PIPELINE_FIELDS = {
    "intent_parsing": "intent",
    "architecture_planning": "architecture",
    "evaluate_candidates": "evaluated_candidates",
    "confirm_and_select": "selected_plan",
    "deploying": "deployment",
}
PIPELINE_CONCLUSIONS: dict[str, dict[str, Any]] = {
    "intent_parsing": {
        "is_infra_intent": True,
        "confidence": "high",
        "category": "website",
        "user_message_summary": "small website",
    },
    "architecture_planning": {"summary": "A small web tier on Alibaba Cloud.", "region": "cn-hangzhou"},
    "evaluate_candidates": {"candidateIds": []},
    "confirm_and_select": {"candidateId": None},
    "deploying": {"deployed": True},
}
#: Seconds a pipeline resumed by a unary SendMessage waits for a SubscribeToTask (unscaled).
PIPELINE_SUBSCRIBE_GRACE = 2.0
SELECT_PROMPT = "Which plan should be deployed?"
CONFIRM_PROMPT = "Deploy the selected plan now?"
CONFIRM_OPTIONS = ({"id": "confirm", "label": "Confirm"}, {"id": "cancel", "label": "Cancel"})
RESOURCE_PROMPT = "Which VPC should host the site?"
RESOURCE_SELECTOR = {"selectorId": "vpc", "options": [{"value": "vpc-1", "label": "default VPC"}]}
STEP_FAIL_TEXT = "No conclusion extracted"
INPUT_NOT_ACTIVE = "input_resume_invalid: pending input is not active."
INPUT_RESPONSE_MISMATCH = "Input response payload fields do not match schemaVersion 1."
NO_OPTION_TEXT = "The answer does not match any option."
INPUT_RESPONSE_KEYS = frozenset(
    {"schemaVersion", "kind", "status", "requestTaskId", "contextId", "inputId", "toolUseId", "selectorId", "value"}
)
INPUT_RESPONSE_OPTIONAL = frozenset({"label", "source", "optionsEmpty"})
CANDIDATES: tuple[dict[str, Any], ...] = (
    {
        "id": "c1",
        "label": "Plan A",
        "summary": "One ECS instance behind an SLB.",
        "architectureDiagram": "flowchart LR\n  user --> slb --> ecs",
        "totalMonthlyCost": 42.5,
        "costItems": [
            {"name": "ECS ecs.t6-c1m1.large", "monthlyCost": 30.0},
            {"name": "SLB", "monthlyCost": 12.5},
        ],
    },
    {
        "id": "c2",
        "label": "Plan B",
        "summary": "A static site on OSS behind CDN.",
        "architectureDiagram": "flowchart LR\n  user --> cdn --> oss",
        "totalMonthlyCost": 8.0,
        "costItems": [
            {"name": "OSS standard storage", "monthlyCost": 2.0},
            {"name": "CDN traffic", "monthlyCost": 6.0},
        ],
    },
)
_PIPE_STATES = {
    "working": WORKING,
    "input_required": INPUT_REQUIRED,
    "completed": COMPLETED,
    "failed": FAILED,
    "canceled": CANCELED,
}
_PIPE_USAGE = {
    "cachedInputTokens": 0,
    "provider": "openai",
    "model": "other",
    "inputTokens": 11,
    "outputTokens": 7,
    "totalTokens": 18,
}


def _context_usage(messages: int) -> dict[str, Any]:
    user, assistant = 13 * messages, 9 * messages
    total = 4871 + 1237 + user + assistant
    return {
        "contextWindow": 128000,
        "assistantMessageTokens": assistant,
        "toolResultTokens": 0,
        "messageCount": messages,
        "totalTokens": total,
        "userMessageTokens": user,
        "systemPromptTokens": 4871,
        "toolDefinitionTokens": 1237,
        "usagePercent": total / 1280,
    }


def _handoff_summary(name: str, outcome: str) -> str:
    return (
        "[Pipeline Handoff Context]\n"
        "This is injected context for the assistant, not a user request.\n"
        f"Pipeline: {name}\nOutcome: {outcome}\n\n"
        "Use this context when answering follow-up questions after the pipeline handoff."
    )


def _wait_iac(waits: list[_Pending]) -> dict[str, Any]:
    """The ``iac_code`` keys that describe the pending waits of a pipeline task."""
    first = waits[0]
    iac: dict[str, Any] = {"input": first.envelope}
    if first.permission is not None:
        iac["permission"] = first.permission
    permissions = [w.envelope for w in waits if w.kind == "permission"]
    if permissions:
        iac["pendingPermissions"] = permissions
    if first.kind == "cloud_resource_selection":
        iac["inputRequired"] = first.envelope
    return iac


def _match_option(options: list[dict[str, Any]], answer: str) -> dict[str, Any] | None:
    wanted = answer.casefold()
    return next(
        (o for o in options if wanted in (str(o.get("label", "")).casefold(), str(o.get("id", "")).casefold())),
        None,
    )


@dataclass
class _Pipeline:
    """One pipeline run: its journal, its projection (the snapshot) and its pending waits.

    Everything here lives in the kernel (guarded by ``KernelState.lock``), so a
    restarted adapter finds the run exactly where it was.
    """

    task_id: str
    context_id: str
    session_id: str
    name: str
    user_request: str
    flags: frozenset[str]
    rich: bool = False
    language: str = "en"
    seq: int = 0  # last sequence handed out (continues across pipelines of a context)
    journal: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    snapshot_version: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    rounds: dict[str, int] = field(default_factory=dict)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    input_history: list[dict[str, Any]] = field(default_factory=list)
    handoff_history: list[dict[str, Any]] = field(default_factory=list)
    cleanup_history: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    active_candidates: list[str] = field(default_factory=list)
    guidance: list[str] = field(default_factory=list)  # activeGuidance texts received while running
    pending_input: dict[str, Any] | None = None
    normal_handoff: dict[str, Any] | None = None
    pending_handoff: dict[str, Any] | None = None
    waits: list[_Pending] = field(default_factory=list)
    answers: list[tuple[_Pending, str]] = field(default_factory=list)
    gen: Generator[Any, Any, None] | None = None
    runner: _PipeRun | None = None

    # ----------------------------------------------------------- projection

    def _step(self, envelope: dict[str, Any]) -> dict[str, Any] | None:
        coordinate = envelope.get("step")
        if not isinstance(coordinate, dict):
            return None
        return next((s for s in reversed(self.steps) if s["id"] == coordinate.get("id")), None)

    @staticmethod
    def _coordinate(envelope: dict[str, Any]) -> dict[str, Any]:
        step = envelope.get("step")
        return {k: step[k] for k in ("attempt", "id", "index", "runId", "total")} if isinstance(step, dict) else {}

    @staticmethod
    def _run_key(envelope: dict[str, Any]) -> str:
        for name in ("candidateStep", "step"):
            coordinate = envelope.get(name)
            if isinstance(coordinate, dict):
                return f"{envelope['scope']}-{coordinate['runId']}"
        return "pipeline"

    def _entry(self, envelope: dict[str, Any], **extra: Any) -> dict[str, Any]:
        entry: dict[str, Any] = dict(envelope.get("data") or {})
        entry.update(
            {
                "createdAt": envelope["createdAt"],
                "data": dict(envelope.get("data") or {}),
                "eventId": envelope["eventId"],
                "eventType": envelope["eventType"],
                "scope": envelope["scope"],
                "sequence": envelope["sequence"],
                "status": envelope["status"],
            }
        )
        if "step" in envelope:
            entry["step"] = self._coordinate(envelope)
            entry["runId"] = envelope["step"]["runId"]
        entry.update(extra)
        return entry

    def apply(self, envelope: dict[str, Any]) -> None:
        """Project one envelope into the snapshot state."""
        kind = envelope["eventType"]
        data = envelope.get("data") or {}
        created = envelope["createdAt"]
        if kind != "backup_committed":
            self.snapshot_version += 1
        step = self._step(envelope)
        if kind == "pipeline_started":
            self.status = "running"
        elif kind == "step_started":
            coordinate = envelope["step"]
            self.steps.append(
                {
                    "attempt": coordinate["attempt"],
                    "candidates": [],
                    "id": coordinate["id"],
                    "index": coordinate["index"],
                    "runId": coordinate["runId"],
                    "startedAt": created,
                    "status": "running",
                    "total": coordinate["total"],
                    "type": "normal",
                }
            )
        elif kind == "message_started":
            key = self._run_key(envelope)
            self.rounds[key] = self.rounds.get(key, 0) + 1
        elif kind == "text_delta":
            self._append_text(envelope, str(data.get("text", "")))
        elif kind == "tool_result":
            self.tool_results.append(
                self._entry(envelope, id=data.get("toolUseId"))
                | {k: v for k, v in data.items() if k in ("toolName", "toolUseId", "isError", "result", "input")}
            )
        elif kind == "input_required":
            entry = self._entry(envelope, required=True, input=dict(envelope.get("input") or {}))
            self.input_history.append(entry)
            pending = {k: v for k, v in entry.items() if k not in ("data", "eventType", "input", "sequence", "status")}
            self.pending_input = pending
            self.status = "waiting_input"
            if step is not None:
                step["status"] = "waiting_input"
        elif kind == "input_received":
            self.input_history.append(self._entry(envelope))
            self.pending_input = None
            self.status = "running"
            if step is not None:
                step["status"] = "running"
                step["inputReceived"] = dict(data)
        elif kind == "permission_requested":
            entry = self._entry(envelope, candidate=dict(envelope.get("candidate") or {}))
            entry["status"] = "pending"
            self.permissions.append(entry)
            if self.pending_input is None:
                self.pending_input = {k: v for k, v in entry.items() if k not in ("data", "eventType", "sequence")}
            self.status = "waiting_input"
            if step is not None:
                step["status"] = "waiting_input"
        elif kind == "permission_resolved":
            for entry in self.permissions:
                if entry.get("inputId") == data.get("inputId"):
                    entry["status"] = "resolved"
                    entry["decision"] = data.get("decision")
                    entry["resolvedAt"] = created
            waiting = [e for e in self.permissions if e["status"] == "pending"]
            if waiting:
                self.pending_input = {k: v for k, v in waiting[0].items() if k not in ("data", "eventType", "sequence")}
            else:
                self.pending_input = None
                self.status = "running"
                if step is not None:
                    step["status"] = "running"
        elif kind == "candidate_started" and step is not None:
            candidate = envelope["candidate"]
            step["candidates"].append(
                {"id": candidate["id"], "label": data.get("label"), "runId": candidate["runId"], "status": "running"}
            )
            self.active_candidates.append(candidate["runId"])
        elif kind in ("candidate_completed", "candidate_failed") and step is not None:
            candidate = envelope["candidate"]
            for item in step["candidates"]:
                if item["runId"] == candidate["runId"]:
                    item["status"] = "completed" if kind == "candidate_completed" else "failed"
                    item.update({k: v for k, v in data.items() if k == "totalMonthlyCost"})
            if candidate["runId"] in self.active_candidates:
                self.active_candidates.remove(candidate["runId"])
        elif kind == "candidate_selected" and step is not None:
            step["selectedCandidateId"] = data.get("candidateId")
        elif kind == "step_completed" and step is not None:
            step.update(
                {
                    "status": "completed",
                    "completedAt": created,
                    "conclusion": data.get("conclusion"),
                    "conclusionField": data.get("conclusionField"),
                    "durationS": data.get("durationS"),
                }
            )
        elif kind == "step_failed" and step is not None:
            step.update({"status": "failed", "failedAt": created, "error": data.get("error")})
            self.status = "failed"
        elif kind == "pipeline_error":
            self.warnings.append(self._entry(envelope))
            self.status = "failed"
        elif kind == "pipeline_completed":
            self.status = "completed"
        elif kind == "pipeline_failed":
            self.status = "failed"
        elif kind == "pipeline_canceled":
            self.status = "canceled"
            self.pending_input = None
            for item in self.steps:
                if item["status"] in ("running", "waiting_input"):
                    item["status"] = "canceled"
        elif kind == "pipeline_handoff_ready":
            entry = self._entry(envelope)
            entry["visibility"] = envelope.get("visibility")
            cleanup = data.get("cleanup") or {}
            self.cleanup_history.append(
                {
                    "createdAt": created,
                    "data": dict(cleanup),
                    "eventId": envelope["eventId"],
                    "eventType": kind,
                    "scope": envelope["scope"],
                    "sequence": envelope["sequence"],
                    "status": cleanup.get("status"),
                }
            )
            if envelope.get("visibility") == "committed":
                self.normal_handoff = entry
                self.pending_handoff = None
                self.handoff_history.append(entry)
            else:
                self.pending_handoff = entry

    def _append_text(self, envelope: dict[str, Any], text: str) -> None:
        key = self._run_key(envelope)
        round_ = self.rounds.get(key, 1)
        message_id = f"message-{key}" if round_ == 1 else f"message-{key}-round-{round_}"
        message = next((m for m in self.messages if m["id"] == message_id), None)
        if message is None:
            message = {
                "createdAt": envelope["createdAt"],
                "id": message_id,
                "round": round_,
                "scope": envelope["scope"],
                "segments": [],
                "text": "",
            }
            if "step" in envelope:
                message["step"] = self._coordinate(envelope)
                message["runId"] = envelope["step"]["runId"]
            for name in ("candidate", "candidateStep"):
                if name in envelope:
                    message[name] = dict(envelope[name])
            self.messages.append(message)
        message["text"] += text
        message["segments"] = [{"kind": "text", "text": message["text"]}]
        message["updatedAt"] = envelope["createdAt"]

    def snapshot(self, *, lean: bool = False) -> dict[str, Any]:
        """The ``snapshot`` object of ``GET /iac-code/pipeline/state`` (a deep copy)."""
        display: dict[str, Any] = {
            "artifacts": [],
            "candidateDetails": [],
            "diagrams": [],
            "messages": self.messages,
            "permissions": self.permissions,
        }
        if not lean:
            display["toolResults"] = self.tool_results
        cleanup_status = self.cleanup_history[-1]["status"] if self.cleanup_history else "none"
        cleanup: dict[str, Any] = {
            "history": self.cleanup_history,
            "resourceCount": 0,
            "resources": [],
            "status": cleanup_status,
        }
        if self.cleanup_history:
            cleanup["statusMessage"] = self.cleanup_history[-1]["data"].get("statusMessage")
        snapshot = {
            "cleanup": cleanup,
            "contextId": self.context_id,
            "control": {
                "activeCandidateRunIds": self.active_candidates,
                "candidateRestarts": [],
                "handoffHistory": self.handoff_history,
                "inputHistory": self.input_history,
                "interruptHistory": [],
                "rollbackHistory": [],
                "stepNames": list(PIPELINE_STEPS),
                "totalSteps": len(PIPELINE_STEPS),
                "userRequest": self.user_request,
                "warningHistory": self.warnings,
            },
            "display": display,
            "generatedAt": datetime.now(_UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSequence": self.seq,
            "normalHandoff": self.normal_handoff,
            "pendingInput": self.pending_input,
            "pendingNormalHandoff": self.pending_handoff,
            "pendingTerminal": None,
            "pipelineName": self.name,
            "pipelineRunId": self.context_id,
            "schemaVersion": "1.2",
            "snapshotVersion": self.snapshot_version,
            "stacks": {"byId": {}, "current": None, "history": []},
            "status": self.status,
            "steps": self.steps,
            "taskId": self.task_id,
        }
        return copy.deepcopy(snapshot)


class _PipeRun:
    """Envelope builders for a pipeline; ``run`` is the worker run currently driving it."""

    def __init__(self, state: KernelState, pipe: _Pipeline) -> None:
        self.state = state
        self.pipe = pipe
        self.run: _Run | None = None
        self._batch: list[dict[str, Any]] | None = None

    @staticmethod
    def coord(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "runId": f"step-{name}-1",
            "index": PIPELINE_STEPS.index(name) + 1,
            "total": len(PIPELINE_STEPS),
            "attempt": 1,
        }

    def event(self, event_type: str, data: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Journal an envelope without sending it (send it later, or never)."""
        with self.state.lock:
            if self.run is not None and self.run.task.canceled:
                raise _Canceled()
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
            iac: dict[str, Any] = {"pipeline": _struct(envelopes[0])}
        else:
            iac = {
                "pipelineBatch": {
                    "schemaVersion": "1.0",
                    "extensionUri": PIPELINE_EXTENSION_URI,
                    "events": [_struct(e) for e in envelopes],
                }
            }
        iac.update(_struct(extra or {}))
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
        self.emit("message_started", {"messageId": "msg_" + _hex(24)}, **coordinates)
        self.emit("text_delta", {"text": text}, **coordinates)


# --------------------------------------------------------------------------- the app


_Handler = Callable[[Any, dict[str, Any]], Any]


class ScriptedKernelApp:
    """The WSGI application. Construct it with :func:`create_app`."""

    def __init__(self, state: KernelState) -> None:
        self.state = state
        self.routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("POST", "/"): self._rpc,
            ("GET", "/health"): self._health,
            ("GET", "/.well-known/agent-card.json"): self._agent_card,
            ("GET", "/iac-code/readiness"): self._readiness,
            ("POST", "/iac-code/session/ensure-restored"): self._ensure_restored,
            ("GET", "/iac-code/pipeline/state"): self._pipeline_state,
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
            response = _json_response({"error": "Unauthorized"}, 401)
        else:
            handler = self.routes.get((request.method, request.path))
            if handler is not None:
                response = handler(request)
            elif any(path == request.path for _, path in self.routes):
                response = _json_response({"error": "Method Not Allowed"}, 405)
            else:
                response = _json_response({"error": "Not Found"}, 404)
        return response(environ, start_response)

    def _authorized(self, request: Request) -> bool:
        token = self.state.token
        if not token:
            return True
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode("utf-8"), token.encode("utf-8"))

    # ----------------------------------------------------------- plain routes

    def _health(self, request: Request) -> Response:
        return _json_response({"status": "healthy", "version": KERNEL_VERSION, "mode": "normal"})

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
        response = _json_response(card)
        response.headers["Cache-Control"] = "public, max-age=60"
        return response

    def _readiness(self, request: Request) -> Response:
        return _json_response(
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
        bad = _json_response({"error": "Invalid session restore request."}, 400)
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
                return _json_response(
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
            return _json_response({"status": "current"})
        return _json_response({"status": "not_found"}, 404)

    def _pipeline_state(self, request: Request) -> Response:
        task_id = request.args.get("taskId") or None
        context_id = request.args.get("contextId") or None
        if task_id is None and context_id is None:
            return _json_response({"error": "taskId or contextId is required."}, 400)
        try:
            snapshot = self.state.pipeline_snapshot(task_id, context_id, dict(request.args))
        except ValueError as exc:
            return _json_response({"error": str(exc)}, 400)
        if snapshot is None:
            return _json_response({"error": "A2A pipeline state not found"}, 404)
        return _json_response(snapshot)

    def _scripted_requests(self, request: Request) -> Response:
        return _json_response(self.state.requests)

    def _scripted_reset(self, request: Request) -> Response:
        self.state.reset_requests()
        return _json_response({"status": "reset"})

    # ----------------------------------------------------------- JSON-RPC

    def _rpc(self, request: Request) -> Response:
        try:
            body = json.loads(request.get_data())
        except ValueError:
            return _rpc_error(None, RpcError(-32700, "Parse error"))
        if not isinstance(body, dict):
            return _rpc_error(None, RpcError(-32600, "Invalid Request"))
        rid = body.get("id")
        method = body.get("method")
        params = body.get("params")
        version = request.headers.get("A2A-Version")
        self.state.log_request(
            {
                "method": method,
                "params": params,
                "headers": {
                    "authorization": "Authorization" in request.headers,
                    "a2a-version": version,
                },
                "id": rid,
            }
        )
        if body.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return _rpc_error(rid, RpcError(-32600, "Invalid Request"))
        if (version or "").strip() != A2A_VERSION:
            return _rpc_error(rid, _version_not_supported(version))
        handler = self.methods.get(method)
        if handler is None:
            return _rpc_error(rid, RpcError(-32601, "Method not found"))
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _rpc_error(rid, _invalid_params("params must be an object."))
        try:
            outcome = handler(rid, params)
        except RpcError as exc:
            return _rpc_error(rid, exc)
        if isinstance(outcome, Response):
            return outcome
        return _json_response({"result": outcome, "id": rid, "jsonrpc": "2.0"})

    @staticmethod
    def _task_id_param(params: dict[str, Any]) -> str:
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise _invalid_params("params.id is required.")
        return task_id

    def _m_send_streaming(self, rid: Any, params: dict[str, Any]) -> Response:
        task, subscriber = self._submit(params)
        return self._sse_response(task, subscriber, rid)

    def _m_send(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        task, subscriber = self._submit(params, unary=True)
        try:
            # Until the turn ends, or until a resumed pipeline acknowledged the answer.
            while (item := subscriber.get()) is not _CLOSE and item is not _ACK:
                pass
        finally:
            self.state.unsubscribe(task, subscriber)
        with self.state.lock:
            return {"task": self.state.snapshot_locked(task)}

    def _m_get_task(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        task_id = self._task_id_param(params)
        history_length = params.get("historyLength")
        if history_length is not None and (
            isinstance(history_length, bool) or not isinstance(history_length, int) or history_length < 0
        ):
            raise _invalid_params("historyLength must be a non-negative integer.")
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                raise _task_not_found()
            return self.state.snapshot_locked(task, history_length)

    def _m_cancel_task(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        return self.state.cancel(self._task_id_param(params))

    def _m_subscribe(self, rid: Any, params: dict[str, Any]) -> Response:
        task_id = self._task_id_param(params)
        subscriber: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                raise _task_not_found()
            if not task.running:
                raise _task_not_found(f"Task {task_id} is not active")
            subscriber.put(({"task": self.state.snapshot_locked(task)}, 1))
            task.subscribers.append(subscriber)
            task.attached.set()
        return self._sse_response(task, subscriber, rid)

    def _m_list_tasks(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        page_size = params.get("pageSize", 50)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 100:
            raise _invalid_params("pageSize must be between 1 and 100.")
        token = params.get("pageToken") or "0"
        if not (isinstance(token, str) and token.isdigit()):
            raise _invalid_params("Invalid pageToken.")
        history_length = params.get("historyLength")
        if history_length is not None and (isinstance(history_length, bool) or not isinstance(history_length, int)):
            raise _invalid_params("historyLength must be an integer.")
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

    # ----------------------------------------------------------- streaming

    def _sse_response(self, task: _Task, subscriber: queue.SimpleQueue[Any], rid: Any) -> Response:
        response = Response(
            self._stream_body(task, subscriber, rid),
            status=200,
            content_type="text/event-stream; charset=utf-8",
            direct_passthrough=True,
        )
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Accel-Buffering"] = "no"
        return response

    def _stream_body(self, task: _Task, subscriber: queue.SimpleQueue[Any], rid: Any) -> Iterator[bytes]:
        head = b'data: {"result":'
        tail = (',"id":' + _dumps(rid) + ',"jsonrpc":"2.0"}\n\n').encode("utf-8")
        keepalive = self.state.keepalive_seconds
        timeout = keepalive if keepalive > 0 else None
        try:
            while True:
                try:
                    item = subscriber.get(timeout=timeout)
                except queue.Empty:
                    yield f": ping - {datetime.now(_UTC)}\n\n".encode()
                    continue
                buffer: list[bytes] = []
                closed = False
                while True:
                    if item is _CLOSE:
                        closed = True
                        break
                    if item is not _ACK:
                        result, repeat = item
                        frame = head + _dumps(result).encode("utf-8") + tail
                        if repeat == 1:
                            buffer.append(frame)
                        else:
                            if buffer:
                                yield b"".join(buffer)
                                buffer = []
                            full, rest = divmod(repeat, FRAMES_PER_WRITE)
                            if full:
                                chunk = frame * FRAMES_PER_WRITE
                                for _ in range(full):
                                    yield chunk
                            if rest:
                                yield frame * rest
                    if len(buffer) >= FRAMES_PER_WRITE:
                        break
                    try:
                        item = subscriber.get_nowait()
                    except queue.Empty:
                        break
                if buffer:
                    yield b"".join(buffer)
                if closed:
                    return
        finally:
            self.state.unsubscribe(task, subscriber)

    # ----------------------------------------------------------- submitting turns

    def _submit(self, params: dict[str, Any], *, unary: bool = False) -> tuple[_Task, queue.SimpleQueue[Any]]:
        msg = params.get("message")
        if not isinstance(msg, dict):
            raise _invalid_params("params.message is required.")
        if msg.get("role") != "ROLE_USER":
            raise _invalid_params("message.role must be ROLE_USER.")
        if not isinstance(msg.get("messageId"), str) or not msg["messageId"]:
            raise _invalid_params("message.messageId is required.")
        parts = msg.get("parts")
        if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
            raise _invalid_params("message.parts must be a non-empty list of parts.")
        context_id, task_id = msg.get("contextId"), msg.get("taskId")
        for name, value in (("contextId", context_id), ("taskId", task_id)):
            if value is not None and (not isinstance(value, str) or not _ID_RE.match(value)):
                raise _invalid_params(f"message.{name} is not a valid identifier.")
        metadata = msg.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise _invalid_params("message.metadata must be an object.")
        iac = (metadata or {}).get("iac_code") or {}
        if not isinstance(iac, dict):
            raise _invalid_params("metadata.iac_code must be an object.")
        text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str))
        answer = _permission_answer(parts)
        if task_id is None and answer is not None:
            task_id = answer["requestTaskId"]
        response = iac.get("inputResponse")
        if response is not None:
            if not isinstance(response, dict):
                raise _invalid_params(INPUT_RESPONSE_MISMATCH)
            if task_id is None:
                task_id = response.get("requestTaskId")
                if not isinstance(task_id, str) or not task_id:
                    raise _invalid_params(INPUT_NOT_ACTIVE)
        if task_id is not None:
            return self._submit_to_task(task_id, context_id, answer, text, iac, response=response, unary=unary)
        return self._submit_new_turn(msg, context_id, parts, text, iac)

    def _submit_new_turn(
        self,
        msg: dict[str, Any],
        context_id: str | None,
        parts: list[dict[str, Any]],
        text: str,
        iac: dict[str, Any],
    ) -> tuple[_Task, queue.SimpleQueue[Any]]:
        directives = Directives.parse(text)
        pipeline_name = _pipeline_name(iac)
        image_types, image_error = _inspect_images(parts)
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
                "history": [_echo_message(msg, task.id, context_id)],
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
                    "timestamp": _now_iso(),
                }
                task.status = status
                update = {"taskId": task.id, "contextId": context_id, "status": status}
                subscriber.put(({"task": task_obj}, 1))
                subscriber.put(({"statusUpdate": update}, 1))
                subscriber.put(_CLOSE)
                return task, subscriber
            if ctx is None:
                ctx = _Context(context_id, session_id=str(uuid.uuid4()))
                self.state.contexts[context_id] = ctx
                task.session_id = ctx.session_id
            if isinstance(cwd, str) and ctx.cwd is None:
                ctx.cwd = os.path.normpath(cwd)
            ctx.turns += 1
            task.cwd = ctx.cwd or default_cwd
            task.language = _language(iac)
            task.running = True
            ctx.running_task_id = task.id
            task.subscribers.append(subscriber)
            pipe: _Pipeline | None = None
            if pipeline_name is not None:
                pipe = _Pipeline(
                    task.id,
                    context_id,
                    ctx.session_id,
                    pipeline_name,
                    text,
                    directives.flags,
                    rich=iac.get("candidatePresentation") == "rich-v1",
                    language=task.language,
                )
                pipe.runner = _PipeRun(self.state, pipe)
                pipe.gen = self._pipeline_body(pipe.runner)
                self.state.pipelines[task.id] = pipe
                self.state.context_pipelines[context_id] = task.id
            turn = _Turn(directives, dict(iac), tuple(image_types), ctx.turns, pipe)
        script = functools.partial(self._script_turn, turn=turn, task_frame={"task": task_obj})
        self._spawn(task, script)
        return task, subscriber

    @staticmethod
    def _guidance_ack(task: _Task, pipe: _Pipeline, text: str) -> dict[str, Any]:
        return {
            "statusUpdate": {
                "taskId": task.id,
                "contextId": task.context_id,
                "status": {"state": "TASK_STATE_WORKING", "timestamp": _now_iso()},
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
    ) -> tuple[_Task, queue.SimpleQueue[Any]]:
        subscriber: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self.state.lock:
            task = self.state.tasks.get(task_id)
            if task is None:
                if response is not None:
                    raise _invalid_params(INPUT_NOT_ACTIVE)
                raise (_invalid_params(PERMISSION_NOT_ACTIVE) if answer is not None else _task_not_found())
            ctx = self.state.contexts.get(task.context_id)
            pending = task.pending
            pipe = self.state.pipelines.get(task.id)
            script: Callable[[_Run], None]
            if pipe is not None and pipe.waits and not task.running:
                resume = self._pipeline_answer_locked(
                    task,
                    pipe,
                    context_id=context_id,
                    answer=answer,
                    response=response,
                    text=text,
                    unary=unary,
                    subscriber=subscriber,
                )
                if resume is None:  # one of several permissions: acknowledged in place
                    return task, subscriber
                script = resume
            elif response is not None:
                raise _invalid_params(INPUT_NOT_ACTIVE)
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
                    raise _invalid_params(PERMISSION_NOT_ACTIVE)
                script = functools.partial(
                    self._script_permission_answer,
                    pending=pending,
                    decision=answer["decision"],
                )
                task.pending = None
            else:
                if context_id is not None and context_id != task.context_id:
                    raise _invalid_params("message.contextId does not match the task's contextId.")
                if task.running and pipe is not None and text.strip():
                    # Guidance for a running pipeline: acknowledged on its own short stream.
                    pipe.guidance.append(text.strip())
                    subscriber.put((self._guidance_ack(task, pipe, text), 1))
                    subscriber.put(_CLOSE)
                    return task, subscriber
                if task.running:
                    raise _invalid_params(BUSY_TEXT)
                if pending is not None and pending.kind == "ask_user_question":
                    reply = text.strip()
                    if not reply:
                        raise _invalid_params("An answer to the pending question is required.")
                    script = functools.partial(self._script_ask_answer, pending=pending, answer=reply)
                    task.pending = None
                elif pending is not None:
                    raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
                elif task.status["state"] in TERMINAL_STATES:
                    raise _invalid_params(f"Task {task.id} is in terminal state: {task.status['state']}")
                else:
                    # A follow-up turn addressed to an idle task continues that task.
                    if ctx is None:
                        raise _task_not_found()
                    cwd = iac.get("cwd")
                    if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
                        raise _invalid_params(BAD_CWD_TEXT)
                    if cwd is not None and ctx.cwd not in (None, os.path.normpath(cwd)):
                        raise _invalid_params(OTHER_CWD_TEXT)
                    if ctx.running_task_id is not None:
                        raise _invalid_params(BUSY_TEXT)
                    ctx.turns += 1
                    turn = _Turn(Directives.parse(text), dict(iac), (), ctx.turns)
                    script = functools.partial(self._script_turn, turn=turn, task_frame=None)
            task.running = True
            if ctx is not None:
                ctx.running_task_id = task.id
            task.subscribers.append(subscriber)
        self._spawn(task, script)
        return task, subscriber

    def _spawn(self, task: _Task, script: Callable[[_Run], None]) -> None:
        with self.state.lock:
            if self.state.closing:  # stop() raced with this request: end the stream at once
                task.canceled = True
                self.state.finish_locked(task)
                return
        run = _Run(self.state, task)
        thread = threading.Thread(
            target=self._worker,
            args=(run, script),
            name=f"scripted-task-{task.id[:8]}",
            daemon=True,
        )
        thread.start()

    def _worker(self, run: _Run, script: Callable[[_Run], None]) -> None:
        try:
            script(run)
        except _Canceled:
            pass
        except Exception as exc:  # noqa: BLE001 - a broken script must not leave streams hanging
            try:
                run.fail_now(f"{type(exc).__name__}: {exc}")
            except _Canceled:
                pass
        finally:
            self.state.finish(run.task)

    # ----------------------------------------------------------- scripts

    def _script_turn(self, run: _Run, *, turn: _Turn, task_frame: dict[str, Any] | None) -> None:
        if task_frame is not None:
            run.task_frame(task_frame)
        if turn.pipeline is not None:  # no plain SUBMITTED/WORKING frames: pipeline_started comes first
            self._pipeline_resume(run, turn.pipeline, None)
            return
        run.opening(new_task=task_frame is not None)
        d = turn.directives
        if d.silent:
            run.sleep(d.silent)
        if "THINK" in d:
            for piece in THINKING_PIECES:
                run.thinking(piece)
        if "FAIL" in d:
            self._script_fail(run)
            return
        if "WRITE" in d:
            self._script_write(run)
            return
        if "ASK" in d:
            self._script_ask(run)
            return
        used_tool = "TOOL" in d or "PROGRESS" in d
        if used_tool:
            self._script_read_tool(run, progress="PROGRESS" in d)
        if d.fast is not None:
            run.fast(d.fast)
        elif "SLOW" in d:
            for piece in SLOW_PIECES:
                run.sleep(1.0)
                run.delta(piece)
        else:
            reply = self._reply_text(run, turn)
            if reply:
                run.deltas(_split_text(reply))
            elif used_tool:
                run.delta("Done.")
            else:
                run.deltas(DEFAULT_PIECES)
        run.finish_reply()

    @staticmethod
    def _reply_text(run: _Run, turn: _Turn) -> str:
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

    def _script_fail(self, run: _Run) -> None:
        error = {"errorId": _hex(12), "retryable": False}
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

    def _script_read_tool(self, run: _Run, *, progress: bool) -> None:
        run.delta("I will read the file.")
        tool_use_id = "call_read_" + _hex(12)
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

    def _script_write(self, run: _Run) -> None:
        language = run.task.language
        texts = _PERMISSION_TEXTS.get(language, _PERMISSION_TEXTS["en"])
        run.delta("I will write the file now.")
        tool_use_id = "call_write_" + _hex(12)
        tool_input = {"content": WRITE_CONTENT, "path": WRITE_PATH}
        run.tool_call(tool_use_id, "write_file", tool_input)
        run.end_llm_call()
        fingerprint = hashlib.sha256(WRITE_CONTENT.encode("utf-8")).hexdigest()[:16]
        summary = json.dumps(
            {
                "content": {
                    "fingerprint": f"sha256:{fingerprint}",
                    "length": len(WRITE_CONTENT),
                    "type": "str",
                },
                "path": WRITE_PATH,
            },
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )
        input_id = "permission-" + uuid.uuid4().hex
        envelope = {
            "schemaVersion": 1.0,
            "kind": "permission",
            "required": True,
            "language": language,
            "requestTaskId": run.tid,
            "contextId": run.cid,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "toolName": "write_file",
            "title": texts["title"],
            "purpose": texts["purpose"],
            "effect": "file_change",
            "target": WRITE_PATH,
            "isReadOnly": False,
            "prompt": texts["prompt"],
            "safeSummary": f"write_file: {summary}",
            "options": [
                {"id": "allow_once", "label": texts["allow_once"]},
                {"id": "deny", "label": texts["deny"]},
            ],
        }
        permission = {
            "pending": True,
            "toolUseId": tool_use_id,
            "toolName": "write_file",
            "autoApproved": False,
        }
        run.interrupt(
            _Pending(
                "permission",
                input_id,
                tool_use_id,
                envelope,
                permission,
                {"path": WRITE_PATH, "content": WRITE_CONTENT},
            )
        )

    def _script_permission_answer(self, run: _Run, *, pending: _Pending, decision: str) -> None:
        received = {
            "toolUseId": pending.tool_use_id,
            "kind": "permission",
            "inputId": pending.input_id,
        }
        run.status(WORKING, metadata={"iac_code": {"inputReceived": received}})
        texts = _PERMISSION_TEXTS.get(run.task.language, _PERMISSION_TEXTS["en"])
        name = pending.envelope.get("toolName", "write_file")
        if decision == "allow_once":
            path = os.path.join(run.task.cwd, pending.extra["path"])
            data = pending.extra["content"].encode("utf-8")
            try:
                os.makedirs(run.task.cwd, exist_ok=True)
                with open(path, "wb") as handle:
                    handle.write(data)
            except OSError as exc:
                result = f"Error: {exc}"
                run.tool(
                    {
                        "toolUseId": pending.tool_use_id,
                        "result": result,
                        "name": name,
                        "status": "failed",
                    }
                )
            else:
                artifact, tool_artifact = _artifact_for(path, data, "text/plain")
                run.artifact(artifact)
                result = texts["wrote"].format(lines=data.count(b"\n") or 1, path=path)
                run.tool(
                    {
                        "toolUseId": pending.tool_use_id,
                        "result": result,
                        "name": name,
                        "status": "completed",
                        "artifact": tool_artifact,
                    }
                )
        else:
            result = f"The user denied permission to run {name}."
            run.tool(
                {
                    "toolUseId": pending.tool_use_id,
                    "result": result,
                    "name": name,
                    "status": "failed",
                }
            )
        run.deltas(["Tool finished. ", "Result: ", result])
        run.finish_reply()

    def _script_ask(self, run: _Run) -> None:
        run.delta("I need one detail before I continue.")
        tool_use_id = "call_ask_" + _hex(12)
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
        run.interrupt(_Pending("ask_user_question", input_id, tool_use_id, envelope))

    def _script_ask_answer(self, run: _Run, *, pending: _Pending, answer: str) -> None:
        received: dict[str, Any] = {
            "kind": "ask_user_question",
            "inputId": pending.input_id,
            "toolUseId": pending.tool_use_id,
        }
        wanted = answer.casefold()
        option = next(
            (
                o
                for o in pending.envelope.get("options", [])
                if wanted in (str(o.get("label", "")).casefold(), str(o.get("id", "")).casefold())
            ),
            None,
        )
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

    # ----------------------------------------------------------- pipeline mode

    def _pipeline_answer_locked(
        self,
        task: _Task,
        pipe: _Pipeline,
        *,
        context_id: str | None,
        answer: dict[str, Any] | None,
        response: dict[str, Any] | None,
        text: str,
        unary: bool,
        subscriber: queue.SimpleQueue[Any],
    ) -> Callable[[_Run], None] | None:
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
                    if w.kind == "permission"
                    and w.input_id == answer["inputId"]
                    and w.tool_use_id == answer["toolUseId"]
                ),
                None,
            )
            if (
                match is None
                or answer["requestTaskId"] != task.id
                or answer.get("contextId", task.context_id) != task.context_id
                or (context_id is not None and context_id != task.context_id)
            ):
                raise _invalid_params(PERMISSION_NOT_ACTIVE)
            decision = answer["decision"]
            waits.remove(match)
            pipe.answers.append((match, decision))
            if waits:
                self._pipeline_partial_ack_locked(task, pipe, match, decision, subscriber)
                return None
            task.attached.clear()
            return functools.partial(
                self._script_pipeline_permission, pipe=pipe, pending=match, decision=decision, unary=unary
            )
        if context_id is not None and context_id != task.context_id:
            raise _invalid_params("message.contextId does not match the task's contextId.")
        pending = waits[0]
        value: dict[str, Any]
        if response is not None:
            value = self._resource_response(task, pending, response)
        elif pending.kind == "permission":
            raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
        elif pending.kind == "cloud_resource_selection":
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        else:
            reply = text.strip()
            if not reply:
                raise _invalid_params("An answer to the pending question is required.")
            option = _match_option(pending.envelope.get("options", []), reply)
            if option is None and not pending.envelope.get("allowFreeText"):
                raise _invalid_params(NO_OPTION_TEXT)
            value = {"text": reply, "option": option}
        pipe.waits = []
        return functools.partial(self._script_pipeline_resume, pipe=pipe, value=value)

    @staticmethod
    def _resource_response(task: _Task, pending: _Pending, response: dict[str, Any]) -> dict[str, Any]:
        """The validated ``iac_code.inputResponse`` of a cloud_resource_selection answer."""
        if pending.kind != "cloud_resource_selection":
            raise _invalid_params(INPUT_NOT_ACTIVE)
        keys = set(response)
        if not INPUT_RESPONSE_KEYS <= keys <= INPUT_RESPONSE_KEYS | INPUT_RESPONSE_OPTIONAL:
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        version = response["schemaVersion"]
        if isinstance(version, bool) or version not in (1, "1", "1.0"):
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        if response["kind"] != "cloud_resource_selection" or response["status"] not in ("selected", "canceled"):
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        for key in ("requestTaskId", "contextId", "inputId", "toolUseId", "selectorId"):
            if not isinstance(response[key], str) or not response[key]:
                raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        if (
            response["requestTaskId"] != task.id
            or response["contextId"] != task.context_id
            or response["inputId"] != pending.input_id
            or response["toolUseId"] != pending.tool_use_id
        ):
            raise _invalid_params(INPUT_NOT_ACTIVE)
        selector = pending.envelope["selector"]
        label = response.get("label")
        value = response["value"]
        if response["selectorId"] != selector["selectorId"] or (label is not None and not isinstance(label, str)):
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        if response["status"] == "selected":
            option = next((o for o in selector["options"] if o["value"] == value), None)
            if option is None:
                raise _invalid_params("The selected value is not one of the offered options.")
            label = label or option["label"]
        elif value is not None and not isinstance(value, str):
            raise _invalid_params(INPUT_RESPONSE_MISMATCH)
        return {"status": response["status"], "selectorId": selector["selectorId"], "value": value, "label": label}

    @staticmethod
    def _resolved_data(pending: _Pending, decision: str) -> dict[str, Any]:
        return {
            "kind": "permission",
            "inputId": pending.input_id,
            "toolUseId": pending.tool_use_id,
            "toolName": pending.envelope.get("toolName"),
            "decision": decision,
            "candidateId": pending.extra.get("candidate"),
        }

    @staticmethod
    def _permission_received(pending: _Pending, decision: str) -> dict[str, Any]:
        return {
            "toolUseId": pending.tool_use_id,
            "kind": "permission",
            "inputId": pending.input_id,
            "decision": decision,
        }

    def _pipeline_partial_ack_locked(
        self, task: _Task, pipe: _Pipeline, pending: _Pending, decision: str, subscriber: queue.SimpleQueue[Any]
    ) -> None:
        envelope = self.state.pipeline_event_locked(
            pipe, "permission_resolved", self._resolved_data(pending, decision), **pending.extra["coords"]
        )
        ack_status = {"state": WORKING}
        wait_status = {"state": INPUT_REQUIRED}
        ack_iac = {"pipeline": _struct(envelope), "inputReceived": self._permission_received(pending, decision)}
        wait_iac = dict(_wait_iac(pipe.waits), iacCodeSessionId=task.session_id)
        for status, iac in ((ack_status, ack_iac), (wait_status, wait_iac)):
            self.state._apply_status_locked(task, status, 1)
            update = {"taskId": task.id, "contextId": task.context_id, "status": status, "metadata": {"iac_code": iac}}
            subscriber.put(({"statusUpdate": update}, 1))
        subscriber.put(_CLOSE)

    def _script_pipeline_permission(
        self, run: _Run, *, pipe: _Pipeline, pending: _Pending, decision: str, unary: bool
    ) -> None:
        """The last pending permission was answered: acknowledge, then resume the pipeline."""
        runner = pipe.runner
        assert runner is not None
        runner.run = run
        envelope = runner.event(
            "permission_resolved", self._resolved_data(pending, decision), **pending.extra["coords"]
        )
        runner.send(envelope, extra={"inputReceived": self._permission_received(pending, decision)})
        self.state.signal(run.task, _ACK)
        if unary:
            # The unary caller follows with GetTask + SubscribeToTask: give it a moment to attach.
            deadline = time.monotonic() + PIPELINE_SUBSCRIBE_GRACE
            while not run.task.attached.wait(0.02):
                if run.task.cancel_event.is_set():
                    raise _Canceled()
                if time.monotonic() >= deadline:
                    break
        with self.state.lock:
            answers, pipe.answers = pipe.answers, []
        self._pipeline_resume(run, pipe, answers)

    def _script_pipeline_resume(self, run: _Run, *, pipe: _Pipeline, value: Any) -> None:
        self._pipeline_resume(run, pipe, value)

    def _pipeline_resume(self, run: _Run, pipe: _Pipeline, value: Any) -> None:
        """Drive the pipeline script until its next wait (stream closes) or its end."""
        runner = pipe.runner
        assert runner is not None and pipe.gen is not None
        runner.run = run
        try:
            envelopes, waits = pipe.gen.send(value)
        except StopIteration:
            return
        with self.state.lock:
            pipe.waits = list(waits)
        runner.send(*envelopes, extra=_wait_iac(waits), close=True)

    def _pipeline_body(self, p: _PipeRun) -> Generator[Any, Any, None]:
        """The scripted pipeline; yields ``(envelopes, waits)`` and receives the answer."""
        pipe = p.pipe
        flags = pipe.flags
        outcome = "completed"
        p.emit(
            "pipeline_started",
            {
                "totalSteps": len(PIPELINE_STEPS),
                "stepNames": list(PIPELINE_STEPS),
                "userRequest": pipe.user_request,
                "pipelineType": pipe.name,
            },
        )
        for name in PIPELINE_STEPS:
            step = p.coord(name)
            index = step["index"]
            if index > 1 and "PIPE-SLOW" in flags:
                assert p.run is not None
                p.run.sleep(0.5)
            p.emit(
                "step_started",
                {
                    "transcript_id": f"transcript_att_{index:04d}",
                    "active_attempt_id": f"att_{index:04d}",
                    "total": len(PIPELINE_STEPS),
                    "uiMode": None,
                    "index": index,
                    "name": name,
                    "attempt": 1,
                    "stepType": "normal",
                },
                step=dict(step, type="normal", uiMode=None),
            )
            p.emit("context_usage", _context_usage(0), step=step)
            p.say(f"Working on {name}.", step=step)
            conclusion = copy.deepcopy(PIPELINE_CONCLUSIONS[name])
            asked = False
            if name == "intent_parsing" and "PIPE-ASK" in flags:
                option, reply = yield from self._pipe_question(
                    p,
                    step,
                    kind="ask_user_question",
                    tool="ask_user_question",
                    prefix="ask",
                    prompt=ASK_PROMPT,
                    options=ASK_OPTIONS,
                    allow_free_text=True,
                )
                conclusion["clarification_choice"] = option["id"] if option else reply
                asked = True
            elif name == "architecture_planning" and "PIPE-RESOURCE" in flags:
                selection = yield from self._pipe_resource(p, step)
                conclusion["vpcId"] = selection["value"] if selection["status"] == "selected" else None
                asked = True
            elif name == "evaluate_candidates" and flags & {"PIPE-CANDIDATES", "PIPE-PERMS"}:
                yield from self._pipe_candidates(p, step)
                conclusion["candidateIds"] = [c["id"] for c in CANDIDATES]
            elif name == "confirm_and_select" and "PIPE-CANDIDATES" in flags:
                options = [
                    dict(c) if pipe.rich else {"id": c["id"], "label": c["label"]} for c in copy.deepcopy(CANDIDATES)
                ]
                option, _ = yield from self._pipe_question(
                    p,
                    step,
                    kind="candidate_selection",
                    tool="select_candidate",
                    prefix="select",
                    prompt=SELECT_PROMPT,
                    options=options,
                    allow_free_text=False,
                )
                p.emit("candidate_selected", {"candidateId": option["id"], "label": option["label"]}, step=step)
                conclusion["candidateId"] = option["id"]
                asked = True
            elif name == "deploying" and "PIPE-CANDIDATES" in flags:
                option, _ = yield from self._pipe_question(
                    p,
                    step,
                    kind="deployment_confirmation",
                    tool="confirm_deployment",
                    prefix="confirm",
                    prompt=CONFIRM_PROMPT,
                    options=CONFIRM_OPTIONS,
                    allow_free_text=False,
                )
                if option["id"] == "cancel":
                    outcome = "early_exit"
                    conclusion = {"deployed": False, "reason": "canceled by the user"}
                asked = True
            if asked:
                p.emit("context_usage", _context_usage(3), step=step)
                p.say(f"Working on {name}.", step=step)
            if name == "architecture_planning" and "PIPE-FAIL" in flags:
                self._pipe_fail(p, step)
                return
            self._pipe_complete_step(p, step, conclusion, ooo="PIPE-OOO" in flags and name == "architecture_planning")
        self._pipe_finish(p, outcome)

    @staticmethod
    def _pipe_question(
        p: _PipeRun,
        step: dict[str, Any],
        *,
        kind: str,
        tool: str,
        prefix: str,
        prompt: str,
        options: Any,
        allow_free_text: bool,
    ) -> Generator[Any, Any, tuple[dict[str, Any] | None, str]]:
        """A question wait (ask_user_question / candidate_selection / deployment_confirmation)."""
        pipe = p.pipe
        tool_use_id = f"call_{prefix}_" + _hex(12)
        input_id = f"{prefix}-{tool_use_id}"
        options = [dict(o) for o in options]
        tool_input = {"question": prompt, "options": options, "allow_free_text": allow_free_text}
        p.emit("tool_started", {"toolUseId": tool_use_id, "toolName": tool, "input": tool_input}, step=step)
        with p.batch():
            p.emit("usage", dict(_PIPE_USAGE), step=step)
            p.emit("context_usage", _context_usage(1), step=step)
        data = {
            "kind": kind,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "question": prompt,
            "prompt": prompt,
            "options": options,
            "allowFreeText": allow_free_text,
            "freeTextPrompt": "",
        }
        envelope = p.event("input_required", data, status="input_required", step=step, input_=dict(data, required=True))
        unified = _struct(
            {
                "schemaVersion": 1,
                "kind": kind,
                "required": True,
                "requestTaskId": pipe.task_id,
                "contextId": pipe.context_id,
                "inputId": input_id,
                "toolUseId": tool_use_id,
                "prompt": prompt,
                "allowFreeText": allow_free_text,
                "options": options,
            }
        )
        answer = yield [envelope], [_Pending(kind, input_id, tool_use_id, unified)]
        option, reply = answer["option"], answer["text"]
        received = {
            "kind": kind,
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "question": prompt,
            "options": options,
            "allowFreeText": allow_free_text,
            "selectedId": option["id"] if option else None,
            "selectedLabel": option["label"] if option else None,
            "freeText": "" if option else reply,
            "freeTextLength": 0 if option else len(reply),
            "answerTextLength": len(reply),
        }
        p.emit("input_received", received, step=step)
        return option, reply

    @staticmethod
    def _pipe_resource(p: _PipeRun, step: dict[str, Any]) -> Generator[Any, Any, dict[str, Any]]:
        """A cloud_resource_selection wait (answered through ``iac_code.inputResponse``)."""
        pipe = p.pipe
        tool_use_id = "call_resource_" + _hex(12)
        input_id = f"resource-{tool_use_id}"
        selector = copy.deepcopy(RESOURCE_SELECTOR)
        tool_input = {"prompt": RESOURCE_PROMPT, "selectorId": selector["selectorId"]}
        p.emit(
            "tool_started",
            {"toolUseId": tool_use_id, "toolName": "select_cloud_resource", "input": tool_input},
            step=step,
        )
        with p.batch():
            p.emit("usage", dict(_PIPE_USAGE), step=step)
            p.emit("context_usage", _context_usage(1), step=step)
        data = {
            "kind": "cloud_resource_selection",
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "prompt": RESOURCE_PROMPT,
            "selector": selector,
        }
        envelope = p.event("input_required", data, status="input_required", step=step, input_=dict(data, required=True))
        unified = _struct(
            {
                "schemaVersion": 1,
                "kind": "cloud_resource_selection",
                "required": True,
                "requestTaskId": pipe.task_id,
                "contextId": pipe.context_id,
                "inputId": input_id,
                "toolUseId": tool_use_id,
                "prompt": RESOURCE_PROMPT,
                "selector": selector,
            }
        )
        selection = yield [envelope], [_Pending("cloud_resource_selection", input_id, tool_use_id, unified)]
        received = {
            "kind": "cloud_resource_selection",
            "inputId": input_id,
            "toolUseId": tool_use_id,
            "selectorId": selection["selectorId"],
            "status": selection["status"],
            "value": selection["value"],
            "label": selection["label"],
        }
        p.emit("input_received", received, step=step)
        return selection

    @staticmethod
    def _pipe_candidates(p: _PipeRun, step: dict[str, Any]) -> Generator[Any, Any, None]:
        """Two candidates evaluated "in parallel" (interleaved), optionally with two permission waits."""
        pipe = p.pipe
        runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for candidate in CANDIDATES:
            cid = candidate["id"]
            coordinates = {
                "step": step,
                "candidate": {"id": cid, "runId": f"candidate-{cid}-1", "subPipelineId": f"sub-{cid}"},
                "candidate_step": {"id": "price_estimation", "runId": f"cstep-{cid}-price_estimation-1"},
            }
            runs.append((candidate, coordinates))
        for index, (candidate, at) in enumerate(runs, 1):
            data = {"candidateId": candidate["id"], "label": candidate["label"], "index": index, "total": len(runs)}
            p.emit("candidate_started", data, step=step, candidate=at["candidate"])
        for _, at in runs:
            p.emit("candidate_step_started", {"name": "price_estimation", "index": 1, "total": 1}, **at)
        for _, at in runs:
            p.emit("message_started", {"messageId": "msg_" + _hex(24)}, **at)
        for candidate, at in runs:
            p.emit("text_delta", {"text": f"{candidate['label']}: "}, **at)
        with p.batch():
            for _, at in runs:
                p.emit("text_delta", {"text": "estimating the monthly cost."}, **at)
        if "PIPE-PERMS" in pipe.flags:
            envelopes: list[dict[str, Any]] = []
            waits: list[_Pending] = []
            for candidate, at in runs:
                cid = candidate["id"]
                tool_use_id = f"call_price_{cid}_" + _hex(8)
                p.emit(
                    "tool_started",
                    {"toolUseId": tool_use_id, "toolName": "describe_prices", "input": {"candidate": cid}},
                    **at,
                )
                input_id = "permission-" + uuid.uuid4().hex
                envelope = {
                    "schemaVersion": 1.0,
                    "kind": "permission",
                    "required": True,
                    "language": pipe.language,
                    "requestTaskId": pipe.task_id,
                    "contextId": pipe.context_id,
                    "inputId": input_id,
                    "toolUseId": tool_use_id,
                    "toolName": "describe_prices",
                    "title": "Query cloud prices",
                    "purpose": f"Look up the monthly cost of {candidate['label']}.",
                    "effect": "read",
                    "target": "bss:DescribePrice",
                    "isReadOnly": True,
                    "prompt": "Query cloud prices Allow once?",
                    "safeSummary": 'describe_prices: {"candidate":"' + cid + '"}',
                    "options": [{"id": "allow_once", "label": "Allow once"}, {"id": "deny", "label": "Deny"}],
                    "scope": "candidate",
                    "subPipelineId": f"sub-{cid}",
                }
                permission = {
                    "pending": True,
                    "toolUseId": tool_use_id,
                    "toolName": "describe_prices",
                    "autoApproved": False,
                }
                waits.append(
                    _Pending(
                        "permission", input_id, tool_use_id, envelope, permission, {"candidate": cid, "coords": at}
                    )
                )
                data = {
                    key: envelope[key]
                    for key in (
                        "kind",
                        "inputId",
                        "toolUseId",
                        "toolName",
                        "title",
                        "prompt",
                        "effect",
                        "target",
                        "options",
                    )
                }
                data.update(candidateId=cid, subPipelineId=f"sub-{cid}")
                envelopes.append(p.event("permission_requested", data, status="input_required", **at))
            answers = yield envelopes, waits
            decisions = {pending.extra["candidate"]: decision for pending, decision in answers}
            for (candidate, at), wait in zip(runs, waits, strict=True):
                denied = decisions.get(candidate["id"]) != "allow_once"
                result = (
                    "The user denied permission to run describe_prices."
                    if denied
                    else f"{candidate['label']} costs {candidate['totalMonthlyCost']} CNY per month."
                )
                data = {
                    "toolUseId": wait.tool_use_id,
                    "toolName": "describe_prices",
                    "isError": denied,
                    "result": result,
                    "input": {"candidate": candidate["id"]},
                }
                p.emit("tool_result", data, **at)
        for _, at in runs:
            p.emit("candidate_step_completed", {"name": "price_estimation", "durationS": 0.01}, **at)
        for candidate, at in runs:
            data = {
                "candidateId": candidate["id"],
                "label": candidate["label"],
                "totalMonthlyCost": candidate["totalMonthlyCost"],
            }
            p.emit("candidate_completed", data, step=step, candidate=at["candidate"])

    @staticmethod
    def _pipe_complete_step(p: _PipeRun, step: dict[str, Any], conclusion: dict[str, Any], *, ooo: bool) -> None:
        """complete_step: tool_started, usage + context_usage, tool_result, step_completed.

        With ``ooo`` the two usage envelopes go out in reverse order and the
        tool_result exists only in the journal (a gap on the live stream).
        """
        name = step["id"]
        tool_use_id = "call_complete_" + _hex(12)
        tool_input = {"conclusion": conclusion}
        p.emit("tool_started", {"toolUseId": tool_use_id, "toolName": "complete_step", "input": tool_input}, step=step)
        result = {
            "toolUseId": tool_use_id,
            "toolName": "complete_step",
            "isError": False,
            "result": f"Step {name.replace('_', ' ').capitalize()} completed. Conclusion submitted.",
            "input": tool_input,
            "normalizedConclusion": conclusion,
        }
        if ooo:
            usage = p.event("usage", dict(_PIPE_USAGE), step=step)
            context_usage = p.event("context_usage", _context_usage(2), step=step)
            p.event("tool_result", result, step=step)  # journal only
            p.send(context_usage)
            p.send(usage)
        else:
            with p.batch():
                p.emit("usage", dict(_PIPE_USAGE), step=step)
                p.emit("context_usage", _context_usage(2), step=step)
            p.emit("tool_result", result, step=step)
        data = {"durationS": 0.05, "conclusionField": PIPELINE_FIELDS[name], "conclusion": conclusion}
        p.emit("step_completed", data, step=step)

    def _pipe_fail(self, p: _PipeRun, step: dict[str, Any]) -> None:
        error_id = _hex(12)
        details = {
            "type": "StepFailed",
            "errorId": error_id,
            "traceback": "Stack trace omitted from public event; see error_id.",
            "step_id": step["id"],
        }
        data = {"errorSummary": STEP_FAIL_TEXT, "error": STEP_FAIL_TEXT, "errorDetails": details}
        p.emit("step_failed", data, status="failed", step=step)
        p.emit(
            "pipeline_error",
            {"error": STEP_FAIL_TEXT, "errorId": error_id, "stepId": step["id"], "recoverable": False},
            status="failed",
        )
        self._pipe_finish(p, "failed")

    @staticmethod
    def _pipe_finish(p: _PipeRun, outcome: str) -> None:
        """The end pattern of capture 38: two journal-only events, then 21, 23, 22, 24 live."""
        failed = outcome == "failed"
        status = "failed" if failed else "completed"
        terminal = "pipeline_failed" if failed else "pipeline_completed"
        total = len(PIPELINE_STEPS)
        terminal_data = (
            {"totalSteps": total, "failed": True}
            if failed
            else {"totalSteps": total, "earlyExit": outcome == "early_exit"}
        )
        handoff = {
            "action": "switch_to_normal",
            "targetMode": "normal",
            "outcome": outcome,
            "summary": _handoff_summary(p.pipe.name, outcome),
            "cleanup": {
                "status": "unavailable",
                "statusMessage": "Cleanup state unavailable. Inspect the session file and cloud resources manually.",
            },
        }
        p.event(terminal, dict(terminal_data), status=status, visibility="pending_backup")
        p.event("pipeline_handoff_ready", copy.deepcopy(handoff), status=status, visibility="pending_backup")
        done = p.event(terminal, dict(terminal_data), status=status, visibility="committed")
        ready = p.event("pipeline_handoff_ready", copy.deepcopy(handoff), status=status, visibility="committed")
        backups = [
            p.event(
                "backup_committed",
                {
                    "committedEventId": e["eventId"],
                    "committedEventType": e["eventType"],
                    "committedSequence": e["sequence"],
                },
                status=status,
            )
            for e in (done, ready)
        ]
        p.send(done)
        p.send(backups[0])
        p.send(ready)
        p.send(backups[1], close=True)


def _permission_answer(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The permission decision carried by a message, if it is one.

    Raises the kernel's -32602 error when the payload is recognisably a
    permission answer but its fields do not match schemaVersion 1.
    """
    payload: Any = None
    allowed = PERMISSION_KEYS
    data_parts = [p for p in parts if isinstance(p.get("data"), dict) and p["data"].get("kind") == "permission"]
    if data_parts:
        if len(parts) != 1:
            raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
        payload = data_parts[0]["data"]
    elif (
        len(parts) == 1
        and isinstance(parts[0].get("text"), str)
        and parts[0]["text"].startswith(PERMISSION_TEXT_PREFIX)
    ):
        try:
            payload = json.loads(parts[0]["text"][len(PERMISSION_TEXT_PREFIX) :])
        except ValueError:
            raise _invalid_params(PERMISSION_FIELDS_MISMATCH) from None
        allowed = PERMISSION_KEYS | {"contextId"}
    else:
        return None
    if not isinstance(payload, dict) or set(payload) != allowed:
        raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
    version = payload["schemaVersion"]
    if isinstance(version, bool) or version not in (1, "1", "1.0"):
        raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
    if payload["kind"] != "permission" or payload["decision"] not in PERMISSION_DECISIONS:
        raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
    for key in ("requestTaskId", "inputId", "toolUseId") + (("contextId",) if "contextId" in allowed else ()):
        if not isinstance(payload[key], str) or not payload[key]:
            raise _invalid_params(PERMISSION_FIELDS_MISMATCH)
    return payload


def _pipeline_name(iac: dict[str, Any]) -> str | None:
    """The pipeline a new turn asks for (``None``: a normal turn); unknown names are -32602."""
    if iac.get("run_mode") != "pipeline":
        return None
    name = iac.get("pipeline_name")
    if name is None or name == "":
        return PIPELINE_NAMES[0]
    if not isinstance(name, str) or name not in PIPELINE_NAMES:
        raise _invalid_params(f"Unknown pipeline_name: {name}")
    return name


def _json_response(obj: Any, status: int = 200) -> Response:
    return Response(_dumps(obj), status=status, content_type="application/json")


def _rpc_error(rid: Any, error: RpcError) -> Response:
    return _json_response({"error": error.to_error(), "id": rid, "jsonrpc": "2.0"})


def create_app(
    state: KernelState | None = None,
    *,
    token: str | None = None,
    delay_scale: float = 1.0,
    keepalive_seconds: float = 15.0,
) -> ScriptedKernelApp:
    """The scripted kernel as a WSGI app (keyword options apply when ``state`` is None)."""
    if state is None:
        state = KernelState(token, delay_scale=delay_scale, keepalive_seconds=keepalive_seconds)
    return ScriptedKernelApp(state)


# --------------------------------------------------------------------------- launcher


class _QuietRequestHandler(WSGIRequestHandler):
    """Werkzeug's handler without the per-request access log (errors still go to stderr)."""

    protocol_version = "HTTP/1.1"  # chunked transfer encoding for the SSE generators

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class ScriptedKernel:
    """Runs the scripted kernel on a threaded Werkzeug server in a daemon thread.

    >>> with ScriptedKernel(token="t", delay_scale=0.01) as kernel:  # doctest: +SKIP
    ...     requests.get(kernel.url + "health", headers={"Authorization": "Bearer t"})
    """

    def __init__(
        self,
        token: str | None = None,
        *,
        delay_scale: float = 1.0,
        keepalive_seconds: float = 15.0,
        log_requests: bool = False,
    ) -> None:
        self.token = token or None
        self.state = KernelState(self.token, delay_scale=delay_scale, keepalive_seconds=keepalive_seconds)
        self.app = ScriptedKernelApp(self.state)
        self.url = ""
        self._log_requests = log_requests
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON-RPC request log (a snapshot; safe to read from any thread)."""
        return self.state.requests

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind, serve in a daemon thread, and return the base URL (with a trailing slash)."""
        if self._server is not None:
            raise RuntimeError("the scripted kernel is already running")
        handler = WSGIRequestHandler if self._log_requests else _QuietRequestHandler
        server = make_server(host, port, self.app, threaded=True, request_handler=handler)
        url_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{url_host}:{server.server_port}/"
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-kernel",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        return self.url

    def stop(self) -> None:
        """Cancel running scripts, close open streams and stop the server."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        server.shutdown()  # no new requests; in-flight ones finish below
        self.state.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> ScriptedKernel:  # noqa: PYI034 - typing.Self needs 3.11
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
