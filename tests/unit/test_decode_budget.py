"""The process-wide image decoding budget: room is shared, a request waits briefly for it,
then is refused with SERVER_BUSY and a Retry-After; the heap is trimmed when decoding stops."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agui_adapter.config import ConfigError, load_settings
from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol import decode_budget
from agui_adapter.protocol.decode_budget import DecodeBudget
from agui_adapter.protocol.errors import AguiError


def test_reservations_share_the_budget_and_the_last_one_trims() -> None:
    idle: list[int] = []
    budget = DecodeBudget(100, 5.0, on_idle=lambda: idle.append(budget.in_use))
    with budget.reserve(60):
        with budget.reserve(40):
            assert budget.in_use == 100
        assert budget.in_use == 60 and idle == []
    assert budget.in_use == 0 and idle == [0]


def test_a_reservation_waits_for_room() -> None:
    budget = DecodeBudget(100, 30.0, on_idle=lambda: None)
    holding, got = threading.Event(), threading.Event()
    release = threading.Event()

    def holder() -> None:
        with budget.reserve(80):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(10)

    def waiter() -> None:
        with budget.reserve(50):
            got.set()

    second = threading.Thread(target=waiter)
    second.start()
    deadline = time.monotonic() + 10
    while budget.waiting != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.waiting == 1 and not got.is_set()  # no room while the first one decodes
    release.set()
    assert got.wait(10)
    thread.join(10)
    second.join(10)
    assert budget.in_use == 0


def test_no_room_within_the_wait_is_server_busy_with_retry_after() -> None:
    budget = DecodeBudget(100, 0.2, on_idle=lambda: None)
    with budget.reserve(100):
        started = time.monotonic()
        with pytest.raises(AguiError) as caught:
            with budget.reserve(1):
                pass
        assert 0.15 < time.monotonic() - started < 5
    err = caught.value
    assert err.code == "SERVER_BUSY" and err.status == 503
    assert err.message == messages.IMAGE_DECODE_BUSY
    assert err.params["retryAfter"] == decode_budget.RETRY_AFTER_SECONDS
    assert budget.in_use == 0


def test_an_image_larger_than_the_budget_decodes_alone() -> None:
    budget = DecodeBudget(10, 0.05, on_idle=lambda: None)
    with budget.reserve(1_000):
        assert budget.in_use == 10
        with pytest.raises(AguiError):
            with budget.reserve(1):
                pass
    with budget.reserve(1_000):
        pass


def test_a_failure_inside_gives_the_room_back() -> None:
    budget = DecodeBudget(10, 0.05, on_idle=lambda: None)
    with pytest.raises(RuntimeError):
        with budget.reserve(10):
            raise RuntimeError("decoder failed")
    assert budget.in_use == 0


def test_glibc_tuning_is_harmless() -> None:
    decode_budget.release_memory()
    assert decode_budget.map_large_allocations() in (True, False)


def test_setting_default_env_file_and_flag(tmp_path: Path) -> None:
    assert load_settings({}, env={}).image_decode_budget_pixels == decode_budget.DEFAULT_BUDGET_PIXELS
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nimage-decode-budget-pixels = 5000000\n")
    assert load_settings({}, env={}, config_path=str(conf)).image_decode_budget_pixels == 5_000_000
    env = {"IAC_CODE_AGUI_IMAGE_DECODE_BUDGET_PIXELS": "120000000"}
    assert load_settings({}, env=env, config_path=str(conf)).image_decode_budget_pixels == 120_000_000
    assert load_settings({"image_decode_budget_pixels": "7"}, env=env).image_decode_budget_pixels == 7


@pytest.mark.parametrize("value", ["0", "-1", "lots", "1.5"])
def test_setting_must_be_a_positive_integer(value: str) -> None:
    with pytest.raises(ConfigError, match="image_decode_budget_pixels"):
        load_settings({"image_decode_budget_pixels": value}, env={})
