"""Validation of the AG-UI ``RunAgentInput`` envelope and its ``forwardedProps.iacCode`` extension.

Why this module exists: the request body is the adapter's only untrusted input, and the
contract wants a precise, localizable 400 *before* any state is touched. Upstream collapses
every extension error into one generic message and lets empty ids through (§2.1/§8 of the
upstream spec); here the two JSON Schemas shipped in ``agui_adapter/protocol/schemas`` are the single
source of truth, and the first schema violation is mapped to a message template of
``messages`` that names the offending field (``forwardedProps.iacCode.thinking.budget``,
``messages[2].role``) without ever echoing its value, because a value can be a secret.

It also owns the notion of *secret fields* of a request: the redacted view used for logs and
for the idempotency digest, so that a retry with a refreshed STS token or API key is the same
request and no secret is ever hashed into anything that is stored.

``forwardedProps`` is a bag AG-UI clients fill for their own purposes (CopilotKit adds
``toolChoice`` when its suggestions are on): only its ``iacCode`` key is the adapter's, and
strict; any other key is accepted and ignored. Ignored means: never read, never forwarded to
the kernel, left out of the redacted view (so never logged) and of the digest (so a retry that
differs only in those keys is the same run: ``DUPLICATE_RUN_ID``, or a reattach, never
``RUN_ID_CONFLICT``).

Sans-I/O: pure functions over parsed JSON; the schemas are package data read once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol import fastschema
from agui_adapter.protocol.errors import AguiError, Code

if TYPE_CHECKING:  # jsonschema is imported on first use (``_validator``): most requests never need it
    from jsonschema import ValidationError

__all__ = [
    "MAX_JSON_DEPTH",
    "SECRET_PATHS",
    "THREAD_HEADER",
    "IacCodeProps",
    "ResumeEntry",
    "RunInput",
    "check_json_text",
    "format_field",
    "preferred_language_hint",
    "redact_secrets",
    "check_thread_header",
    "request_digest",
    "validate_run_input",
]

_ENVELOPE_SCHEMA = "run_agent_input.json"
_IAC_CODE_SCHEMA = "iac_code_props.json"

#: Paths (inside the request body) of the values that are secrets. ``llmHeaders`` is a map
#: whose header *values* are secret (they typically carry credentials); its names are not.
SECRET_PATHS: tuple[tuple[str, ...], ...] = (
    ("forwardedProps", "iacCode", "llmApiKey"),
    ("forwardedProps", "iacCode", "alibabaCloud", "accessKeySecret"),
    ("forwardedProps", "iacCode", "alibabaCloud", "securityToken"),
    ("forwardedProps", "iacCode", "llmHeaders"),
)
_MAP_OF_SECRETS: frozenset[tuple[str, ...]] = frozenset({("forwardedProps", "iacCode", "llmHeaders")})

#: The one key of ``forwardedProps`` that is the adapter's; the others are ignored.
_IAC_CODE_KEY = "iacCode"

#: What a secret value is replaced with in the redacted view. A placeholder (rather than
#: deleting the key) keeps "a key was given" distinguishable from "no key was given".
REDACTED = "[redacted]"


# --- results ------------------------------------------------------------------------


@dataclass(frozen=True)
class IacCodeProps:
    """The validated ``forwardedProps.iacCode`` extension (null optionals become ``None``)."""

    schema_version: int
    ros_invocation_id: str
    cwd: str
    model: str | None = None
    llm_api_key: str | None = field(default=None, repr=False)
    llm_headers: dict[str, str] | None = field(default=None, repr=False)
    #: ``{"enabled"?: bool, "effort"?: str, "budget"?: int}``; null members are dropped.
    thinking: dict[str, Any] | None = None
    user_id: str | None = None
    channel: str | None = None
    preferred_language: str | None = None
    candidate_presentation: str | None = None
    run_mode: str | None = None
    pipeline_name: str | None = None
    cleanup_only: bool = False
    active_guidance: bool = False
    #: Keys among accessKeyId, accessKeySecret, securityToken, regionId; null members dropped.
    alibaba_cloud: dict[str, str] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ResumeEntry:
    """One answer of a resume request. ``has_payload`` tells an explicit ``payload`` key
    (even ``null``) from an absent one."""

    interrupt_id: str
    status: str
    payload: Any = None
    has_payload: bool = False


@dataclass(frozen=True)
class RunInput:
    """A schema-valid ``RunAgentInput``."""

    thread_id: str
    run_id: str
    parent_run_id: str | None
    messages: list[dict[str, Any]]
    tools: list[Any]
    props: IacCodeProps
    #: ``None`` for a new run; a list (possibly empty) for a resume request.
    resume: list[ResumeEntry] | None
    #: The parsed body, untouched (it holds secrets, hence not in the repr).
    raw: dict[str, Any] = field(repr=False)


# --- schema loading -----------------------------------------------------------------


def _is_strict_integer(_checker: object, instance: object) -> bool:
    # JSON Schema counts 1.0 as an integer; the contract does not (no coercion).
    return isinstance(instance, int) and not isinstance(instance, bool)


def _strict_validator_class() -> Any:
    """Draft 2020-12 with the contract's integers (jsonschema imported here, on first use:
    an envelope the ``fastschema`` path accepts never needs it, and importing it and its
    dependencies is a third of the adapter's start-up)."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
    )


