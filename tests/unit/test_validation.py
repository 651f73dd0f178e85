"""RunAgentInput validation: which requests are accepted, and what a refusal says."""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.errors import AguiError
from agui_adapter.protocol.validation import (
    SECRET_PATHS,
    IacCodeProps,
    ResumeEntry,
    preferred_language_hint,
    redact_secrets,
    request_digest,
    validate_run_input,
)

API_KEY = "sk-very-secret-api-key"
AK_SECRET = "ak-secret-value-123"
STS_TOKEN = "sts-token-value-456"
HEADER_SECRET = "Bearer header-secret-789"
SECRETS = (API_KEY, AK_SECRET, STS_TOKEN, HEADER_SECRET)


def body(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "threadId": "thread-1",
        "runId": "run-1",
        "state": {},
        "messages": [{"id": "message-1", "role": "user", "content": "Create a VPC template"}],
        "tools": [],
        "context": [],
        "forwardedProps": {
            "iacCode": {
                "schemaVersion": 1,
                "rosInvocationId": "invocation-1",
                "cwd": "/workspace/session-1",
                "runMode": "normal",
            }
        },
    }
    payload.update(overrides)
    return payload


def with_props(**props: Any) -> dict[str, Any]:
    payload = body()
    payload["forwardedProps"]["iacCode"].update(props)
    return payload


def full_props() -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "rosInvocationId": "invocation-1",
        "cwd": "/workspace/session-1",
        "model": "qwen-max",
        "llmApiKey": API_KEY,
        "llmHeaders": {"X-Auth": HEADER_SECRET},
        "thinking": {"enabled": True, "effort": "high", "budget": 2048},
        "userId": "user-1",
        "channel": "console",
        "preferredLanguage": "zh-CN",
        "candidatePresentation": "rich",
        "runMode": "pipeline",
        "pipelineName": "selling",
        "cleanupOnly": True,
        "activeGuidance": True,
        "alibabaCloud": {
            "accessKeyId": "LTAI-id",
            "accessKeySecret": AK_SECRET,
            "securityToken": STS_TOKEN,
            "regionId": "cn-hangzhou",
        },
    }


def refusal(payload: object) -> AguiError:
    with pytest.raises(AguiError) as caught:
        validate_run_input(payload)
    assert caught.value.code == "INVALID_INPUT"
    return caught.value


def assert_refused(payload: object, template: str, **params: Any) -> AguiError:
    error = refusal(payload)
    assert error.message == template
    for key, value in params.items():
        assert error.params.get(key) == value, error.params
    return error


# --- the schemas themselves ------------------------------------------------------------


@pytest.mark.parametrize("name", ["run_agent_input.json", "iac_code_props.json"])
def test_shipped_schemas_are_valid_draft_2020_12(name: str) -> None:
    text = resources.files("agui_adapter.protocol").joinpath("schemas", name).read_text("utf-8")
    schema = json.loads(text)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_iac_code_schema_is_closed_at_every_level() -> None:
    text = resources.files("agui_adapter.protocol").joinpath("schemas", "iac_code_props.json").read_text("utf-8")
    schema = json.loads(text)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["thinking"]["additionalProperties"] is False
    assert schema["properties"]["alibabaCloud"]["additionalProperties"] is False


# --- accepted requests -----------------------------------------------------------------


def test_minimal_contract_request_is_accepted() -> None:
    payload = body()
    run = validate_run_input(payload)
    assert run.thread_id == "thread-1"
    assert run.run_id == "run-1"
    assert run.parent_run_id is None
    assert run.messages == payload["messages"]
    assert run.tools == []
    assert run.resume is None
    assert run.raw is payload
    assert run.props == IacCodeProps(
        schema_version=1, ros_invocation_id="invocation-1", cwd="/workspace/session-1", run_mode="normal"
    )


