"""Settings, from command-line flags, environment variables, a config file and defaults.

Precedence: flag > environment > config file > default. The environment variables
use upstream's names (``IAC_CODE_AGUI_*``), so a deployment configured for the
upstream adapter keeps working. The config file is INI (``[agui-adapter]`` section,
``key = value``) so that it can be read with the standard library and carry comments;
``conf/agui-adapter.conf`` documents every key. Upstream's YAML config file (``iac-code agui
--config``: flat ``key: value`` lines, keys like ``a2a_url`` or ``a2a-url``) is read too, by
``flatyaml.py``: a file whose first line is not an INI section header is taken as YAML, with
upstream's ``debug: true`` meaning ``log_level: debug``. The WSGI entry point reads the same
environment and file.

The bearer tokens may also come from systemd credentials (``LoadCredential=``): the files
``agui-auth-token`` and ``agui-a2a-token`` in ``$CREDENTIALS_DIRECTORY``, below the
environment and above the config file.

Secrets (the bearer tokens) may come from the environment or the file; they are never
logged and never shown by ``Settings.__repr__``.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agui_adapter import flatyaml
from agui_adapter.protocol.i18n import SUPPORTED_LANGUAGES, normalize_language

SECTION = "agui-adapter"
KERNEL_CHOICES = ("auto", "iac-code", "scripted")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


#: ``--on-shutdown``: leave open runs to the kernel for the next process, or end them.
ON_SHUTDOWN_CHOICES = ("handover", "cancel")


class ConfigError(ValueError):
    """A setting has an invalid value; the message names it."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    a2a_url: str = ""
    a2a_token: str = field(default="", repr=False)
    auth_token: str = field(default="", repr=False)
    state_dir: str = ""
    kernel: str = "auto"
    heartbeat_seconds: float = 15.0
    default_language: str = "en"
    allowed_cwds: str = ""
    log_level: str = "info"
    log_format: str = "text"  # or "json": one JSON object per line (``logs.py``)
    #: One line per request (``access_log.py``); ``--no-access-log`` turns it off.
    access_log: bool = True
    interrupt_ttl_seconds: float = 86400.0
    allow_remote_kernel: bool = False
    kernel_ready_timeout: float = 30.0
    # How long a new turn waits for a task left running by a dead adapter to stop.
    stale_task_timeout_seconds: float = 10.0
    # Thread records idle for longer are deleted (``retention.py``); 0 keeps them for ever.
    thread_retention_days: float = 0.0
    keepalive_timeout_seconds: float = 5.0
    request_timeout_seconds: float = 30.0
    send_timeout_seconds: float = 60.0
    max_connections: int = 1024
    # On SIGTERM/SIGINT, how long open runs may go on before they are ended with a final event.
    shutdown_grace_seconds: float = 10.0
    # --- the application's edge (CORS, concurrent runs)
    #: Comma-separated exact origins allowed to call the adapter from a browser, or "*".
    cors_origins: str = ""
    #: Runs (turns, resumes, guidance) one process streams at once; beyond: 503 SERVER_BUSY.
    max_runs: int = 256
    #: Pixels of images decoded (to be shrunk) at once per process; beyond: a short wait, then 503.
    image_decode_budget_pixels: int = 40_000_000
    # --- reattach (``state.journal``)
    #: How long a run's events stay replayable after it ended; 0 drops them at its end.
    replay_retention_seconds: float = 300.0
    #: At most this many bytes of a run's events are kept for replay (older ones fall out).
    replay_buffer_bytes: int = 4 * 1024 * 1024
    #: How long a run goes on without a client before it is cancelled; 0: at once (the contract).
    disconnect_grace_seconds: float = 0.0
    #: What SIGTERM does to runs still open after the shutdown grace: ``handover`` leaves them
    #: to the kernel for the next process to adopt, ``cancel`` ends them; "" chooses
    #: (``on_shutdown_mode``): handover with an external kernel, cancel with our own.
    on_shutdown: str = ""
    # --- upstream's ``iac-code agui`` options
    #: Exit when no run has been active (and no interrupt pending) for this long; 0: never.
    idle_shutdown: float = 0.0
    #: Log lines to stdout instead of stderr (upstream mirrors its log file to stdout).
    log_stdout: bool = False

    def on_shutdown_mode(self) -> str:
        """``handover`` or ``cancel``: the setting, or handover when the kernel outlives us."""
        if self.on_shutdown:
            return self.on_shutdown
        return "handover" if self.a2a_url else "cancel"

    def resolved_state_dir(self, env: Mapping[str, str] | None = None) -> Path:
        env = os.environ if env is None else env
        if self.state_dir:
            return Path(self.state_dir).expanduser().resolve()
        config_dir = env.get("IAC_CODE_CONFIG_DIR")
        base = Path(config_dir).expanduser() if config_dir else Path("~/.iac-code").expanduser()
        return (base / "agui").resolve()


