"""The scripted kernel's memory across restarts: which session each context continues.

Why: the real kernel keeps its sessions on disk, so after a restart a turn on a
known context continues the same session id. The embedded kernel that
``python run.py`` starts does the same when it is given a state directory;
without it a restarted demo would hand every old thread a new session id, which
the adapter must treat as an identity violation.

Only what a session needs to continue is kept: per context its session id, its
workspace, its turn count (``[RECALL]``) and its last pipeline sequence. No
message text and no metadata is ever written, so nothing the adapter forwards
(``llmApiKey``, cloud credentials) can reach the disk. Tasks are not kept: a
task of a kernel that stopped is gone, as with the real kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

SESSIONS_FILE = "sessions.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SessionRecord:
    """What a context needs to continue after a restart."""

    session_id: str
    cwd: str | None = None
    turns: int = 0
    pipeline_sequence: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "turns": self.turns,
            "pipelineSequence": self.pipeline_sequence,
        }

    @classmethod
    def from_json(cls, raw: Any) -> SessionRecord | None:
        """The record, or ``None`` when the entry is not one (it is then skipped)."""
        if not isinstance(raw, dict):
            return None
        session_id, cwd = raw.get("sessionId"), raw.get("cwd")
        turns, sequence = raw.get("turns", 0), raw.get("pipelineSequence", 0)
        if not isinstance(session_id, str) or not session_id:
            return None
        if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd)):
            return None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (turns, sequence)):
            return None
        return cls(session_id, cwd, turns, sequence)


class SessionStore:
    """``sessions.json`` in a private directory (0700), replaced atomically (0600 files)."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, SESSIONS_FILE)
        self._lock = threading.Lock()
        self._saved: dict[str, SessionRecord] | None = None

    def load(self) -> dict[str, SessionRecord]:
        """The records by context id; an unreadable file is reported and treated as empty."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                raw = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            _warn(f"cannot read {self.path}: {exc}; starting without earlier sessions")
            return {}
        contexts = raw.get("contexts") if isinstance(raw, dict) else None
        if not isinstance(contexts, dict):
            _warn(f"{self.path} is not a sessions file; starting without earlier sessions")
            return {}
        records: dict[str, SessionRecord] = {}
        for context_id, entry in contexts.items():
            record = SessionRecord.from_json(entry)
            if record is not None:
                records[context_id] = record
        with self._lock:
            self._saved = dict(records)
        return records

    def save(self, records: dict[str, SessionRecord]) -> None:
        """Write the records unless they are what the file already holds.

        Callers serialise snapshot and save (see ``KernelState.persist``), so a
        slower writer never puts back an older state.
        """
        with self._lock:
            if records == self._saved:
                return
            body = {
                "version": FORMAT_VERSION,
                "contexts": {context_id: record.to_json() for context_id, record in records.items()},
            }
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
            fd, temp = tempfile.mkstemp(prefix=".sessions-", suffix=".tmp", dir=self.directory)  # mode 0600
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(body, handle, separators=(",", ":"), ensure_ascii=False)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
            self._saved = dict(records)


def _warn(text: str) -> None:
    print(f"scripted kernel: {text}", file=sys.stderr)
