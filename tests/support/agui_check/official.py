"""Python front end of ``verify.mjs``: check AG-UI SSE streams with the official TS client.

``check_streams([run0_bytes, run1_bytes, ...])`` writes the streams to temp files and runs
``node verify.mjs`` with ``NODE_PATH`` pointing at a ``node_modules`` that holds
``@ag-ui/client@1.0.0`` (env ``AGUI_NODE_MODULES``, default
``~/.cache/agui-adapter/node/node_modules``; ``.ci/setup-peers.sh`` installs it). The streams
are consecutive runs on one thread; a run that ends with an interrupt is resumed by the next.

``require_official_client()`` is for tests: it fails under ``CI=true`` and skips otherwise when
node or the modules are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERIFY_SCRIPT = Path(__file__).resolve().with_name("verify.mjs")
DEFAULT_NODE_MODULES = Path("~/.cache/agui-adapter/node/node_modules")
NODE_MODULES_ENV = "AGUI_NODE_MODULES"
INSTALL_COMMAND = (
    "npm install --prefix ~/.cache/agui-adapter/node @ag-ui/client@1.0.0 @ag-ui/core@1.0.0"
    "   (or run .ci/setup-peers.sh)"
)


class OfficialClientError(RuntimeError):
    """The checker itself could not run (node or ``@ag-ui/client`` missing, bad input)."""


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one ``verify.mjs`` invocation."""

    ok: bool
    output: str
    returncode: int = 0
    report: dict[str, Any] | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return self.ok


def node_binary() -> str | None:
    """Path of ``node`` (env ``AGUI_NODE`` or ``PATH``), if any."""
    return os.environ.get("AGUI_NODE") or shutil.which("node")


def node_modules_dir() -> Path | None:
    """The ``node_modules`` holding ``@ag-ui/client`` (env ``AGUI_NODE_MODULES`` or default), if present."""
    raw = os.environ.get(NODE_MODULES_ENV) or str(DEFAULT_NODE_MODULES)
    path = Path(raw).expanduser()
    return path if (path / "@ag-ui" / "client" / "package.json").is_file() else None


def missing_reason() -> str | None:
    """Why the official client cannot run here, or ``None`` if it can."""
    if node_binary() is None:
        return "node is not installed (the official @ag-ui/client check needs Node.js >= 18)"
    if node_modules_dir() is None:
        return f"@ag-ui/client@1.0.0 not found (AGUI_NODE_MODULES); install it with: {INSTALL_COMMAND}"
    return None


def require_official_client() -> Path:
    """The ``node_modules`` dir; ``pytest.fail`` under ``CI=true``, ``pytest.skip`` otherwise if missing."""
    import pytest

    reason = missing_reason()
    if reason is None:
        modules = node_modules_dir()
        assert modules is not None
        return modules
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def check_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    chunk: int = 7,
    resume_payload: Any = None,
    json_report: bool = False,
    timeout: float = 60.0,
) -> CheckResult:
    """Run ``verify.mjs`` over capture files (consecutive runs on one thread)."""
    node = node_binary()
    modules = node_modules_dir()
    if node is None or modules is None:
        raise OfficialClientError(missing_reason() or "official client unavailable")
    if not paths:
        raise OfficialClientError("no streams to check")
    command = [node, str(VERIFY_SCRIPT), "--chunk", str(chunk)]
    if resume_payload is not None:
        command += ["--resume-payload", json.dumps(resume_payload)]
    if json_report:
        command.append("--json")
    command += [str(p) for p in paths]
    env = dict(os.environ, NODE_PATH=str(modules))
    env.pop("SUPPRESS_TRANSFORMATION_WARNINGS", None)
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise OfficialClientError(f"verify.mjs timed out after {timeout:.0f}s") from exc
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode not in (0, 1):
        raise OfficialClientError(f"verify.mjs failed to run (exit {proc.returncode}): {output}")
    report = json.loads(proc.stdout) if json_report else None
    return CheckResult(
        ok=proc.returncode == 0,
        output=output,
        returncode=proc.returncode,
        report=report,
    )


def check_streams(
    streams: Sequence[bytes],
    *,
    chunk: int = 7,
    resume_payload: Any = None,
    json_report: bool = False,
    timeout: float = 60.0,
) -> CheckResult:
    """Check raw SSE bodies (one per run, in order) with the official client."""
    with tempfile.TemporaryDirectory(prefix="agui-check-") as tmp:
        paths = []
        for index, body in enumerate(streams):
            path = Path(tmp) / f"run-{index:02d}.sse"
            path.write_bytes(body)
            paths.append(path)
        return check_files(
            paths,
            chunk=chunk,
            resume_payload=resume_payload,
            json_report=json_report,
            timeout=timeout,
        )