# setting name -> environment variable
ENV_NAMES: dict[str, str] = {
    "host": "IAC_CODE_AGUI_HOST",
    "port": "IAC_CODE_AGUI_PORT",
    "a2a_url": "IAC_CODE_AGUI_A2A_URL",
    "a2a_token": "IAC_CODE_AGUI_A2A_TOKEN",
    "auth_token": "IAC_CODE_AGUI_AUTH_TOKEN",
    "state_dir": "IAC_CODE_AGUI_STATE_DIR",
    "kernel": "IAC_CODE_AGUI_KERNEL",
    "heartbeat_seconds": "IAC_CODE_AGUI_HEARTBEAT_SECONDS",
    "default_language": "IAC_CODE_AGUI_DEFAULT_LANGUAGE",
    "allowed_cwds": "IAC_CODE_AGUI_ALLOWED_CWDS",
    "log_level": "IAC_CODE_AGUI_LOG_LEVEL",
    "log_format": "IAC_CODE_AGUI_LOG_FORMAT",
    "access_log": "IAC_CODE_AGUI_ACCESS_LOG",
    "interrupt_ttl_seconds": "IAC_CODE_AGUI_INTERRUPT_TTL_SECONDS",
    "allow_remote_kernel": "IAC_CODE_AGUI_ALLOW_REMOTE_KERNEL",
    "thread_retention_days": "IAC_CODE_AGUI_THREAD_RETENTION_DAYS",
    "keepalive_timeout_seconds": "IAC_CODE_AGUI_KEEPALIVE_TIMEOUT_SECONDS",
    "request_timeout_seconds": "IAC_CODE_AGUI_REQUEST_TIMEOUT_SECONDS",
    "send_timeout_seconds": "IAC_CODE_AGUI_SEND_TIMEOUT_SECONDS",
    "max_connections": "IAC_CODE_AGUI_MAX_CONNECTIONS",
    "shutdown_grace_seconds": "IAC_CODE_AGUI_SHUTDOWN_GRACE_SECONDS",
    "cors_origins": "IAC_CODE_AGUI_CORS_ORIGINS",
    "max_runs": "IAC_CODE_AGUI_MAX_RUNS",
    "image_decode_budget_pixels": "IAC_CODE_AGUI_IMAGE_DECODE_BUDGET_PIXELS",
    "replay_retention_seconds": "IAC_CODE_AGUI_REPLAY_RETENTION_SECONDS",
    "replay_buffer_bytes": "IAC_CODE_AGUI_REPLAY_BUFFER_BYTES",
    "disconnect_grace_seconds": "IAC_CODE_AGUI_DISCONNECT_GRACE_SECONDS",
    "on_shutdown": "IAC_CODE_AGUI_ON_SHUTDOWN",
    "idle_shutdown": "IAC_CODE_AGUI_IDLE_SHUTDOWN",
    "log_stdout": "IAC_CODE_AGUI_LOG_STDOUT",
}
CONFIG_ENV = "IAC_CODE_AGUI_CONFIG"
#: setting name -> file name in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``)
CREDENTIAL_NAMES: dict[str, str] = {"auth_token": "agui-auth-token", "a2a_token": "agui-a2a-token"}