def test_official_client_body_without_state_tools_context_is_accepted() -> None:
    payload = body(protocolVersion="1.0")
    for key in ("state", "tools", "context"):
        del payload[key]
    run = validate_run_input(payload)
    assert run.tools == []
    assert run.resume is None


def test_all_iac_code_fields_are_mapped() -> None:
    payload = body(parentRunId="run-0")
    payload["forwardedProps"]["iacCode"] = full_props()
    run = validate_run_input(payload)
    props = run.props
    assert run.parent_run_id == "run-0"
    assert props.schema_version == 1
    assert props.model == "qwen-max"
    assert props.llm_api_key == API_KEY
    assert props.llm_headers == {"X-Auth": HEADER_SECRET}
    assert props.thinking == {"enabled": True, "effort": "high", "budget": 2048}
    assert props.user_id == "user-1"
    assert props.channel == "console"
    assert props.preferred_language == "zh-CN"
    assert props.candidate_presentation == "rich"
    assert props.run_mode == "pipeline"
    assert props.pipeline_name == "selling"
    assert props.cleanup_only is True
    assert props.active_guidance is True
    assert props.alibaba_cloud == {
        "accessKeyId": "LTAI-id",
        "accessKeySecret": AK_SECRET,
        "securityToken": STS_TOKEN,
        "regionId": "cn-hangzhou",
    }


def test_defaults_when_optional_fields_are_absent() -> None:
    props = validate_run_input(body()).props
    assert props.cleanup_only is False
    assert props.active_guidance is False
    assert props.thinking is None
    assert props.alibaba_cloud is None
    assert props.llm_headers is None
    assert props.model is None


def test_null_optionals_are_treated_as_absent() -> None:
    nulls = {
        key: None
        for key in (
            "model",
            "llmApiKey",
            "llmHeaders",
            "thinking",
            "userId",
            "channel",
            "preferredLanguage",
            "candidatePresentation",
            "runMode",
            "pipelineName",
            "alibabaCloud",
        )
    }
    props = validate_run_input(with_props(**nulls)).props
    assert props == IacCodeProps(schema_version=1, ros_invocation_id="invocation-1", cwd="/workspace/session-1")


def test_null_members_of_nested_objects_are_dropped() -> None:
    payload = with_props(
        thinking={"enabled": False, "effort": None, "budget": None},
        alibabaCloud={"accessKeyId": "id", "accessKeySecret": None, "securityToken": None, "regionId": None},
    )
    props = validate_run_input(payload).props
    assert props.thinking == {"enabled": False}
    assert props.alibaba_cloud == {"accessKeyId": "id"}


def test_empty_thinking_object_is_kept_as_present() -> None:
    assert validate_run_input(with_props(thinking={})).props.thinking == {}


def test_non_user_messages_are_not_over_validated() -> None:
    history = [
        {"id": "s", "role": "system", "content": "be nice"},
        {"id": "a", "role": "assistant", "toolCalls": [{"id": "c", "type": "function"}], "extra": 1},
        {"id": "t", "role": "tool", "toolCallId": "c", "content": "ok"},
        {"id": "r", "role": "reasoning", "content": "..."},
        {"id": "ac", "role": "activity", "activityType": "x", "content": {}},
        {"role": "developer", "content": "no id is fine"},
        {"id": "u", "role": "user", "content": "hi"},
    ]
    assert validate_run_input(body(messages=history)).messages == history


def test_extra_top_level_keys_are_allowed() -> None:
    validate_run_input(body(protocolVersion="1.0", somethingElse={"x": 1}))


@pytest.mark.parametrize("state", [None, {}, [], "s", 3])
def test_state_may_be_anything(state: object) -> None:
    validate_run_input(body(state=state))


# --- resume -------------------------------------------------------------------------


def test_absent_or_null_resume_is_a_new_run() -> None:
    assert validate_run_input(body()).resume is None
    assert validate_run_input(body(resume=None)).resume is None


def test_empty_resume_is_a_resume_request() -> None:
    assert validate_run_input(body(resume=[])).resume == []


