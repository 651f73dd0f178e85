"""Bounds of the edge without sockets: JSON depth and lone surrogates, run ids kept by digest."""

from __future__ import annotations

import json

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.errors import AguiError
from agui_adapter.protocol.validation import MAX_JSON_DEPTH, check_json_text
from agui_adapter.state.record import MAX_RUN_DIGESTS, Execution, RunDigests, ThreadRecord, run_key


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def check(payload: object) -> None:
    check_json_text(payload, json.dumps(payload).encode())


def test_depth_up_to_the_limit_passes_and_one_more_is_refused() -> None:
    check({"state": nested(MAX_JSON_DEPTH - 1)})  # the envelope object is one level
    with pytest.raises(AguiError) as caught:
        check({"state": nested(MAX_JSON_DEPTH)})
    assert caught.value.message == messages.FIELD_TOO_DEEP
    assert caught.value.params == {"field": "state[0]", "limit": MAX_JSON_DEPTH}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"threadId": "a\ud800"}, "threadId"),
        ({"messages": [{"content": [{"text": "\udfff"}]}]}, "messages[0].content[0].text"),
        ({"state": {"k\ud800": 1}}, "state"),
        ({"\ud800": 1}, "RunAgentInput"),
    ],
)
def test_a_lone_surrogate_names_its_field(payload: object, field: str) -> None:
    with pytest.raises(AguiError) as caught:
        check(payload)
    assert caught.value.message == messages.FIELD_NOT_UNICODE
    assert caught.value.params == {"field": field}


def test_paired_surrogates_and_escaped_backslashes_pass() -> None:
    check({"text": "\U0001f600"})
    check_json_text({"text": "\\ud800"}, b'{"text": "\\\\ud800"}')


def test_run_digests_keep_a_fixed_size_key() -> None:
    digests = RunDigests()
    digests.remember("r" * 10_000, "d1", MAX_RUN_DIGESTS)
    assert list(digests) == [run_key("r" * 10_000)] and len(run_key("x")) == 64
    assert "r" * 10_000 in digests and digests.get("r" * 10_000) == "d1" and digests.get("other") is None


def test_state_files_with_raw_run_ids_are_still_read() -> None:
    record = ThreadRecord("t", "c", "/w", None, Execution("e", "inv"))
    data = record.to_json()
    data["runDigests"] = {"legacy": "d0", "a" * 64: "d1"}
    loaded = ThreadRecord.from_json(json.loads(json.dumps(data)), "t")
    assert loaded.run_digests.get("legacy") == "d0" and loaded.run_digests.get("a" * 64) == "d1"
    assert "legacy" not in dict(loaded.run_digests)  # re-keyed when read
    loaded.remember_run("a" * 64, "d2")
    assert loaded.run_digests.get("a" * 64) == "d2" and len(loaded.run_digests) == 2