#: Settings that are a whole number of things, at least one.
_COUNTS = ("max_connections", "max_runs")
#: Settings that are a number of seconds, 0 included.
_SECONDS_OR_ZERO = ("shutdown_grace_seconds", "replay_retention_seconds", "disconnect_grace_seconds", "idle_shutdown")
#: Settings that are true or false.
_BOOLEANS = ("allow_remote_kernel", "log_stdout", "access_log")
#: The smallest replay buffer: one run's first events must fit.
MIN_REPLAY_BUFFER_BYTES = 64 * 1024
#: Settings that are a positive, finite number of seconds.
_SECONDS = (
    "heartbeat_seconds",
    "interrupt_ttl_seconds",
    "kernel_ready_timeout",
    "stale_task_timeout_seconds",
    "keepalive_timeout_seconds",
    "request_timeout_seconds",
    "send_timeout_seconds",
)


def _number(name: str, value: Any, *, integer: bool, minimum: float, exclusive: bool = False) -> float:
    """A finite number >= ``minimum`` (> with ``exclusive``), or ConfigError naming the setting."""
    kind = "an integer" if integer else "a number"
    bound = f"more than {minimum:g}" if exclusive else f"at least {minimum:g}"
    try:
        number = int(str(value).strip()) if integer else float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be {kind}, got {value!r}.") from None
    if (
        number != number
        or number in (float("inf"), float("-inf"))
        or number < minimum
        or (exclusive and number == minimum)
    ):
        raise ConfigError(f"{name} must be {kind} {bound}, got {value!r}.")
    return number


def _coerce(name: str, value: Any) -> Any:
    """Convert one raw value to the setting's type, or raise ConfigError naming it."""
    if name == "port":
        try:
            port = int(str(value).strip())
        except ValueError:
            raise ConfigError(f"port must be an integer between 1 and 65535, got {value!r}.") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"port must be between 1 and 65535, got {port}.")
        return port
    if name in _COUNTS:
        return int(_number(name, value, integer=True, minimum=1))
    if name in _SECONDS:
        return _number(name, value, integer=False, minimum=0, exclusive=True)
    if name in _SECONDS_OR_ZERO:
        return _number(name, value, integer=False, minimum=0)
    if name == "image_decode_budget_pixels":
        return int(_number(name, value, integer=True, minimum=1))
    if name == "replay_buffer_bytes":
        return int(_number(name, value, integer=True, minimum=MIN_REPLAY_BUFFER_BYTES))
    if name == "thread_retention_days":
        text = str(value).strip().lower()
        if text in ("off", "never", "forever"):
            return 0.0
        try:
            days = float(text)
        except ValueError:
            raise ConfigError(f"thread_retention_days must be a number of days or 'off', got {value!r}.") from None
        if not 0 <= days < float("inf"):
            raise ConfigError(f"thread_retention_days must be 0 (off) or a positive number, got {value!r}.")
        return days
    if name in _BOOLEANS:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name} must be true or false, got {value!r}.")
    if name == "cors_origins":
        return _cors_origins(value)
    text = str(value).strip() if name not in ("a2a_token", "auth_token") else str(value)
    if name == "on_shutdown" and text not in ("", *ON_SHUTDOWN_CHOICES):  # "": chosen by the kernel
        raise ConfigError(f"on_shutdown must be one of {', '.join(ON_SHUTDOWN_CHOICES)}, got {text!r}.")
    if name == "kernel" and text not in KERNEL_CHOICES:
        raise ConfigError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {text!r}.")
    if name == "log_level":
        text = text.lower()
        if text not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {text!r}.")
    if name == "log_format":
        text = text.lower()
        if text not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {text!r}.")
    if name == "default_language":
        language = normalize_language(text)
        if language is None:
            raise ConfigError(f"default_language must be one of {', '.join(SUPPORTED_LANGUAGES)}, got {text!r}.")
        return language
    return text


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s,]+")