def test_resume_entries_are_parsed() -> None:
    payload = body(
        messages=[],
        resume=[
            {"interruptId": "permission-1", "status": "resolved", "payload": {"decision": "allow_once"}},
            {"interruptId": "question-1", "status": "cancelled", "metadata": {"by": "user"}},
            {"interruptId": "question-2", "status": "resolved", "payload": None},
        ],
    )
    assert validate_run_input(payload).resume == [
        ResumeEntry("permission-1", "resolved", {"decision": "allow_once"}, True),
        ResumeEntry("question-1", "cancelled", None, False),
        ResumeEntry("question-2", "resolved", None, True),
    ]


@pytest.mark.parametrize(
    ("entry", "template", "field"),
    [
        ({"status": "resolved"}, messages.FIELD_REQUIRED, "resume[0].interruptId"),
        ({"interruptId": "i"}, messages.FIELD_REQUIRED, "resume[0].status"),
        ({"interruptId": "", "status": "resolved"}, messages.FIELD_NOT_EMPTY, "resume[0].interruptId"),
        ({"interruptId": 7, "status": "resolved"}, messages.FIELD_STRING, "resume[0].interruptId"),
        ({"interruptId": "i", "status": "done"}, messages.FIELD_ENUM, "resume[0].status"),
        ({"interruptId": "i", "status": "cancelled", "extra": 1}, messages.FIELD_UNKNOWN, "resume[0].extra"),
        (
            {"interruptId": "i", "status": "cancelled", "metadata": "m"},
            messages.FIELD_OBJECT,
            "resume[0].metadata",
        ),
    ],
)
def test_bad_resume_entries_name_the_field(entry: dict[str, Any], template: str, field: str) -> None:
    assert_refused(body(resume=[entry]), template, field=field)


def test_resume_status_enum_lists_allowed_values() -> None:
    error = assert_refused(body(resume=[{"interruptId": "i", "status": "x"}]), messages.FIELD_ENUM)
    assert error.params["allowed"] == "resolved, cancelled"


def test_resume_must_be_an_array() -> None:
    assert_refused(body(resume={"interruptId": "i"}), messages.FIELD_ARRAY, field="resume")
    assert_refused(body(resume=["i"]), messages.FIELD_OBJECT, field="resume[0]")


def test_resume_error_index_points_at_the_bad_entry() -> None:
    entries = [{"interruptId": "a", "status": "resolved", "payload": 1}, {"interruptId": "b", "status": "?"}]
    assert_refused(body(resume=entries), messages.FIELD_ENUM, field="resume[1].status")


# --- envelope errors -------------------------------------------------------------------


@pytest.mark.parametrize("payload", [None, [], "x", 1, True])
def test_non_object_body_is_refused(payload: object) -> None:
    assert_refused(payload, messages.NOT_AN_OBJECT)


@pytest.mark.parametrize("key", ["threadId", "runId", "messages", "forwardedProps"])
def test_required_envelope_fields(key: str) -> None:
    payload = body()
    del payload[key]
    assert_refused(payload, messages.FIELD_REQUIRED, field=key)


@pytest.mark.parametrize("key", ["threadId", "runId"])
def test_empty_ids_are_refused(key: str) -> None:
    assert_refused(body(**{key: ""}), messages.FIELD_NOT_EMPTY, field=key)


