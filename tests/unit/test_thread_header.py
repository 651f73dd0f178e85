"""The ``X-AGUI-Thread-Id`` routing header rule (``validation.check_thread_header``)."""

from __future__ import annotations

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.errors import AguiError
from agui_adapter.protocol.i18n import SUPPORTED_LANGUAGES, translate
from agui_adapter.protocol.validation import THREAD_HEADER, check_thread_header


def test_absent_header_is_accepted() -> None:
    check_thread_header(None, "thread-1")


def test_equal_header_is_accepted() -> None:
    check_thread_header("thread-1", "thread-1")


@pytest.mark.parametrize("header", ["thread-2", "", " thread-1", "thread-1 ", "THREAD-1", "thread-1,thread-1"])
def test_any_other_header_value_is_invalid_input(header: str) -> None:
    with pytest.raises(AguiError) as caught:
        check_thread_header(header, "thread-1")
    assert caught.value.code == "INVALID_INPUT"
    assert caught.value.status == 400
    assert caught.value.message == messages.THREAD_HEADER_MISMATCH
    assert not caught.value.params  # neither value is echoed


@pytest.mark.parametrize("language", sorted(SUPPORTED_LANGUAGES))
def test_the_refusal_names_the_header_in_every_language(language: str) -> None:
    text = translate(language, messages.THREAD_HEADER_MISMATCH)
    assert THREAD_HEADER in text and "threadId" in text
    if language != "en":
        assert text != messages.THREAD_HEADER_MISMATCH
