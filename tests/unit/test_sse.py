"""The kernel's SSE decoder against the standard's algorithm run over the whole stream at
once (``reference``): the same payloads, as soon as their event is complete, for any stream
cut anywhere; streams shaped like the kernel's (one-line events, CRLF) and any other
(comments, other fields, multi-line data, LF and CR line endings, mixed)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from agui_adapter.kernel_client.sse import SSEDecoder

LINE_END = re.compile(rb"\r\n|\r|\n")


def reference(stream: bytes) -> list[bytes]:
    """The payloads of the events whose blank line is in ``stream`` (the standard's algorithm)."""
    lines = LINE_END.split(stream)
    lines.pop()  # not ended yet
    out: list[bytes] = []
    data: list[bytes] = []
    for line in lines:
        if not line:
            if data:
                out.append(b"\n".join(data))
                data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return out


def seen_by(stream: bytes) -> list[bytes]:
    """What a decoder may have given out once ``stream`` arrived: a CR at its very end may be
    the first half of a CRLF, so the line it ends counts once the next byte is in."""
    return reference(stream[:-1] if stream.endswith(b"\r") else stream)


payload = st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
json_like = st.builds(
    lambda n, t: b'{"n":%d,"text":"%s"}' % (n, t),
    st.integers(0, 10**6),
    st.sampled_from([b"", b"a b", b"data: x", b"\xc3\xa9"]),
)
kernel_event = json_like.map(lambda p: b"data: " + p + b"\r\n\r\n")
line = st.one_of(
    payload.map(lambda p: b"data: " + p),
    payload.map(lambda p: b"data:" + p),
    st.just(b""),
    st.sampled_from([b": ping", b"id: 3", b"event: message", b"retry: 10", b"data", b"dat"]),
)
other_lines = st.lists(st.tuples(line, st.sampled_from([b"\r\n", b"\n", b"\r"])), max_size=8).map(
    lambda pairs: b"".join(text + end for text, end in pairs)
)
stream = st.lists(st.one_of(kernel_event, kernel_event, other_lines), max_size=10).map(b"".join)


def feed_in_pieces(decoder: SSEDecoder, whole: bytes, cuts: list[int]) -> None:
    got: list[bytes] = []
    start = 0
    for cut in sorted({min(c, len(whole)) for c in cuts} | {len(whole)}):
        got += decoder.feed(whole[start:cut])
        start = cut
        assert got == seen_by(whole[:cut])  # every complete event given out, nothing more
    assert got + decoder.close() == reference(whole + b"\n\n")  # the last event, unended, counts


@settings(max_examples=600, deadline=None)
@given(stream, st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_any_stream_cut_anywhere_gives_the_standard_payloads(whole: bytes, cuts: list[int]) -> None:
    feed_in_pieces(SSEDecoder(), whole, cuts)


@settings(max_examples=200, deadline=None)
@given(st.lists(kernel_event, min_size=1, max_size=30).map(b"".join), st.integers(min_value=1, max_value=97))
def test_kernel_shaped_streams_read_in_equal_pieces(whole: bytes, size: int) -> None:
    feed_in_pieces(SSEDecoder(), whole, list(range(size, len(whole), size)))


def test_kernel_events_come_out_whole_and_in_order() -> None:
    events = [b'{"id":%d}' % i for i in range(300)]
    whole = b"".join(b"data: " + e + b"\r\n\r\n" for e in events)
    decoder = SSEDecoder()
    assert decoder.feed(whole[:1000]) + decoder.feed(whole[1000:]) == events