@pytest.mark.parametrize(
    ("overrides", "template", "field"),
    [
        ({"threadId": 5}, messages.FIELD_STRING, "threadId"),
        ({"runId": None}, messages.FIELD_STRING, "runId"),
        ({"parentRunId": 3}, messages.FIELD_STRING, "parentRunId"),
        ({"messages": {}}, messages.FIELD_ARRAY, "messages"),
        ({"messages": ["hi"]}, messages.FIELD_OBJECT, "messages[0]"),
        ({"tools": {}}, messages.FIELD_ARRAY, "tools"),
        ({"tools": None}, messages.FIELD_ARRAY, "tools"),
        ({"context": "c"}, messages.FIELD_ARRAY, "context"),
        ({"forwardedProps": None}, messages.FIELD_OBJECT, "forwardedProps"),
        ({"forwardedProps": {}}, messages.FIELD_REQUIRED, "forwardedProps.iacCode"),
        ({"forwardedProps": {"iacCode": "x"}}, messages.FIELD_OBJECT, "forwardedProps.iacCode"),
    ],
)
def test_envelope_type_errors_name_the_field(overrides: dict[str, Any], template: str, field: str) -> None:
    assert_refused(body(**overrides), template, field=field)


def test_message_role_rules() -> None:
    user = {"id": "u", "role": "user", "content": "hi"}
    msgs = [user, user, {"id": "x", "content": "no role"}]
    assert_refused(body(messages=msgs), messages.FIELD_REQUIRED, field="messages[2].role")
    msgs = [user, user, {"id": "x", "role": "robot"}]
    error = assert_refused(body(messages=msgs), messages.FIELD_ENUM, field="messages[2].role")
    assert error.params["allowed"] == "developer, system, assistant, user, tool, activity, reasoning"
    assert_refused(body(messages=[{"id": 1, "role": "user"}]), messages.FIELD_STRING, field="messages[0].id")


def test_index_ordering_is_numeric() -> None:
    msgs = [{"role": "user"}] * 2 + [{"role": 1}] + [{"role": "user"}] * 7 + [{"role": 2}]
    assert_refused(body(messages=msgs), messages.FIELD_ENUM, field="messages[2].role")


@pytest.mark.parametrize(
    "extra",
    [
        {"toolChoice": "auto"},  # what CopilotKit adds when its suggestions are on
        {"toolChoice": {"type": "function", "function": {"name": "x"}}, "other": None},
        {"iac_code": {"schemaVersion": "not even checked"}, "x": [1, {"y": 2}]},
    ],
)
def test_forwarded_props_accepts_and_ignores_keys_other_than_iac_code(extra: dict[str, Any]) -> None:
    plain = validate_run_input(body())
    payload = body()
    payload["forwardedProps"].update(extra)
    run_input = validate_run_input(payload)
    assert run_input.props == plain.props
    assert request_digest(payload) == request_digest(body())
    assert redact_secrets(payload)["forwardedProps"] == body()["forwardedProps"]


def test_iac_code_stays_strict_beside_other_forwarded_props() -> None:
    payload = with_props(unknownField=True)
    payload["forwardedProps"]["toolChoice"] = "auto"
    assert_refused(payload, messages.FIELD_UNKNOWN, field="forwardedProps.iacCode.unknownField")
    payload = body()
    payload["forwardedProps"] = {"toolChoice": "auto"}
    assert_refused(payload, messages.FIELD_REQUIRED, field="forwardedProps.iacCode")


def test_snake_case_aliases_are_not_accepted() -> None:
    payload = body()
    payload["forwardedProps"] = {"iac_code": payload["forwardedProps"]["iacCode"]}
    assert_refused(payload, messages.FIELD_REQUIRED, field="forwardedProps.iacCode")


def test_non_empty_tools_are_refused_after_schema() -> None:
    tool = {"name": "t", "description": "d", "parameters": {}}
    assert_refused(body(tools=[tool]), messages.TOOLS_NOT_SUPPORTED)
    # a schema error wins over the tools rule
    assert_refused(body(tools=[tool], runId=""), messages.FIELD_NOT_EMPTY, field="runId")


def test_first_error_is_deterministic_and_top_level_first() -> None:
    payload = with_props(schemaVersion=2, cwd="")
    del payload["threadId"]
    for _ in range(3):
        assert_refused(payload, messages.FIELD_REQUIRED, field="threadId")


def test_type_error_wins_over_other_keywords_on_the_same_field() -> None:
    assert_refused(
        with_props(rosInvocationId=12), messages.FIELD_STRING, field="forwardedProps.iacCode.rosInvocationId"
    )


