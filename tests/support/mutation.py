"""Bytes of a message with a few of them changed, for the h11-oracle tests of both parsers
(the server's, ``tests/flow/test_http_oracle.py``, and the kernel client's,
``tests/unit/test_kernel_connections.py``)."""

from __future__ import annotations

from hypothesis import strategies as st


def mutate(draw: st.DrawFn, wire: bytearray, odd: st.SearchStrategy[bytes], counts: list[int]) -> bytes:
    """``wire`` with a few bytes (how many: drawn from ``counts``) inserted, replaced or
    deleted, the new ones drawn from ``odd``."""
    for _ in range(draw(st.sampled_from(counts))):
        at = draw(st.integers(0, len(wire)))
        how = draw(st.sampled_from(["insert", "replace", "delete"]))
        new = draw(odd)
        if how == "insert":
            wire[at:at] = new
        elif how == "replace":
            wire[at : at + 1] = new
        else:
            del wire[at : at + 1]
    return bytes(wire)
