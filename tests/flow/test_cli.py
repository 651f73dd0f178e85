"""Start-up: configuration precedence, `python run.py` on its embedded kernel, clean stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from agui_adapter.config import ConfigError, load_settings
from agui_adapter.kernel_client.a2a import check_kernel_url
from tests.support.agui_client import Client, run_body
from tests.support.servers import ROOT, wait_until_unreachable


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nport = 9001\nheartbeat-seconds = 7\nhost = 0.0.0.0\nlog_level = debug\n")
    env = {"IAC_CODE_AGUI_PORT": "9002", "IAC_CODE_AGUI_HEARTBEAT_SECONDS": "5"}
    settings = load_settings({"port": "9003"}, env=env, config_path=str(conf))
    assert settings.port == 9003 and settings.heartbeat_seconds == 5.0 and settings.host == "0.0.0.0"
    assert settings.log_level == "debug" and settings.kernel == "auto"
    via_env = load_settings({}, env={"IAC_CODE_AGUI_CONFIG": str(conf)})
    assert via_env.port == 9001


def test_shipped_config_file_is_the_defaults() -> None:
    from agui_adapter.config import Settings

    assert load_settings({}, env={}, config_path=str(ROOT / "conf" / "agui-adapter.conf")) == Settings()


@pytest.mark.parametrize(
    "flags,message",
    [
        ({"port": "x"}, "port"),
        ({"port": "70000"}, "port"),
        ({"kernel": "nope"}, "kernel"),
        ({"heartbeat_seconds": "0"}, "heartbeat_seconds"),
        ({"default_language": "xx"}, "default_language"),
    ],
)
def test_bad_settings_are_named(flags: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(flags, env={})


def test_unknown_config_key(tmp_path: Path) -> None:
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nprot = 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load_settings({}, env={}, config_path=str(conf))


def test_settings_repr_hides_tokens() -> None:
    settings = load_settings({"auth_token": "tok-A", "a2a_token": "tok-B"}, env={})
    assert "tok-A" not in repr(settings) and "tok-B" not in repr(settings)


def test_kernel_url_is_loopback_only() -> None:
    assert check_kernel_url("http://[::1]:41242", allow_remote=False) == "http://[::1]:41242/"
    assert check_kernel_url("http://localhost:1/a2a", allow_remote=False) == "http://localhost:1/a2a/"
    with pytest.raises(ValueError):
        check_kernel_url("http://10.0.0.8:41242/", allow_remote=False)
    with pytest.raises(ValueError):
        check_kernel_url("ftp://127.0.0.1/", allow_remote=False)
    assert check_kernel_url("https://kernel.internal/", allow_remote=True) == "https://kernel.internal/"


def test_bad_flag_exits_with_a_message() -> None:
    done = subprocess.run(
        [sys.executable, "run.py", "--port", "abc"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "port" in done.stderr
    done = subprocess.run(
        [sys.executable, "run.py", "--a2a-url", "http://192.0.2.1:9/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "loopback" in done.stderr


def test_run_py_works_out_of_the_box_and_stops_its_kernel(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE")}
    env.update(
        IAC_CODE_CONFIG_DIR=str(tmp_path / "cfg"), PYTHONUNBUFFERED="1", IAC_CODE_AGUI_ALLOWED_CWDS=str(tmp_path)
    )
    proc = subprocess.Popen(
        [sys.executable, "run.py", "--port", "0", "--kernel", "scripted"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        match = re.search(r"listening on (http://\S+/) \(kernel: scripted at (http://\S+/)", line)
        assert match, line
        url, kernel_url = match.groups()
        assert requests.get(url + "ready", timeout=5).status_code == 200
        result = Client(url).run(run_body(cwd=str(tmp_path / "ws")))
        assert result.terminal["type"] == "RUN_FINISHED" and result.text()
        assert (tmp_path / "cfg" / "agui" / "threads").is_dir()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    wait_until_unreachable(kernel_url + "health", 5)  # the kernel child does not outlive the adapter