# --- forwardedProps.iacCode --------------------------------------------------------------

P = "forwardedProps.iacCode"


@pytest.mark.parametrize("key", ["schemaVersion", "rosInvocationId", "cwd"])
def test_required_iac_code_fields(key: str) -> None:
    payload = body()
    del payload["forwardedProps"]["iacCode"][key]
    assert_refused(payload, messages.FIELD_REQUIRED, field=f"{P}.{key}")


@pytest.mark.parametrize("value", [True, 1.0, "1", 2, 0, None, [1]])
def test_schema_version_must_be_the_integer_one(value: object) -> None:
    error = assert_refused(with_props(schemaVersion=value), messages.FIELD_CONST, field=f"{P}.schemaVersion")
    assert error.params["value"] == "1"


def test_schema_version_from_json_text() -> None:
    for text in ("1.0", "true"):
        payload = body()
        payload["forwardedProps"]["iacCode"]["schemaVersion"] = json.loads(text)
        assert_refused(payload, messages.FIELD_CONST, field=f"{P}.schemaVersion")


def test_ros_invocation_id_rules() -> None:
    assert_refused(with_props(rosInvocationId=""), messages.FIELD_NOT_EMPTY, field=f"{P}.rosInvocationId")
    error = assert_refused(with_props(rosInvocationId="x" * 257), messages.FIELD_TOO_LONG, field=f"{P}.rosInvocationId")
    assert error.params["limit"] == 256
    validate_run_input(with_props(rosInvocationId="é" * 256))  # code points, not bytes


def test_cwd_rules() -> None:
    assert_refused(with_props(cwd=""), messages.FIELD_NOT_EMPTY, field=f"{P}.cwd")
    assert_refused(with_props(cwd=None), messages.FIELD_STRING, field=f"{P}.cwd")
    assert_refused(with_props(cwd=["/a"]), messages.FIELD_STRING, field=f"{P}.cwd")


