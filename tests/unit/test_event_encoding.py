"""The streaming deltas written from templates (``events._DELTAS``) are byte for byte what the
JSON encoder writes, whatever their strings hold (quotes, controls, U+2028, lone surrogates,
any script) and whatever their timestamps; any other shape of them goes to the encoder."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_adapter.protocol import events as ev

CONSTRUCTORS = [ev.text_content, ev.reasoning_content, ev.tool_args]
any_text = st.text(st.characters(codec=None, categories=None), max_size=40)  # surrogates too


def encoder_wrote(events: list[dict[str, Any]], first_id: int | None) -> bytes:
    """``encode_many`` as the encoder alone writes it."""
    if first_id is None:
        return "".join("data: " + ev._dumps(e) + "\n\n" for e in events).encode("utf-8", "replace")
    text = "".join(f"id: {n}\ndata: {ev._dumps(e)}\n\n" for n, e in enumerate(events, first_id))
    return text.encode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(CONSTRUCTORS), st.integers(-(2**70), 2**70), any_text, any_text), max_size=5),
    st.one_of(st.none(), st.integers(1, 10**6)),
)
def test_deltas_are_what_the_encoder_writes(deltas: list[tuple[Any, int, str, str]], first_id: int | None) -> None:
    events = [make(ts, ident, text) for make, ts, ident, text in deltas]
    assert ev.encode_many(events, first_id) == encoder_wrote(events, first_id)


@pytest.mark.parametrize(
    "event",
    [
        {**ev.text_content(1, "m", "d"), "extra": 1},  # another key
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "timestamp": 1, "delta": "d"},  # another order
        ev.text_content(True, "m", "d"),  # type: ignore[arg-type]  # a bool is not a timestamp
        ev.text_content(1, "m", 1.5),  # type: ignore[arg-type]
        ev.tool_args(1, None, "d"),  # type: ignore[arg-type]
        ev.text_start(1, "m"),
    ],
)
def test_other_shapes_go_to_the_encoder(event: dict[str, Any]) -> None:
    assert ev.encode_many([event], 3) == encoder_wrote([event], 3)


def test_a_delta_never_reaches_the_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    def encoder(_event: Any) -> str:
        raise AssertionError("the encoder was asked")

    monkeypatch.setattr(ev, "_dumps", encoder)
    assert ev.encode_many([make(1, "i", "δ") for make in CONSTRUCTORS], 1).count(b"\ndata: {") == 3
