"""``deploy/agui-adapter.service``: a valid, hardened unit whose command line the adapter accepts.

``systemd-analyze verify`` checks the unit (it needs the ``ExecStart`` binary: the test points
it at an executable it creates) and must print nothing, since it reports unknown keys and bad
values only as warnings; ``systemd-analyze security --offline`` must rate its exposure 2.0 or
better. Skipped, with the reason, only where ``systemd-analyze`` is absent. The flags and the
environment of the unit are parsed by the adapter's own parser and settings.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from agui_adapter.cli import parse_args
from agui_adapter.config import CREDENTIAL_NAMES, Settings, load_settings
from agui_adapter.ops.fdlimit import descriptors_needed

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "agui-adapter.service"
BINARY = "/opt/agui-adapter/bin/agui-adapter"


def _directives() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze not found (not a systemd system): the unit is not verified here")
    return path


@pytest.fixture
def unit_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists."""
    binary = tmp_path / "bin" / "agui-adapter"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    text = UNIT.read_text(encoding="utf-8")
    assert text.count("ExecStart=" + BINARY + " ") == 1
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace("ExecStart=" + BINARY, f"ExecStart={binary}"), encoding="utf-8")
    return copy


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(unit_copy: Path) -> None:
    done = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", str(unit_copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "" and done.stdout.strip() == "", done.stderr + done.stdout


def test_systemd_analyze_verify_would_report_a_typo(unit_copy: Path) -> None:
    """The check above can fail: a misspelt hardening key is reported."""
    unit_copy.write_text(unit_copy.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict"))
    done = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", str(unit_copy)], capture_output=True, text=True, timeout=60
    )
    assert "ProtectSystm" in done.stderr


def test_systemd_analyze_security_rates_the_unit_ok(unit_copy: Path) -> None:
    done = subprocess.run(
        [_systemd_analyze(), "security", "--offline=true", "--threshold=20", "--no-pager", str(unit_copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_the_credential_alternative_verifies_too(unit_copy: Path, tmp_path: Path) -> None:
    """The commented ``LoadCredential=`` line, once uncommented (as the unit tells), is valid."""
    text = unit_copy.read_text()
    assert "\n#LoadCredential=agui-auth-token:/etc/agui-adapter/auth-token\n" in text
    source = tmp_path / "auth-token"
    source.write_text("token\n")
    unit_copy.write_text(
        text.replace(
            "#LoadCredential=agui-auth-token:/etc/agui-adapter/auth-token", f"LoadCredential=agui-auth-token:{source}"
        )
    )
    done = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", str(unit_copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    assert CREDENTIAL_NAMES["auth_token"] == "agui-auth-token"


def test_the_unit_notifies_and_has_room_for_its_connections() -> None:
    d = _directives()
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert float(d["WatchdogSec"][0]) >= 10  # pings every 15 s, each a /health of its own
    args = parse_args(shlex.split(d["ExecStart"][0])[1:])
    settings = load_settings({k: v for k, v in vars(args).items() if k not in ("config", "debug")}, env={})
    assert int(d["LimitNOFILE"][0]) >= descriptors_needed(settings.max_connections, settings.max_runs)


def test_the_unit_is_hardened() -> None:
    d = _directives()
    assert d["DynamicUser"] == ["yes"] or "User" in d
    assert d["ProtectSystem"] == ["strict"]
    assert d["NoNewPrivileges"] == ["yes"]
    assert d["StateDirectory"][0].split()[0] == "agui-adapter"
    assert d["CapabilityBoundingSet"] == [""]
    assert "ReadWritePaths" not in d  # the state directory is the only writable place


def test_the_command_line_and_environment_are_valid_adapter_settings() -> None:
    d = _directives()
    [exec_start] = d["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == BINARY
    args = parse_args(argv[1:])
    env = dict(value.split("=", 1) for value in d["Environment"])
    settings = load_settings({k: v for k, v in vars(args).items() if k != "config"}, env=env)
    assert settings.host == "127.0.0.1"  # behind nginx, never exposed
    assert settings.kernel == "iac-code"
    state_root = "/var/lib/" + d["StateDirectory"][0].split()[0]
    assert settings.resolved_state_dir().is_relative_to(state_root)
    for cwd in settings.allowed_cwds.split(":"):
        assert Path(cwd).is_relative_to(state_root)  # workspaces are writable under ProtectSystem=strict
    stop_timeout = float(d["TimeoutStopSec"][0])
    assert stop_timeout > settings.shutdown_grace_seconds + 5  # runs end with their final event
    assert settings.auth_token == "" and settings.a2a_token == ""  # secrets only in the EnvironmentFile
    assert isinstance(settings, Settings)