@pytest.mark.parametrize(
    ("props", "template", "field"),
    [
        ({"model": 1}, messages.FIELD_STRING, f"{P}.model"),
        ({"llmApiKey": 5}, messages.FIELD_STRING, f"{P}.llmApiKey"),
        ({"userId": True}, messages.FIELD_STRING, f"{P}.userId"),
        ({"channel": {}}, messages.FIELD_STRING, f"{P}.channel"),
        ({"preferredLanguage": 1}, messages.FIELD_STRING, f"{P}.preferredLanguage"),
        ({"pipelineName": []}, messages.FIELD_STRING, f"{P}.pipelineName"),
        ({"thinking": "on"}, messages.FIELD_OBJECT, f"{P}.thinking"),
        ({"thinking": {"enabled": "true"}}, messages.FIELD_BOOLEAN, f"{P}.thinking.enabled"),
        ({"thinking": {"enabled": None}}, messages.FIELD_BOOLEAN, f"{P}.thinking.enabled"),
        ({"thinking": {"effort": 3}}, messages.FIELD_STRING, f"{P}.thinking.effort"),
        ({"thinking": {"budget": 5.0}}, messages.FIELD_INTEGER, f"{P}.thinking.budget"),
        ({"thinking": {"budget": True}}, messages.FIELD_INTEGER, f"{P}.thinking.budget"),
        ({"thinking": {"budget": "5"}}, messages.FIELD_INTEGER, f"{P}.thinking.budget"),
        ({"thinking": {"budget": 0}}, messages.FIELD_MINIMUM, f"{P}.thinking.budget"),
        ({"thinking": {"budget": -4}}, messages.FIELD_MINIMUM, f"{P}.thinking.budget"),
        ({"thinking": {"level": 1}}, messages.FIELD_UNKNOWN, f"{P}.thinking.level"),
        ({"candidatePresentation": "fancy"}, messages.FIELD_ENUM, f"{P}.candidatePresentation"),
        ({"candidatePresentation": 1}, messages.FIELD_ENUM, f"{P}.candidatePresentation"),
        ({"runMode": "fast"}, messages.FIELD_ENUM, f"{P}.runMode"),
        ({"cleanupOnly": None}, messages.FIELD_BOOLEAN, f"{P}.cleanupOnly"),
        ({"cleanupOnly": "false"}, messages.FIELD_BOOLEAN, f"{P}.cleanupOnly"),
        ({"cleanupOnly": 0}, messages.FIELD_BOOLEAN, f"{P}.cleanupOnly"),
        ({"activeGuidance": 1}, messages.FIELD_BOOLEAN, f"{P}.activeGuidance"),
        ({"alibabaCloud": "ak"}, messages.FIELD_OBJECT, f"{P}.alibabaCloud"),
        ({"alibabaCloud": {"accessKeyId": 1}}, messages.FIELD_STRING, f"{P}.alibabaCloud.accessKeyId"),
        ({"alibabaCloud": {"endpoint": "x"}}, messages.FIELD_UNKNOWN, f"{P}.alibabaCloud.endpoint"),
        ({"llmHeaders": []}, messages.FIELD_OBJECT, f"{P}.llmHeaders"),
        ({"llmHeaders": {"X-A": 1}}, messages.FIELD_STRING, f"{P}.llmHeaders.X-A"),
        ({"llmHeaders": {"X-A": "a\r\nInjected: 1"}}, messages.FIELD_INVALID, f"{P}.llmHeaders.X-A"),
        ({"llmHeaders": {"Bad Name": "v"}}, messages.FIELD_INVALID, f"{P}.llmHeaders"),
        ({"llmHeaders": {"": "v"}}, messages.FIELD_INVALID, f"{P}.llmHeaders"),
        ({"iac_code_model": "m"}, messages.FIELD_UNKNOWN, f"{P}.iac_code_model"),
        ({"ros_invocation_id": "m"}, messages.FIELD_UNKNOWN, f"{P}.ros_invocation_id"),
    ],
)
def test_iac_code_field_errors(props: dict[str, Any], template: str, field: str) -> None:
    assert_refused(with_props(**props), template, field=field)


def test_minimum_and_enum_params() -> None:
    error = assert_refused(with_props(thinking={"budget": 0}), messages.FIELD_MINIMUM)
    assert error.params["limit"] == 1
    error = assert_refused(with_props(runMode="x"), messages.FIELD_ENUM)
    assert error.params["allowed"] == "normal, pipeline"
    error = assert_refused(with_props(candidatePresentation="x"), messages.FIELD_ENUM)
    assert error.params["allowed"] == "standard, rich"


def test_unknown_keys_are_reported_in_sorted_order() -> None:
    assert_refused(with_props(zeta=1, alpha=2), messages.FIELD_UNKNOWN, field=f"{P}.alpha")


def test_odd_unknown_key_is_quoted_and_truncated() -> None:
    error = assert_refused(with_props(**{"has space": 1}), messages.FIELD_UNKNOWN)
    assert error.params["field"] == f'{P}["has space"]'
    error = assert_refused(with_props(**{"k" * 300 + "!": 1}), messages.FIELD_UNKNOWN)
    assert len(error.params["field"]) < 120


def test_thinking_budget_accepts_large_integers() -> None:
    props = validate_run_input(with_props(thinking={"budget": 10**12})).props
    assert props.thinking == {"budget": 10**12}


def test_every_error_renders_with_its_params() -> None:
    for payload in (with_props(thinking={"budget": 0}), body(threadId=""), with_props(runMode=1)):
        error = refusal(payload)
        error.message.format(**error.params)  # no missing placeholder


# --- secrets ----------------------------------------------------------------------------


