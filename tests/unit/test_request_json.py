"""A request body's JSON with orjson (the "speedups" extra) parsing first: ``parse_json``
answers what the standard library alone answers, for any body. The same value (types, key
order, duplicate keys, ``-0.0``, numbers beyond 64 bits or beyond a float), or the same
refusal; what orjson refuses and the standard library takes (NaN, ``1e400``, a lone
surrogate escape) still parses as it did."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_adapter.ops import speedups
from agui_adapter.protocol.errors import AguiError
from agui_adapter.web import request_checks as checks

orjson = pytest.importorskip("orjson")


def typed(value: Any) -> Any:
    """The value with every type and order explicit (``1``, ``1.0`` and ``True`` differ; NaN is itself)."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    return (type(value).__name__, repr(value))


def standard(body: bytes) -> tuple[Any, ...]:
    """The answer without orjson: strict UTF-8, then the standard library."""
    try:
        return ("ok", typed(json.loads(body.decode("utf-8"))))
    except (ValueError, RecursionError):
        return ("refused",)


def answered(body: bytes) -> tuple[Any, ...]:
    try:
        return ("ok", typed(checks.parse_json(body, "invalid")))
    except AguiError as err:
        assert err.code == "INVALID_JSON"
        return ("refused",)


def test_orjson_parses_first() -> None:
    assert speedups.orjson_loads() is orjson.loads


EDGES = [
    b"[1e400]", b"[-1e400]", b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[1.7976931348623159e308]",
    b"[4.9e-324]", b"[2e-400]", b"[-0]", b"[-0.0]", b"[0.1]", b"[1E+2]", b"[01]", b"[.5]", b"[1.]",
    b"[18446744073709551615]", b"[18446744073709551616]", b"[-9223372036854775808]", b"[-9223372036854775809]",
    b"[123456789012345678901234567890]", b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\ud83d\\ude00"', b'"\\u0000"',
    b'"\xed\xa0\x80"', b'"\xc0\x80"', b'"\xf4\x90\x80\x80"', b'"\xff"', b'"\x7f"', b'"\x1f"', b'"\t"',
    b"\xef\xbb\xbf{}", b'{"a":1,"b":2,"a":3}', b"[" * 1100 + b"]" * 1100, b"[" * 100 + b"]" * 100,
    b"", b" ", b"{}x", b"[1,]", b'{"a":1,}', b"\t\n\r [] \r\n", b"\x0c[]", b"\xc2\xa0[]", b"nul", b"true",
    b"null", b'{"a":{"b":[true,false,null,"x",-1.5e-7]}}', b"[1]\x00",
]  # fmt: skip


@pytest.mark.parametrize("body", EDGES)
def test_edges(body: bytes) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # ``typed`` walks the 1,100 levels the standard library takes
    try:
        assert answered(body) == standard(body)
    finally:
        sys.setrecursionlimit(limit)


NUMBERS = st.from_regex(rb"\A-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?\Z")


@settings(max_examples=500, deadline=None)
@given(NUMBERS)
def test_any_number(number: bytes) -> None:
    """Integers of any length, floats with any number of digits (rounding is the standard library's)."""
    for body in (number, b"[" + number + b"]", b'{"n":' + number + b"}"):
        assert answered(body) == standard(body)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, categories=None), max_size=8),  # surrogates too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


def encoded(value: Any, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans())
def test_any_document(value: Any, ascii_only: bool) -> None:
    body = encoded(value, ascii_only)
    assert answered(body) == standard(body)


NOISE = b'{}[]",:\\0123456789eE+-.ntfulsrau \t\r\n\x00\x7f\xc2\xa0\xed\xef\xbb\xbf\xff'


@settings(max_examples=600, deadline=None)
@given(json_values, st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(range(4)), st.sampled_from(NOISE))))
def test_any_document_damaged(value: Any, edits: list[tuple[int, int, int]]) -> None:
    body = bytearray(encoded(value, False))
    for at, kind, byte in edits:
        at %= len(body) + 1
        if kind == 0:
            body.insert(at, byte)
        elif kind == 1 and at < len(body):
            del body[at]
        elif at < len(body):
            body[at] = byte
    assert answered(bytes(body)) == standard(bytes(body))
