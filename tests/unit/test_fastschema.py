"""The envelope validator's fast path (``fastschema``) agrees with jsonschema.

jsonschema is the source of truth for the envelope; the compiled fast path may only answer
what jsonschema would. The whole suite double-checks every envelope a test sends (the
``fast_validation_agrees_with_jsonschema`` fixture of ``tests/conftest.py``); here generated
envelopes, near-valid ones with wrong values in every field, are checked the same way (a hundred
of each kind in the unit suite, which must take seconds; tens of thousands under ``-m soak``),
and the compiler's own rules are pinned down.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_adapter.protocol import fastschema, validation
from agui_adapter.protocol.errors import AguiError

AGREE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOAK = settings(max_examples=20000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = (
    "threadId runId parentRunId state messages tools context forwardedProps resume iacCode id role content "
    "interruptId status payload metadata schemaVersion rosInvocationId cwd model llmApiKey llmHeaders thinking "
    "enabled effort budget userId channel preferredLanguage candidatePresentation runMode pipelineName "
    "cleanupOnly activeGuidance alibabaCloud accessKeyId accessKeySecret securityToken regionId"
).split()
ODD_STRINGS = [
    "",
    "x",
    "standard",
    "rich",
    "normal",
    "pipeline",
    "user",
    "assistant",
    "tool",
    "resolved",
    "cancelled",
    "X-Token",
    "bad key",
    "a\nb",
    "a\rb",
    "a\x00b",
    "é",
    "x" * 256,
    "x" * 257,
    "u" * 1025,
    "/abs/path",
]
ODD_NUMBERS = [0, 1, 2, -1, 1.0, 0.5, 2**53 - 1, 2**53, 10**40, float("inf"), float("nan"), True, False]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(ODD_STRINGS),
    st.sampled_from(ODD_NUMBERS),
)
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(ODD_STRINGS), st.text(max_size=4))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)


def some_of(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=optional)


id_text = st.text(min_size=1, max_size=8)
opt_text = st.one_of(st.none(), st.text(max_size=5))
header_value = st.text(max_size=4).filter(lambda v: not any(c in v for c in "\r\n\x00"))
header_name = st.text(alphabet="!#$%&'*+.^_`|~09AZaz-", min_size=1, max_size=4)
valid_iac_code = some_of(
    {
        "schemaVersion": st.just(1),
        "rosInvocationId": st.one_of(id_text, st.just("x" * 256)),
        "cwd": st.sampled_from(["/ws", "rel"]),
    },
    {
        "model": opt_text,
        "llmApiKey": opt_text,
        "llmHeaders": st.one_of(st.none(), st.dictionaries(header_name, header_value, max_size=3)),
        "thinking": st.one_of(
            st.none(),
            some_of(
                {},
                {
                    "enabled": st.booleans(),
                    "effort": opt_text,
                    "budget": st.one_of(st.none(), st.integers(1, 2**53 - 1)),
                },
            ),
        ),
        "userId": st.one_of(opt_text, st.just("u" * 1024)),
        "channel": opt_text,
        "preferredLanguage": opt_text,
        "candidatePresentation": st.sampled_from(["standard", "rich", None]),
        "runMode": st.sampled_from(["normal", "pipeline", None]),
        "pipelineName": opt_text,
        "cleanupOnly": st.booleans(),
        "activeGuidance": st.booleans(),
        "alibabaCloud": st.one_of(
            st.none(),
            some_of({}, {k: opt_text for k in ("accessKeyId", "accessKeySecret", "securityToken", "regionId")}),
        ),
    },
)
valid_message = some_of(
    {"role": st.sampled_from(["developer", "system", "assistant", "user", "tool", "activity", "reasoning"])},
    {"id": st.text(max_size=4), "content": values, "name": values},
)
valid_resume_entry = some_of(
    {"interruptId": id_text, "status": st.sampled_from(["resolved", "cancelled"])},
    {"payload": values, "metadata": st.one_of(st.none(), st.dictionaries(keys, values, max_size=2))},
)
valid_envelopes = some_of(
    {
        "threadId": st.one_of(id_text, st.just("x" * 256)),
        "runId": id_text,
        "messages": st.lists(valid_message, max_size=3),
        # keys other than iacCode are the client's own (CopilotKit's toolChoice): accepted, ignored
        "forwardedProps": st.fixed_dictionaries(
            {"iacCode": valid_iac_code}, optional={"toolChoice": values, "x-app": values}
        ),
    },
    {
        "parentRunId": opt_text,
        "state": values,
        "tools": st.lists(values, max_size=1),
        "context": st.lists(values, max_size=1),
        "resume": st.one_of(st.none(), st.lists(valid_resume_entry, max_size=3)),
        "protocolVersion": values,
    },
)


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path inside ``value`` (the root included)."""
    found = [path]
    if isinstance(value, dict):
        for key, member in value.items():
            found += _nodes(member, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nodes(item, (*path, index))
    return found


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid envelope with none to three things made wrong: a value replaced by anything
    (or by a near miss), a member deleted, an unknown member added."""
    payload = draw(valid_envelopes)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_nodes(payload)))
        if not path:
            continue
        parent: Any = payload
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.append(draw(values))
    return payload


def checked(payload: Any) -> list[str]:
    """What the double check says about ``payload`` (the disagreements; empty when none)."""
    disagreements: list[str] = []
    validation.cross_check(disagreements)
    try:
        validation.validate_run_input(payload)
    except AguiError:
        pass
    finally:
        validation.cross_check([])  # the session's own log is restored by its fixture below
    return disagreements


@pytest.fixture(autouse=True)
def keep_session_check() -> Any:
    previous = validation._cross_check_log
    yield
    validation.cross_check(previous)


def valid_envelope() -> dict[str, Any]:
    return {
        "threadId": "t-1",
        "runId": "r-1",
        "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": "/ws"}},
    }


def test_the_shipped_schema_compiles() -> None:
    """Without this the fast path would be off and every agreement below trivially true."""
    assert fastschema.compile_schema(validation.envelope_schema())(valid_envelope()) is None


def test_an_accepted_envelope_never_reaches_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_jsonschema() -> Any:
        raise AssertionError("jsonschema was asked")

    monkeypatch.setattr(validation, "_validator", no_jsonschema)
    validation.cross_check(None)
    run_input = validation.validate_run_input(valid_envelope())
    assert run_input.thread_id == "t-1"


def test_a_refusal_names_the_failing_node_and_keyword_without_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = valid_envelope()
    payload["forwardedProps"]["iacCode"]["unknownField"] = True
    path, schema, keyword = fastschema.compile_schema(validation.envelope_schema())(payload)  # type: ignore[misc]
    assert (path, keyword) == (("forwardedProps", "iacCode"), "additionalProperties")
    assert "cwd" in schema["properties"]

    def no_jsonschema() -> Any:
        raise AssertionError("jsonschema was asked")

    monkeypatch.setattr(validation, "_validator", no_jsonschema)
    validation.cross_check(None)
    with pytest.raises(AguiError) as caught:
        validation.validate_run_input(payload)
    assert caught.value.params == {"field": "forwardedProps.iacCode.unknownField"}


@pytest.mark.parametrize(
    ("schema", "value", "keyword"),
    [
        # a node's own errors come in jsonschema's sorted order, whatever the schema's order
        ({"maxLength": 1, "enum": ["a"], "type": "string"}, 7, "type"),
        ({"maxLength": 1, "enum": ["a"]}, "bb", "enum"),
        ({"additionalProperties": False, "required": ["a"]}, {"b": 1}, "required"),
        ({"pattern": "^a", "minLength": 3}, "b", "minLength"),
        ({"pattern": "^a", "not": {"const": "b"}}, "b", "not"),
    ],
)
def test_the_first_keyword_of_a_node_is_jsonschema_s(schema: dict[str, Any], value: Any, keyword: str) -> None:
    failure = fastschema.compile_schema(schema)(value)
    assert failure is not None and failure[2] == keyword


PROPS = ("forwardedProps", "iacCode")


def props(payload: dict[str, Any]) -> dict[str, Any]:
    return payload["forwardedProps"]["iacCode"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda p: p.update(threadId=""), ("threadId",)),
        (lambda p: p["messages"].append({"role": "robot"}), ("messages", 1, "role")),
        (lambda p: p.update(resume=[{"interruptId": "i", "status": "done"}]), ("resume", 0, "status")),
        (lambda p: props(p).update(schemaVersion=True), (*PROPS, "schemaVersion")),
        (lambda p: props(p).update(llmHeaders={"bad key": "v"}), (*PROPS, "llmHeaders")),
        (lambda p: props(p).update(llmHeaders={"K": "a\nb"}), (*PROPS, "llmHeaders", "K")),
        (lambda p: props(p).update(thinking={"budget": 10**40}), (*PROPS, "thinking", "budget")),
        (lambda p: p["messages"].append({"id": "m"}), ("messages", 1)),
        # two failing members: the first in key order wins, as jsonschema's sorted errors
        (lambda p: p.update(runId="", threadId=7), ("runId",)),
    ],
)
def test_the_first_failing_node(mutate: Any, path: tuple[Any, ...]) -> None:
    payload = valid_envelope()
    mutate(payload)
    failure = fastschema.compile_schema(validation.envelope_schema())(payload)
    assert failure is not None and failure[0] == path
    assert checked(payload) == []


def _member_names(schema: dict[str, Any]) -> list[str]:
    return sorted(schema["properties"])


@pytest.mark.parametrize("level", ["envelope", "iacCode"])
def test_of_any_two_failing_members_the_first_is_jsonschema_s(level: str) -> None:
    """Whatever order the schema lists its members in, and the check visits them in."""
    schema = validation.envelope_schema()
    if level == "iacCode":
        schema = schema["properties"]["forwardedProps"]["properties"]["iacCode"]
    names = _member_names(schema)
    pairs = 0
    for first in names:
        for second in names:
            if first >= second:
                continue
            payload = valid_envelope()
            node = payload if level == "envelope" else props(payload)
            node[first] = node[second] = 0.5  # no member of either takes a fraction
            failure = fastschema.compile_schema(validation.envelope_schema())(payload)
            if failure is None:  # both accept it (``state``)
                continue
            pairs += 1
            assert checked(payload) == [], (first, second)
    assert pairs > len(names)


@pytest.mark.parametrize("value", [1, 1.0, True, "1", None])
def test_const_and_integers_follow_jsonschema(value: Any) -> None:
    check = fastschema.compile_schema({"type": "integer", "const": 1})
    strict = value == 1 and isinstance(value, int) and not isinstance(value, bool)
    assert (check(value) is None) is strict


def test_enum_never_confuses_booleans_and_numbers() -> None:
    check = fastschema.compile_schema({"enum": [0, None, "a"]})
    assert check(0) is None and check(0.0) is None and check(None) is None and check("a") is None
    assert check(False) is not None and check("0") is not None


@pytest.mark.parametrize(
    "schema",
    [
        {"anyOf": [{"type": "string"}]},
        {"type": "string", "format": "uri"},
        {"$ref": "#/$defs/x"},
        {"enum": [[1]]},
        {"type": "decimal"},
        {"items": False},
    ],
)
def test_what_is_not_mirrored_is_not_compiled(schema: dict[str, Any]) -> None:
    with pytest.raises(fastschema.Unsupported):
        fastschema.compile_schema(schema)


@AGREE
@given(envelopes())
def test_fast_path_agrees_with_jsonschema_on_generated_envelopes(payload: dict[str, Any]) -> None:
    assert checked(payload) == []


@AGREE
@given(values)
def test_fast_path_agrees_with_jsonschema_on_any_json(payload: Any) -> None:
    assert checked(payload) == []


@pytest.mark.soak
@SOAK
@given(envelopes())
def test_fast_path_agrees_with_jsonschema_soak(payload: dict[str, Any]) -> None:
    assert checked(payload) == []


@pytest.mark.soak
@settings(SOAK, max_examples=5000)
@given(values)
def test_fast_path_agrees_with_jsonschema_on_any_json_soak(payload: Any) -> None:
    assert checked(payload) == []