def secret_payload() -> dict[str, Any]:
    payload = body()
    payload["forwardedProps"]["iacCode"] = full_props()
    return payload


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("llmApiKey", 12345),
        ("llmHeaders", {"X-Auth": 5}),
        ("alibabaCloud", {"accessKeySecret": 42, "securityToken": STS_TOKEN}),
    ],
)
def test_errors_never_echo_values(field: str, value: object) -> None:
    payload = secret_payload()
    payload["forwardedProps"]["iacCode"][field] = value
    error = refusal(payload)
    rendered = error.message.format(**error.params) + str(error) + repr(error)
    for secret in (*SECRETS, "12345", "42"):
        assert secret not in rendered


def test_secret_as_unknown_value_is_not_echoed() -> None:
    payload = secret_payload()
    payload["forwardedProps"]["iacCode"]["apiKey"] = API_KEY
    error = assert_refused(payload, messages.FIELD_UNKNOWN, field=f"{P}.apiKey")
    assert API_KEY not in str(error.params) + str(error)


def test_reprs_hide_secrets() -> None:
    run = validate_run_input(secret_payload())
    for text in (repr(run), repr(run.props), str(run.props)):
        for secret in SECRETS:
            assert secret not in text
        assert "LTAI-id" not in text  # the whole alibabaCloud block is hidden
    assert "invocation-1" in repr(run.props)


def test_secret_paths_cover_the_secret_fields() -> None:
    assert set(SECRET_PATHS) == {
        ("forwardedProps", "iacCode", "llmApiKey"),
        ("forwardedProps", "iacCode", "alibabaCloud", "accessKeySecret"),
        ("forwardedProps", "iacCode", "alibabaCloud", "securityToken"),
        ("forwardedProps", "iacCode", "llmHeaders"),
    }


def test_redact_secrets_removes_values_and_keeps_the_rest() -> None:
    payload = secret_payload()
    original = copy.deepcopy(payload)
    redacted = redact_secrets(payload)
    assert payload == original  # a copy, the input is untouched
    dumped = json.dumps(redacted)
    for secret in SECRETS:
        assert secret not in dumped
    props = redacted["forwardedProps"]["iacCode"]
    assert set(props["llmHeaders"]) == {"X-Auth"}  # header names are kept
    assert props["alibabaCloud"]["accessKeyId"] == "LTAI-id"
    assert props["alibabaCloud"]["regionId"] == "cn-hangzhou"
    assert props["cwd"] == "/workspace/session-1"
    assert redacted["messages"] == payload["messages"]


@pytest.mark.parametrize(
    "payload",
    [{}, {"forwardedProps": None}, {"forwardedProps": {"iacCode": []}}, {"forwardedProps": {"iacCode": {}}}],
)
def test_redact_secrets_leaves_unreachable_paths_alone(payload: dict[str, Any]) -> None:
    assert redact_secrets(payload) == payload


def test_redact_secrets_handles_wrongly_typed_secrets() -> None:
    payload = {"forwardedProps": {"iacCode": {"llmHeaders": HEADER_SECRET, "llmApiKey": 5, "model": None}}}
    props = redact_secrets(payload)["forwardedProps"]["iacCode"]
    assert props["llmHeaders"] != HEADER_SECRET
    assert props["llmApiKey"] != 5
    assert props["model"] is None


def test_redact_secrets_keeps_null_secrets_null() -> None:
    props = redact_secrets(with_props(llmApiKey=None))["forwardedProps"]["iacCode"]
    assert props["llmApiKey"] is None