def _cors_origins(value: Any) -> str:
    """``*`` or comma-separated exact origins (``scheme://host[:port]``, no path), normalised."""
    items = [item.strip().rstrip("/") for item in str(value).split(",") if item.strip()]
    if "*" in items:
        if len(items) > 1:
            raise ConfigError("cors_origins must be '*' alone or a list of origins, not both.")
        return "*"
    for item in items:
        if not _ORIGIN.fullmatch(item.lower()):
            raise ConfigError(f"cors_origins must list origins like https://app.example.com, got {item!r}.")
    return ",".join(items)


def _is_ini(text: str) -> bool:
    """The first line that is not blank or a comment is a section header."""
    for line in text.splitlines():
        line = line.strip().lstrip("\ufeff")
        if line and not line.startswith(("#", ";")):
            return line.startswith("[") and line.endswith("]")
    return False


def read_config_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """The settings of a config file, keys normalised to snake_case: the ``[agui-adapter]``
    section of an INI file, or upstream's flat YAML mapping (``_read_yaml``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {os.fspath(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the config file {os.fspath(path)!r} is not UTF-8 text.") from None
    if not _is_ini(text) or os.fspath(path).endswith((".yaml", ".yml")):
        return _read_yaml(text, os.fspath(path))
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise ConfigError(f"the config file {os.fspath(path)!r} is not valid INI: {exc.message}") from None
    if not parser.has_section(SECTION):
        return {}
    known = {f.name for f in fields(Settings)}
    values: dict[str, str] = {}
    for key, value in parser.items(SECTION):
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown key {key!r} in the config file {os.fspath(path)!r}.")
        values[name] = value
    return values


def _read_yaml(text: str, path: str) -> dict[str, str]:
    """Upstream's YAML config: its keys (and ours) with upstream's meaning; ``debug: true``
    is ``log_level: debug`` unless the file sets ``log_level``."""
    try:
        data = flatyaml.loads(text)
    except flatyaml.FlatYamlError as exc:
        raise ConfigError(f"the config file {path!r} is not a flat YAML mapping: {exc}") from None
    known = {f.name for f in fields(Settings)}
    values: dict[str, str] = {}
    debug = False
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "debug":
            if not isinstance(value, bool):
                raise ConfigError(f"debug must be true or false in the config file {path!r}, got {value!r}.")
            debug = value
            continue
        if name not in known:
            raise ConfigError(f"unknown key {key!r} in the config file {path!r}.")
        if value is None:
            continue  # an empty value: the default, as for an empty INI value of a string
        if isinstance(value, bool) and name not in _BOOLEANS:
            raise ConfigError(f"{name} must not be true or false in the config file {path!r}.")
        values[name] = str(value).lower() if isinstance(value, bool) else str(value)
    if debug and "log_level" not in values:
        values["log_level"] = "debug"
    return values


def read_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """The tokens systemd passed with ``LoadCredential=`` (trailing newline dropped)."""
    directory = env.get("CREDENTIALS_DIRECTORY", "")
    if not directory:
        return {}
    values: dict[str, str] = {}
    for name, filename in CREDENTIAL_NAMES.items():
        try:
            with open(os.path.join(directory, filename), encoding="utf-8") as handle:
                values[name] = handle.read().rstrip("\r\n")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the credential {filename!r}: {exc}") from None
    return values


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_path: str | None = None,
) -> Settings:
    """Merge flags > env > config file > defaults into validated Settings."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    path = config_path or env.get(CONFIG_ENV) or ""
    file_values = read_config_file(path) if path else {}
    file_values.update({k: v for k, v in read_credentials(env).items() if v})
    merged: dict[str, Any] = {}
    for f in fields(Settings):
        name = f.name
        if name in flags:
            merged[name] = _coerce(name, flags[name])
        elif name in ENV_NAMES and env.get(ENV_NAMES[name], "") != "":
            merged[name] = _coerce(name, env[ENV_NAMES[name]])
        elif name in file_values:
            merged[name] = _coerce(name, file_values[name])
    return Settings(**merged)
