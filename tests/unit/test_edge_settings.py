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
