"""The edge's settings: flag > environment > config file > default, and their validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from agui_adapter.config import ConfigError, load_settings


def test_cors_origins_default_is_none() -> None:
    assert load_settings({}, env={}).cors_origins == ""


def test_cors_origins_from_env_file_and_flag(tmp_path: Path) -> None:
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\ncors-origins = https://file.example\n")
    assert load_settings({}, env={}, config_path=str(conf)).cors_origins == "https://file.example"
    env = {"IAC_CODE_AGUI_CORS_ORIGINS": " https://a.example , http://b.example:8080/ "}
    assert load_settings({}, env=env, config_path=str(conf)).cors_origins == "https://a.example,http://b.example:8080"
    assert load_settings({"cors_origins": "*"}, env=env).cors_origins == "*"


@pytest.mark.parametrize("value", ["app.example", "https://a.example/path", "*, https://a.example", "https://"])
def test_cors_origins_refuses_what_is_not_an_origin(value: str) -> None:
    with pytest.raises(ConfigError, match="cors_origins"):
        load_settings({"cors_origins": value}, env={})


def test_max_runs_default_env_and_flag() -> None:
    assert load_settings({}, env={}).max_runs == 256
    assert load_settings({}, env={"IAC_CODE_AGUI_MAX_RUNS": "12"}).max_runs == 12
    assert load_settings({"max_runs": "3"}, env={"IAC_CODE_AGUI_MAX_RUNS": "12"}).max_runs == 3


@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_max_runs_must_be_a_positive_integer(value: str) -> None:
    with pytest.raises(ConfigError, match="max_runs"):
        load_settings({"max_runs": value}, env={})
