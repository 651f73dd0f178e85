"""Debian's real nginx on loopback, in front of adapters, with a recipe from ``deploy/``.

``require_nginx`` finds the binary (``pytest.fail`` under ``CI=true``, ``pytest.skip``
otherwise, with the install command); ``self_signed_cert`` makes a certificate for 127.0.0.1
with ``openssl``; ``render_recipe`` turns a ``deploy/`` recipe into one that listens and proxies
on this machine's free ports, failing when a line it replaces is no longer in the recipe (the
test and the recipe cannot drift apart); ``Nginx`` runs it as a foreground process with its own
prefix, pid, logs and temp paths in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
INSTALL_COMMAND = "apt-get install -y nginx openssl  (or: bash .ci/setup-peers.sh)"


def require_nginx() -> str:
    """The nginx binary; fails under ``CI=true`` and skips otherwise when nginx or openssl is missing."""
    nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    openssl = shutil.which("openssl")
    if nginx and openssl:
        return nginx
    message = f"{'nginx' if not nginx else 'openssl'} not found; install it with: {INSTALL_COMMAND}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A fresh self-signed certificate and key for ``127.0.0.1`` / ``localhost``."""
    cert, key = directory / "agui-adapter.crt", directory / "agui-adapter.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],  # fmt: skip
        check=True,
        capture_output=True,
    )
    return cert, key


def render_recipe(name: str, replacements: dict[str, str]) -> str:
    """The recipe ``deploy/<name>`` with each key replaced once (it must occur exactly once)."""
    text = (DEPLOY / name).read_text(encoding="utf-8")
    for old, new in replacements.items():
        count = text.count(old)
        assert count == 1, f"deploy/{name} should contain {old!r} exactly once (found {count})"
        text = text.replace(old, new)
    return text


def _main_conf(prefix: Path, site: Path) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / 'tmp' / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # gzip on for every type, as an operator's global configuration may have it: the recipe's
    # location must switch it off for the event stream.
    return f"""{user}daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix / "access.log"};
{temp}
    gzip on;
    gzip_min_length 1;
    gzip_types text/event-stream application/json text/plain;
    include {site};
}}
"""


class Nginx:
    """``nginx -p DIR -c nginx.conf`` in the foreground, serving ``site`` (an http {} fragment)."""

    def __init__(self, binary: str, prefix: Path, site: str, port: int) -> None:
        self.binary, self.prefix, self.port = binary, prefix, port
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / "tmp" / kind).mkdir(parents=True, exist_ok=True)
        (prefix / "site.conf").write_text(site, encoding="utf-8")
        (prefix / "nginx.conf").write_text(_main_conf(prefix, prefix / "site.conf"), encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, *extra: str) -> list[str]:
        return [
            self.binary,
            "-p",
            str(self.prefix),
            "-c",
            str(self.prefix / "nginx.conf"),
            "-e",
            str(self.prefix / "error.log"),
            *extra,
        ]

    def check(self) -> None:
        """``nginx -t``: the rendered recipe is valid nginx configuration."""
        done = subprocess.run(self.command("-t"), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    def start(self, timeout: float = 15.0) -> Nginx:
        self.check()
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.error_log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port}: {self.error_log()}")

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: fast shutdown of master and workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