def test_digest_ignores_secret_values() -> None:
    first = secret_payload()
    retry = secret_payload()
    props = retry["forwardedProps"]["iacCode"]
    props["llmApiKey"] = "sk-rotated"
    props["llmHeaders"] = {"X-Auth": "Bearer rotated"}
    props["alibabaCloud"]["securityToken"] = "sts-refreshed"
    props["alibabaCloud"]["accessKeySecret"] = "secret-refreshed"
    assert request_digest(first) == request_digest(retry)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["messages"][0].update(content="something else"),
        lambda p: p["forwardedProps"]["iacCode"].update(cwd="/workspace/other"),
        lambda p: p["forwardedProps"]["iacCode"]["alibabaCloud"].update(accessKeyId="other-id"),
        lambda p: p["forwardedProps"]["iacCode"]["llmHeaders"].update({"X-Other": "v"}),
        lambda p: p["forwardedProps"]["iacCode"].pop("llmApiKey"),
        lambda p: p.update(state={"k": 1}),
        lambda p: p.update(unknownTopLevel=True),
    ],
)
def test_digest_changes_with_non_secret_content(change: Any) -> None:
    changed = secret_payload()
    change(changed)
    assert request_digest(changed) != request_digest(secret_payload())


def test_digest_ignores_forwarded_props_other_than_iac_code() -> None:
    """A retry that differs only in keys the adapter ignores is the same run (a duplicate, or
    a reattach), never a RUN_ID_CONFLICT; and what it ignores is never hashed."""
    first = secret_payload()
    first["forwardedProps"]["toolChoice"] = "auto"
    retry = secret_payload()
    retry["forwardedProps"]["toolChoice"] = {"type": "function", "function": {"name": "suggest"}}
    retry["forwardedProps"]["appState"] = {"tab": 2}
    assert request_digest(first) == request_digest(retry) == request_digest(secret_payload())
    changed = secret_payload()
    changed["forwardedProps"]["iacCode"]["model"] = "other-model"
    changed["forwardedProps"]["toolChoice"] = "auto"
    assert request_digest(changed) != request_digest(first)


def test_redacted_view_never_shows_other_forwarded_props() -> None:
    payload = secret_payload()
    payload["forwardedProps"]["toolChoice"] = "value-never-logged"
    original = copy.deepcopy(payload)
    redacted = redact_secrets(payload)
    assert "value-never-logged" not in json.dumps(redacted)
    assert payload == original


def test_digest_is_stable_and_hex() -> None:
    payload = secret_payload()
    reordered = json.loads(json.dumps(payload, sort_keys=True))
    digest = request_digest(payload)
    assert digest == request_digest(reordered)
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_digest_of_non_secret_body_matches_upstream_formula() -> None:
    import hashlib

    payload = body()
    canonical = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert request_digest(payload) == hashlib.sha256(canonical.encode()).hexdigest()


def test_digest_survives_lone_surrogates_and_nan() -> None:
    payload = json.loads('{"threadId": "\\ud800", "x": NaN}')
    assert len(request_digest(payload)) == 64


# --- preferred language hint --------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (with_props(preferredLanguage="zh-CN"), "zh-CN"),
        ({"forwardedProps": {"iacCode": {"preferredLanguage": "ja"}}, "threadId": 5}, "ja"),
        ({"forwardedProps": {"iacCode": {"preferredLanguage": 3}}}, 3),
        (body(), None),
        ({"forwardedProps": {"iacCode": "zh"}}, None),
        ({"forwardedProps": []}, None),
        ([], None),
        (None, None),
        ("zh", None),
    ],
)
def test_preferred_language_hint(payload: object, expected: object) -> None:
    assert preferred_language_hint(payload) == expected


@pytest.mark.parametrize(
    "payload",
    [
        secret_payload(),
        {"forwardedProps": {"iacCode": {"llmHeaders": HEADER_SECRET, "llmApiKey": 5, "alibabaCloud": []}}},
        {"forwardedProps": None, "state": {"forwardedProps": {"iacCode": {"llmApiKey": API_KEY}}}},
        {"forwardedProps": {"iacCode": {"alibabaCloud": {"securityToken": None, "accessKeySecret": AK_SECRET}}}},
    ],
)
def test_digest_is_that_of_the_redacted_copy_and_leaves_the_body_alone(payload: dict[str, Any]) -> None:
    original = copy.deepcopy(payload)
    canonical = json.dumps(redact_secrets(payload), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert request_digest(payload) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert payload == original
