"""A frame read as a repeat of its template is the frame the parser gives (``kernel_client.repeats``).

The reference is the plain way: the SSE decoder over the whole stream, each payload parsed
alone by the standard library. The frame reader, fed the same stream cut anywhere, must give
the same frames (a ``Repeat`` compared as the frame it stands for), and ``inspect_frame`` the
same ``FrameInfo``, for streams shaped like the kernel's (one-line events, texts of every
kind: quotes, backslashes, escapes, any Unicode, either JSON encoding) and for streams that
break the shape (other frames between, other ids, a frame cut short or mangled, a text that
ends in a backslash, LF line ends).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_adapter.kernel_client import a2a
from agui_adapter.kernel_client.repeats import Repeat, learn
from agui_adapter.kernel_client.sse import SSEDecoder
from agui_adapter.run.translation import FrameInfo, inspect_frame, status_text

TASK = "7d5d5dfd-d4f2-4fc4-8504-938ff31841be"


def status_frame(
    text: str,
    *,
    task: str = TASK,
    session: str = "sess-1",
    state: str = "TASK_STATE_WORKING",
    extra_meta: dict[str, Any] | None = None,
    more_parts: int = 0,
    message_id: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    message = {
        "messageId": message_id or f"{task}-message",
        "contextId": "ctx-1",
        "taskId": task,
        "role": "ROLE_AGENT",
        "parts": [{"text": text}] + [{"text": f"part {i}"} for i in range(more_parts)],
    }
    iac = {"iacCodeSessionId": session, **(extra_meta or {})}
    update: dict[str, Any] = {"note": {"text": note}} if note is not None else {}  # a "text" before the text
    update |= {"taskId": task, "contextId": "ctx-1", "status": {"state": state, "message": message}}
    update["metadata"] = {"iac_code": iac}
    return {"result": {"statusUpdate": update}, "id": "1", "jsonrpc": "2.0"}


def event(frame: Any, *, ascii_only: bool = False, end: bytes = b"\r\n\r\n") -> bytes:
    return b"data: " + json.dumps(frame, ensure_ascii=ascii_only, separators=(",", ":")).encode() + end


def reference(stream: bytes) -> list[Any]:
    decoder = SSEDecoder()
    payloads = decoder.feed(stream) + decoder.close()
    return [a2a._loads(payload) for payload in payloads]


def read(stream: bytes, cuts: list[int]) -> list[Any]:
    reader = a2a.FrameReader()
    frames: list[Any] = []
    at = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        if cut > at:
            frames += reader.feed(stream[at:cut])
            at = cut
    return frames + reader.close()


def plain(frames: list[Any]) -> list[Any]:
    return [frame.frame() if type(frame) is Repeat else frame for frame in frames]


# --- texts and frames of every kind ------------------------------------------------------
texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(['say "hi"', "back\\", "back\\\\", "a\\nb", "\n", "\\", '"', "é", "😀", "\u2028", "", " "]),
)
kernel_frame = st.builds(
    status_frame,
    texts,
    session=st.sampled_from(["sess-1", "sess-2"]),
    state=st.sampled_from(["TASK_STATE_WORKING", "TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED"]),
    extra_meta=st.one_of(st.none(), st.just({"text": "x"}), st.just({"assistantFinal": {"complete": True}})),
    more_parts=st.sampled_from([0, 0, 0, 1]),
    note=st.sampled_from([None, None, "n"]),
)
other_frame = st.sampled_from(
    [
        {"result": {"task": {"id": TASK, "contextId": "ctx-1", "status": {"state": "TASK_STATE_SUBMITTED"}}}},
        {"error": {"code": -32001, "message": "no"}},
        {"result": {"statusUpdate": {"taskId": TASK, "status": {"state": "TASK_STATE_WORKING"}}}},
        # "text" elsewhere before the status text
    ]
)
one_event = st.one_of(
    st.builds(event, kernel_frame, ascii_only=st.booleans()),
    st.builds(event, kernel_frame, ascii_only=st.booleans()),
    st.builds(event, kernel_frame, end=st.just(b"\n\n")),
    st.builds(event, other_frame),
    st.sampled_from([b": ping\r\n\r\n", b"data: {not json\r\n\r\n", b'data: {"a":"\xff"}\r\n\r\n']),
)


def mangled(stream: bytes, at: int, byte: bytes) -> bytes:
    """A quote, backslash or line end put in anywhere: a frame the template may not fit."""
    at = at % (len(stream) + 1)
    return stream[:at] + byte + stream[at:]


streams = st.lists(one_event, max_size=12).map(b"".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams, st.lists(st.integers(0, 4000), max_size=6))
def test_any_stream_cut_anywhere_reads_as_the_plain_parse(stream: bytes, cuts: list[int]) -> None:
    frames = read(stream, cuts)
    assert plain(frames) == reference(stream)
    assert [looked_into(frame) for frame in frames] == [looked_into(frame) for frame in plain(frames)]


def looked_into(frame: Any) -> FrameInfo:
    """``inspect_frame``, its status message checked against the body's and then left out (a
    repeat's is known from its template, a frame parsed whole has it read from its body)."""
    info = inspect_frame(frame)
    if info.message is not None:
        assert info.message == status_text(info.body)
    return dataclasses.replace(info, message=None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    streams,
    st.integers(0, 10**6),
    st.sampled_from([b'"', b"\\", b"\r\n", b"\n", b"}", b","]),
    st.lists(st.integers(0, 4000), max_size=4),
)
def test_a_mangled_stream_reads_as_the_plain_parse(stream: bytes, at: int, byte: bytes, cuts: list[int]) -> None:
    # a run of repeats first, so that the mangled byte meets a template
    lead = b"".join(event(status_frame(f"t{i}")) for i in range(4))
    whole = mangled(lead + stream, at, byte)
    assert plain(read(whole, cuts)) == reference(whole)


