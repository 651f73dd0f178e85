"""The session-wide secrets check: no secret a test sent is ever written down.

``Client.run`` remembers every secret of a request body (``remember_secrets``); the fixtures
that start adapters register their state directories (``STATE_DIRS``) and processes, whose
output is their log (``ADAPTER_LOGS``). ``tests/conftest.py`` calls ``leaked_secrets`` once at
the end of the session, for every suite, the real-kernel one included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SENT_SECRETS: set[str] = set()
STATE_DIRS: list[Path] = []
ADAPTER_LOGS: list[Any] = []  # anything with a ``log: bytes`` attribute (``AdapterProcess``)


def remember_secrets(body: Any) -> None:
    """Remember the secrets of a ``RunAgentInput`` body (llmApiKey, cloud keys, LLM headers)."""
    iac = body.get("forwardedProps", {}).get("iacCode", {}) if isinstance(body, dict) else {}
    if not isinstance(iac, dict):
        return
    cloud = iac.get("alibabaCloud") if isinstance(iac.get("alibabaCloud"), dict) else {}
    headers = iac.get("llmHeaders") if isinstance(iac.get("llmHeaders"), dict) else {}
    for value in [iac.get("llmApiKey"), cloud.get("accessKeySecret"), cloud.get("securityToken"), *headers.values()]:
        if isinstance(value, str) and len(value) >= 6:
            SENT_SECRETS.add(value)


def leaked_secrets() -> list[str]:
    """Where a remembered secret was written down (a file of a state dir, an adapter log), masked."""
    leaks = []
    for directory in STATE_DIRS:
        # the journal sweepers of in-process adapters (daemon threads) outlive their tests and
        # may delete an expired run's journal while this walks: what is gone is not written down
        for parent, _, names in os.walk(directory):
            for name in names:
                path = Path(parent, name)
                if not path.is_file():
                    continue  # gone meanwhile, or not a regular file
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                leaks += [f"{path}: {s[:4]}…" for s in SENT_SECRETS if s.encode() in data]
    for process in ADAPTER_LOGS:
        leaks += [f"adapter log: {s[:4]}…" for s in SENT_SECRETS if s.encode() in process.log]
    return leaks
