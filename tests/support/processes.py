"""Reading processes through Linux ``/proc``: children, descendants, command lines, liveness.

Shared by the tests that check no process outlives the adapter (kernel lifetime, shutdown).
"""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    result, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            result.append(child)
            todo.append(child)
    return result


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