# --- the way taken -------------------------------------------------------------------------
def kernel_stream(n: int) -> bytes:
    return b"".join(event(status_frame(f"~{i}~ ")) for i in range(n))


def read_events(stream: bytes) -> list[Any]:
    """Each event in a read of its own (a template is learned from one read for the next)."""
    return read(stream, [at + 4 for at in range(len(stream)) if stream.startswith(b"\r\n\r\n", at)])


def test_text_frames_after_the_first_are_repeats_of_it() -> None:
    frames = read_events(kernel_stream(5))
    assert type(frames[0]) is dict
    assert [type(frame) for frame in frames[1:]] == [Repeat] * 4
    assert [frame.text for frame in frames[1:]] == [f"~{i}~ " for i in range(1, 5)]


def test_a_read_of_repeats_is_taken_whole_and_cut_anywhere_after() -> None:
    reader = a2a.FrameReader()
    reader.feed(kernel_stream(1))
    stream = kernel_stream(50)
    cut = len(stream) // 2 + 17  # mid-event: the decoder keeps the rest
    fed: list[bytes] = []  # what the SSE decoder is given: the bytes around the run only

    class Recording(SSEDecoder):
        def feed(self, chunk: bytes) -> list[bytes]:
            fed.append(chunk)
            return super().feed(chunk)

    reader._decoder = Recording()
    first = reader.feed(stream[:cut])
    second = reader.feed(stream[cut:])
    assert all(type(frame) is Repeat for frame in first + second)
    one_event = len(kernel_stream(1))
    assert len(fed) == 2 and all(len(data) < one_event for data in fed)  # the cut event's two halves
    assert [frame.text for frame in first + second] == [f"~{i}~ " for i in range(50)]


def test_a_text_that_the_template_does_not_fit_is_parsed_whole() -> None:
    stream = kernel_stream(2) + event(status_frame('a "quoted" text')) + event(status_frame("ends in \\"))
    frames = read_events(stream)
    assert [type(frame) for frame in frames] == [dict, Repeat, dict, dict]
    assert frames[2]["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"] == 'a "quoted" text'
    assert frames[3]["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"] == "ends in \\"


def test_another_session_is_parsed_whole_and_becomes_the_template() -> None:
    stream = kernel_stream(2) + b"".join(event(status_frame(f"s{i}", session="sess-2")) for i in range(3))
    frames = read_events(stream)
    assert [type(frame) for frame in frames] == [dict, Repeat, dict, Repeat, Repeat]
    assert frames[4].frame()["result"]["statusUpdate"]["metadata"]["iac_code"]["iacCodeSessionId"] == "sess-2"


def test_a_text_the_parser_refuses_sends_the_read_the_plain_way() -> None:
    bad = kernel_stream(1).replace(b'"~0~ "', b'"bad \\q escape"')
    frames = read_events(kernel_stream(2) + bad)
    assert frames[2] == {"error": {"code": -32700, "message": "Malformed frame from the kernel."}}


def test_a_template_is_only_a_place_the_parser_confirms() -> None:
    frame = status_frame("hello")
    payload = json.dumps(frame, separators=(",", ":")).encode()
    template = learn(frame, payload, json.loads)
    assert template is not None and template.prefix.endswith(b'"parts":[{"text":"')
    # a "text" key earlier in the frame is not taken for the text's place
    early = status_frame("hello", note="hello")
    payload = json.dumps(early, separators=(",", ":")).encode()
    template = learn(early, payload, json.loads)
    assert template is not None and template.prefix.endswith(b'"parts":[{"text":"')
    # a duplicate key after the text overrides it: the place is refused
    doubled = payload.replace(b'"text":"hello"}]', b'"text":"hello","text":"hello"}]')
    parsed = json.loads(doubled)
    assert learn(parsed, doubled, json.loads) is None or read_events(event_bytes(doubled) * 3)[2] == parsed
    # bytes not of one line: no template
    assert learn(frame, payload[:10] + b"\n" + payload[10:], json.loads) is None


def event_bytes(payload: bytes) -> bytes:
    return b"data: " + payload + b"\r\n\r\n"


def test_a_repeat_of_a_frame_that_is_not_a_status_update_is_looked_into_the_long_way() -> None:
    both = status_frame("one")
    both["result"]["task"] = {"id": TASK, "status": {"state": "TASK_STATE_WORKING"}}  # "task" is looked at first
    stream = b"".join(event(both).replace(b'"one"', b'"%d"' % i) for i in range(3))
    frames = read_events(stream)
    assert type(frames[2]) is Repeat
    assert looked_into(frames[2]) == looked_into(frames[2].frame())
    assert inspect_frame(frames[2]).kind == "task"


def test_a_repeats_status_message_is_known_from_its_template_when_the_template_says_so() -> None:
    frames = read_events(kernel_stream(3))
    assert inspect_frame(frames[2]).message == (f"{TASK}-message", "~2~ ")
    # a user's message, or one of several parts, is read from the body
    user = status_frame("a")
    user["result"]["statusUpdate"]["status"]["message"]["role"] = "ROLE_USER"
    two = status_frame("b", more_parts=1)
    for shape in (user, two):
        frames = read_events(b"".join(event(shape) for _ in range(3)))
        assert type(frames[2]) is Repeat and inspect_frame(frames[2]).message is None
        assert looked_into(frames[2]) == looked_into(frames[2].frame())
