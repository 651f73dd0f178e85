"""What the flow tests against the scripted kernel share.

``KERNEL_TOKEN`` is the bearer token of the session's scripted kernel (the ``scripted_kernel``
fixture); ``kernel_calls`` reads that kernel's request log; ``interrupted`` runs a turn that
the scripted kernel ends with a permission interrupt (its ``[WRITE]`` script).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, run_body

KERNEL_TOKEN = "scripted-kernel-token"


def kernel_calls(kernel: Any, method: str, context_id: str | None = None) -> list[dict]:
    calls = [r for r in list(kernel.requests) if r["method"] == method]
    if context_id is not None:
        calls = [c for c in calls if c["params"].get("message", {}).get("contextId") == context_id]
    return calls


def interrupted(client: Client, workspace: Path, text: str = "[WRITE] make a file", **kw: Any) -> tuple[dict, Any]:
    body = run_body(text, cwd=str(workspace), **kw)
    result = client.run(body)
    assert result.terminal["type"] == "RUN_FINISHED", result.terminal
    assert result.terminal["outcome"]["type"] == "interrupt"
    return body, result
