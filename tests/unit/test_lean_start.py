"""A lean start: what only some requests need is imported on first use, not at start.

Importing the server (what ``python run.py`` does before it listens) imports none of
jsonschema (only the general validation path and Resume payloads need it), requests (only
unary kernel calls and ``https://`` kernels), Pillow (only oversized images) or
prometheus_client (only multi-process metrics); nor does building the application and
answering ``/health``. Checked in a fresh interpreter through ``sys.modules``, which is not a
timing test (the figures are ``tests/bench_start.py``'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAZY = ("jsonschema", "requests", "urllib3", "PIL", "prometheus_client")

SERVE_HEALTH = """
import io, json, sys, tempfile
from agui_adapter.config import load_settings
from agui_adapter.kernel_client.launch import KernelProcess
from agui_adapter.cli import build_app
settings = load_settings({"state_dir": tempfile.mkdtemp()}, env={})
app = build_app(settings, KernelProcess("http://127.0.0.1:9/", "token", "configured"))
status = []
environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/health", "SERVER_NAME": "x", "SERVER_PORT": "80",
           "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1"}
body = b"".join(app(environ, lambda s, h, e=None: status.append(s)))
print(json.dumps({"status": status[0], "modules": [m for m in %r if m in sys.modules]}))
"""


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_server_imports_none_of_the_optional_heavy_modules() -> None:
    out = _run(f"import sys, agui_adapter.cli, agui_adapter.web.app; print([m for m in {LAZY!r} if m in sys.modules])")
    assert out == "[]"


def test_building_the_app_and_answering_health_imports_none_of_them() -> None:
    result = json.loads(_run(SERVE_HEALTH % (LAZY[:4],)))
    assert result["status"].startswith("200")
    assert result["modules"] == []


def test_the_check_would_see_a_module_imported_at_start() -> None:
    """The tests above can fail: a module a start does import is seen."""
    out = _run("import sys, agui_adapter.cli, json; print([m for m in ('werkzeug', 'json') if m in sys.modules])")
    assert out == "['werkzeug', 'json']"
