"""Upstream's ``iac-code agui`` options and config file carry over; tokens from systemd credentials.

Upstream's YAML ``--config`` (flat keys, ``a2a-url`` spelt either way, ``debug`` meaning the
debug log level) is read with upstream's precedence (flag > environment > file > default, the
tokens' environment variables above the file); ``--idle-shutdown``, ``-d/--debug`` and
``--log-stdout/--no-log-stdout`` are flags; ``--help`` names every flag's environment
variable; the idle rule is upstream's.
"""

from __future__ import annotations

import io
import logging
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from agui_adapter.cli import configure_logging, parse_args
from agui_adapter.config import ENV_NAMES, ConfigError, load_settings
from agui_adapter.ops import idle

DOCUMENTED = Path(__file__).resolve().parents[1] / "data" / "upstream" / "agui.yaml"


def _flags(argv: list[str]) -> dict[str, object]:
    args = parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "debug")}
    if args.debug and args.log_level is None:
        flags["log_level"] = "debug"
    return flags


def test_upstreams_documented_config_means_upstreams_defaults() -> None:
    settings = load_settings({}, env={}, config_path=str(DOCUMENTED))
    assert (settings.host, settings.port, settings.a2a_url, settings.state_dir) == ("127.0.0.1", 8000, "", "")
    assert (settings.log_level, settings.log_stdout, settings.idle_shutdown) == ("info", False, 0.0)


def test_a_yaml_config_with_upstreams_keys(tmp_path: Path) -> None:
    path = tmp_path / "agui.yaml"
    path.write_text(
        "host: 127.0.0.2\nport: 9001\na2a-url: http://localhost:7000/\ndebug: true\nlog_stdout: yes\n"
        "state_dir: /srv/agui\nidle_shutdown: 90\nauth_token: from-file\na2a_token: kernel-file\n"
    )
    s = load_settings({}, env={}, config_path=str(path))
    assert (s.host, s.port, s.a2a_url, s.state_dir) == ("127.0.0.2", 9001, "http://localhost:7000/", "/srv/agui")
    assert (s.log_level, s.log_stdout, s.idle_shutdown) == ("debug", True, 90.0)
    assert (s.auth_token, s.a2a_token) == ("from-file", "kernel-file")
    # the environment wins over the file (tokens included), a flag over both
    env = {ENV_NAMES["auth_token"]: "from-env", ENV_NAMES["port"]: "9002"}
    flags = _flags(["--port", "9003", "--no-log-stdout", "--idle-shutdown", "5"])
    s = load_settings(flags, env=env, config_path=str(path))
    assert (s.auth_token, s.port, s.log_stdout, s.idle_shutdown) == ("from-env", 9003, False, 5.0)
    assert load_settings(_flags(["--log-level", "warning"]), env={}, config_path=str(path)).log_level == "warning"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("port: true\n", "port"),
        ("port: 70000\n", "port"),
        ("idle_shutdown: -1\n", "idle_shutdown"),
        ("idle_shutdown: yes\n", "idle_shutdown"),
        ("debug: 3\n", "debug"),
        ("unknown_key: 1\n", "unknown_key"),
        ("server:\n  port: 1\n", "flat YAML"),
    ],
)
def test_a_bad_yaml_config_is_refused_naming_the_key(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_settings({}, env={}, config_path=str(path))


def test_an_ini_config_is_still_ini(tmp_path: Path) -> None:
    path = tmp_path / "agui-adapter.conf"
    path.write_text("# comment\n[agui-adapter]\nport = 8111\nidle_shutdown = 30\n")
    assert load_settings({}, env={}, config_path=str(path)).idle_shutdown == 30.0


def test_tokens_from_systemd_credentials_rank_below_the_environment(tmp_path: Path) -> None:
    (tmp_path / "agui-auth-token").write_text("cred-token\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert load_settings({}, env=env).auth_token == "cred-token"
    assert load_settings({}, env=env).a2a_token == ""
    assert load_settings({}, env={**env, ENV_NAMES["auth_token"]: "env-token"}).auth_token == "env-token"
    config = tmp_path / "c.yaml"
    config.write_text("auth_token: file-token\n")
    assert load_settings({}, env=env, config_path=str(config)).auth_token == "cred-token"


def test_upstreams_flags_are_accepted() -> None:
    assert _flags(["-d"])["log_level"] == "debug"
    assert _flags(["--debug", "--log-level", "info"])["log_level"] == "info"  # the explicit level wins
    assert _flags(["--log-stdout"])["log_stdout"] is True
    assert _flags(["--no-log-stdout"])["log_stdout"] is False
    assert _flags([])["log_stdout"] is None and _flags([])["idle_shutdown"] is None
    assert load_settings(_flags(["--idle-shutdown", "1.5"]), env={}).idle_shutdown == 1.5
    with pytest.raises(ConfigError, match="idle_shutdown"):
        load_settings(_flags(["--idle-shutdown", "-2"]), env={})


def test_help_names_each_flags_environment_variable() -> None:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(out.getvalue().split())
    flags = [name for name in ENV_NAMES if f"--{name.replace('_', '-')} " in text]
    assert len(flags) >= len(ENV_NAMES) - 2  # allowed_cwds and allow_remote_kernel have no flag
    for name in flags:
        assert f"[env {ENV_NAMES[name]}]" in text, name
    assert "[env IAC_CODE_AGUI_CONFIG]" in text and "--idle-shutdown" in text and "-d, --debug" in text


def test_log_stdout_moves_the_log_lines_to_stdout() -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    try:
        root.handlers = []
        configure_logging("info", "text", stdout=True)
        streams = [h.stream for h in root.handlers if isinstance(h, logging.StreamHandler)]
        assert streams and all(s is sys.stdout for s in streams)
    finally:
        root.handlers = saved


def test_idle_means_no_live_run_and_no_pending_interrupt_since_the_last_activity() -> None:
    now = [100.0]
    watch = idle.IdleWatch(clock=lambda: now[0])
    now[0] = 130.0
    assert watch.idle_seconds(live_runs=0, waiting=False) == 30.0
    assert watch.idle_seconds(live_runs=1, waiting=False) == 0.0
    assert watch.idle_seconds(live_runs=0, waiting=True) == 0.0
    watch.touch("t1")
    assert watch.idle_seconds(0, False) == 0.0 and watch.threads() == ["t1"]
    now[0] = 135.0
    assert watch.idle_seconds(0, False) == 5.0
    watch.forget({"t1"})
    assert watch.threads() == []
    assert idle.check_interval(1000) == 5.0 and idle.check_interval(0.1) == 0.1 and idle.check_interval(2) == 0.5