def _load_schema(name: str) -> dict[str, Any]:
    from importlib import resources  # on first use: not needed to start

    text = resources.files("agui_adapter.protocol").joinpath("schemas", name).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def envelope_schema() -> dict[str, Any]:
    """The envelope schema with its references inlined (built once, on first use).

    The schema files refer to each other (``$ref``); resolving a reference costs jsonschema
    a registry lookup on every request, so the references are inlined once here."""
    envelope = _load_schema(_ENVELOPE_SCHEMA)
    iac_code = _load_schema(_IAC_CODE_SCHEMA)
    return inline_references(envelope, {iac_code["$id"]: iac_code})


@cache
def _validator() -> Any:
    """The compiled jsonschema validator of the whole envelope."""
    return _strict_validator_class()(envelope_schema())


@cache
def _fast_check() -> fastschema.Check | None:
    """The envelope schema compiled by ``fastschema`` (None: not compilable, jsonschema only)."""
    try:
        return fastschema.compile_schema(envelope_schema())
    except fastschema.Unsupported:
        return None


def inline_references(schema: dict[str, Any], resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``schema`` with every ``{"$ref": ...}`` replaced by what it names: one of its own
    ``$defs`` (``#/$defs/name``) or a whole resource by its ``$id`` (no cycles allowed)."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and len(node) == 1:
            if ref.startswith("#/$defs/"):
                return resolve(definitions[ref[len("#/$defs/") :]])
            # a resource's own "$schema" would make jsonschema pick another validator class
            # and drop the strict integer check: only its content is taken
            return resolve({k: v for k, v in resources[ref].items() if k not in ("$id", "$schema")})
        return {key: resolve(value) for key, value in node.items() if key != "$defs"}

    return dict(resolve(schema))


# --- error mapping --------------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")
_MAX_KEY_SHOWN = 64

# Among errors on the same instance, the most fundamental one wins.
_VALIDATOR_RANK = {name: rank for rank, name in enumerate(fastschema.KEYWORD_ORDER)}

_TYPE_MESSAGES = {
    "string": messages.FIELD_STRING,
    "object": messages.FIELD_OBJECT,
    "array": messages.FIELD_ARRAY,
    "boolean": messages.FIELD_BOOLEAN,
    "integer": messages.FIELD_INTEGER,
}


def _format_key(key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return key
    shown = key if len(key) <= _MAX_KEY_SHOWN else key[:_MAX_KEY_SHOWN] + "…"
    return json.dumps(shown)


def format_field(path: tuple[str | int, ...] | list[str | int]) -> str:
    """``("messages", 2, "role")`` → ``messages[2].role``; odd keys are JSON-quoted."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = _format_key(part)
            if key.startswith('"'):
                out += f"[{key}]"
            else:
                out += f".{key}" if out else key
    return out or "RunAgentInput"


def _path_key(error: ValidationError) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in error.absolute_path)


def _sort_key(error: ValidationError) -> tuple[Any, ...]:
    validator = str(error.validator)
    return (_path_key(error), _VALIDATOR_RANK.get(validator, len(_VALIDATOR_RANK)), validator)


def _allowed(values: list[Any]) -> str:
    return ", ".join(str(v) for v in values if v is not None)


def _error_for(error: ValidationError) -> AguiError:
    """Translate one jsonschema error into a field-naming ``INVALID_INPUT``."""
    return _refusal(
        list(error.absolute_path),
        str(error.validator),
        error.schema if isinstance(error.schema, dict) else {},
        error.instance,
        error.validator_value,
        names_a_key="propertyNames" in error.schema_path,
    )


def _refusal(
    path: list[str | int], keyword: str, schema: dict[str, Any], instance: Any, value: Any, *, names_a_key: bool
) -> AguiError:
    """The ``INVALID_INPUT`` for the first error of a node: at ``path``, ``keyword`` of the
    node's ``schema`` (whose value is ``value``) failed on ``instance``; ``names_a_key``
    when it was a key that failed (``propertyNames``)."""

    def fail(template: str, **params: Any) -> AguiError:
        return AguiError(Code.INVALID_INPUT, template, {"field": format_field(path), **params})

    if names_a_key:  # a bad key (e.g. an llmHeaders name)
        return fail(messages.FIELD_INVALID)
    if keyword == "required" and isinstance(instance, dict):
        missing = [name for name in value if name not in instance]
        path.append(missing[0] if missing else "")
        return fail(messages.FIELD_REQUIRED)
    if keyword == "additionalProperties" and isinstance(instance, dict):
        known = schema.get("properties", {})
        unknown = sorted(str(k) for k in instance if k not in known)
        path.append(unknown[0] if unknown else "")
        return fail(messages.FIELD_UNKNOWN)
    # A field fixed to one value or a few reports that, whatever keyword failed.
    if "const" in schema:
        return fail(messages.FIELD_CONST, value=json.dumps(schema["const"]))
    if "enum" in schema:
        return fail(messages.FIELD_ENUM, allowed=_allowed(schema["enum"]))
    if keyword == "type":
        types = value if isinstance(value, list) else [value]
        for name in types:
            if name in _TYPE_MESSAGES:
                return fail(_TYPE_MESSAGES[name])
        return fail(messages.FIELD_INVALID)
    if keyword == "minLength":
        if value == 1:
            return fail(messages.FIELD_NOT_EMPTY)
        return fail(messages.FIELD_INVALID)
    if keyword == "maxLength":
        return fail(messages.FIELD_TOO_LONG, limit=value)
    if keyword == "minimum":
        return fail(messages.FIELD_MINIMUM, limit=value)
    if keyword == "maximum":
        return fail(messages.FIELD_MAXIMUM, limit=value)
    return fail(messages.FIELD_INVALID)


# --- what JSON itself lets through --------------------------------------------------------

#: How deeply a request body may nest arrays and objects. Deep enough for any real
#: ``state`` or resume payload; shallow enough that nothing downstream (copies, digests,
#: the kernel's own encoders) can run out of stack on it.
MAX_JSON_DEPTH = 100
_MAX_FIELD_SHOWN = 200
# A JSON escape of a UTF-16 surrogate: the only way a lone one can reach a parsed string
# (raw UTF-8 cannot encode surrogates, and the decoder refuses such bytes).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown_field(path: list[str | int]) -> str:
    shown = format_field(path)
    return shown if len(shown) <= _MAX_FIELD_SHOWN else shown[: _MAX_FIELD_SHOWN - 1] + "…"


def check_json_text(payload: object, body: bytes) -> None:
    """Refuse what valid JSON allows but nothing downstream can carry: nesting deeper than
    :data:`MAX_JSON_DEPTH`, and lone UTF-16 surrogates (``"\\ud800"``) in any string or key,
    which cannot be encoded as UTF-8 and so can be neither stored nor sent to the kernel.

    ``body`` is the raw request the payload was parsed from; it only decides cheaply
    whether the walk is needed at all (few brackets, no surrogate escape: nothing to do).
    Raises ``AguiError(Code.INVALID_INPUT, …)`` naming the field.
    """
    check_depth = body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH
    check_text = _SURROGATE_ESCAPE.search(body) is not None
    if not (check_depth or check_text):
        return
    stack: list[tuple[object, list[str | int]]] = [(payload, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if check_text and _LONE_SURROGATE.search(node):
                raise AguiError(Code.INVALID_INPUT, messages.FIELD_NOT_UNICODE, {"field": _shown_field(path)})
            continue
        if not isinstance(node, (dict, list)):
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise AguiError(
                Code.INVALID_INPUT, messages.FIELD_TOO_DEEP, {"field": _shown_field(path[:2]), "limit": MAX_JSON_DEPTH}
            )
        if isinstance(node, dict):
            for key, value in reversed(node.items()):
                if check_text and _LONE_SURROGATE.search(key):
                    raise AguiError(Code.INVALID_INPUT, messages.FIELD_NOT_UNICODE, {"field": _shown_field(path)})
                stack.append((value, [*path, key]))
        else:
            stack.extend((value, [*path, index]) for index, value in reversed(list(enumerate(node))))


# --- public API -------------------------------------------------------------------------


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _without_nulls(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if v is not None}


def _props(data: dict[str, Any]) -> IacCodeProps:
    headers = data.get("llmHeaders")
    return IacCodeProps(
        schema_version=data["schemaVersion"],
        ros_invocation_id=data["rosInvocationId"],
        cwd=data["cwd"],
        model=_optional_str(data, "model"),
        llm_api_key=_optional_str(data, "llmApiKey"),
        llm_headers=dict(headers) if isinstance(headers, dict) else None,
        thinking=_without_nulls(data.get("thinking")),
        user_id=_optional_str(data, "userId"),
        channel=_optional_str(data, "channel"),
        preferred_language=_optional_str(data, "preferredLanguage"),
        candidate_presentation=_optional_str(data, "candidatePresentation"),
        run_mode=_optional_str(data, "runMode"),
        pipeline_name=_optional_str(data, "pipelineName"),
        cleanup_only=data.get("cleanupOnly", False),
        active_guidance=data.get("activeGuidance", False),
        alibaba_cloud=_without_nulls(data.get("alibabaCloud")),
    )


def _resume(value: Any) -> list[ResumeEntry] | None:
    if value is None:
        return None
    return [
        ResumeEntry(
            interrupt_id=entry["interruptId"],
            status=entry["status"],
            payload=entry.get("payload"),
            has_payload="payload" in entry,
        )
        for entry in value
    ]


def _first_refusal(payload: dict[str, Any]) -> AguiError | None:
    """The refusal for jsonschema's first error on the envelope (in ``_sort_key`` order), or
    None when it is valid.

    The compiled fast path (``fastschema``) decides whether the envelope is valid and, when
    not, which node and keyword hold the first error: the refusal is worded from those,
    as ``_error_for`` words jsonschema's. jsonschema itself decides when the schema could
    not be compiled, or for a ``false`` schema.
    """
    fast = _fast_check()
    if fast is not None:
        failure = fast(payload)
        if failure is None:
            return None
        path, schema, keyword = failure
        if keyword != "false":
            node: Any = payload
            for part in path:
                node = node[part]
            names_a_key = keyword == "propertyNames"
            return _refusal(list(path), keyword, schema, node, schema.get(keyword), names_a_key=names_a_key)
    return _jsonschema_refusal(payload)


def _jsonschema_refusal(payload: dict[str, Any]) -> AguiError | None:
    errors = sorted(_validator().iter_errors(payload), key=_sort_key)
    return _error_for(errors[0]) if errors else None


#: The test hook of the fast path (``cross_check``): None in production.
_cross_check_log: list[str] | None = None


def cross_check(log: list[str] | None) -> None:
    """Test hook: with a list, every envelope ``validate_run_input`` sees is also checked by
    jsonschema alone, and each one on which the answers differ (valid or not, or the error
    it reports) is described in ``log``; None turns the double check off."""
    global _cross_check_log
    _cross_check_log = log


def _verdict(refusal: AguiError | None) -> tuple[str, str, dict[str, Any]] | None:
    return None if refusal is None else (refusal.code, refusal.message, dict(refusal.params))


def _cross_check(payload: dict[str, Any], refusal: AguiError | None) -> None:
    expected = _verdict(_jsonschema_refusal(payload))
    got = _verdict(refusal)
    if got != expected and _cross_check_log is not None:
        _cross_check_log.append(f"{json.dumps(payload, default=repr)[:2000]}: fast {got}, jsonschema {expected}")


def validate_run_input(payload: object) -> RunInput:
    """Check a parsed request body against the contract and return its typed view.

    Raises ``AguiError(Code.INVALID_INPUT, …)`` naming the first offending field (errors are
    ordered by path, then by how fundamental the failed keyword is, so the answer is
    deterministic). A non-empty ``tools`` is refused after the schema passes.
    """
    if not isinstance(payload, dict):
        raise AguiError(Code.INVALID_INPUT, messages.NOT_AN_OBJECT)
    refusal = _first_refusal(payload)
    if _cross_check_log is not None:
        _cross_check(payload, refusal)
    if refusal is not None:
        raise refusal
    tools = payload.get("tools", [])
    if tools:
        raise AguiError(Code.INVALID_INPUT, messages.TOOLS_NOT_SUPPORTED)
    parent = payload.get("parentRunId")
    return RunInput(
        thread_id=payload["threadId"],
        run_id=payload["runId"],
        parent_run_id=parent if isinstance(parent, str) else None,
        messages=payload["messages"],
        tools=list(tools),
        props=_props(payload["forwardedProps"]["iacCode"]),
        resume=_resume(payload.get("resume")),
        raw=payload,
    )


#: The optional routing header of ``POST /``: a load balancer hashes it (consistent hashing) so
#: that every request of a thread reaches the machine that holds the thread's workspace and
#: kernel session (``deploy/nginx-sticky-threads.conf``).
THREAD_HEADER = "X-AGUI-Thread-Id"


def check_thread_header(header: str | None, thread_id: str) -> None:
    """Refuse a request whose ``X-AGUI-Thread-Id`` header differs from its body's ``threadId``.

    The header is optional (``None``: nothing to check). When present it must equal the
    ``threadId`` exactly (no trimming, no case folding): a proxy routed the request by the
    header, so a different body would run the thread on a machine that does not hold it.
    Raises ``AguiError("INVALID_INPUT", …)`` naming the header, never echoing either value.
    """
    if header is not None and header != thread_id:
        raise AguiError("INVALID_INPUT", messages.THREAD_HEADER_MISMATCH)


def preferred_language_hint(payload: object) -> object:
    """``forwardedProps.iacCode.preferredLanguage`` if reachable through objects, else None.

    Read before validation so that even an envelope error can be localized; the value is
    unvalidated (the caller normalizes it).
    """
    node: object = payload
    for key in ("forwardedProps", "iacCode", "preferredLanguage"):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def redact_secrets(payload: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``payload`` whose secret values are replaced by a placeholder, and
    whose ``forwardedProps`` keeps only ``iacCode`` (the other keys are the client's own,
    ignored by the adapter, so neither logged nor digested).

    Header names of ``llmHeaders`` are kept, their values are not. Works on invalid bodies
    too (for logging): anything not reachable through objects is left alone.
    """
    return copy.deepcopy(_redacted_view(payload))


def _redacted_view(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with its secret values replaced, for reading only: the objects on the
    way to a secret are copied, everything else is shared with ``payload``."""
    redacted = dict(payload)
    copied = {id(redacted)}
    forwarded = redacted.get("forwardedProps")
    if isinstance(forwarded, dict) and any(key != _IAC_CODE_KEY for key in forwarded):
        forwarded = redacted["forwardedProps"] = {k: v for k, v in forwarded.items() if k == _IAC_CODE_KEY}
        copied.add(id(forwarded))
    for path in SECRET_PATHS:
        node: Any = redacted
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                node = None
                break
            if id(child) not in copied:  # each object on the way is copied once
                child = node[key] = dict(child)
                copied.add(id(child))
            node = child
        if not isinstance(node, dict) or path[-1] not in node:
            continue
        value = node[path[-1]]
        if value is None:
            continue
        if path in _MAP_OF_SECRETS and isinstance(value, dict):
            node[path[-1]] = {name: REDACTED for name in value}
        else:
            node[path[-1]] = REDACTED
    return redacted


def request_digest(payload: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of the redacted body.

    Same ``json.dumps`` options as upstream, but over :func:`redact_secrets`, so a retry
    that only refreshes an STS token or API key, or changes ``forwardedProps`` keys other
    than ``iacCode`` (which the adapter ignores), is the *same* request, and no secret is
    hashed into stored state. Lone surrogates (legal in parsed JSON) are kept as is.
    """
    canonical = json.dumps(_redacted_view(payload), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
