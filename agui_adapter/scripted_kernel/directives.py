"""The directive language: what a turn's text asks the scripted kernel to do.

Why: the scripts are chosen by markers such as ``[WRITE]`` or ``[SILENT 2]`` in
the user text (the README beside this module lists them); parsing them is one
small grammar, kept apart from the scripts that act on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_DIRECTIVE_RE = re.compile(
    r"\[(?P<flag>THINK|TOOL|PROGRESS|WRITE|AUTO|ASK|SLOW|FAIL|IMAGES|ECHO|RECALL"
    r"|PIPE-(?:ASK|CANDIDATES|PERMS|RESOURCE|FAIL|OOO|SLOW))\]"
    r"|\[(?P<arg>SILENT|FAST)\s+(?P<num>\d+(?:\.\d*)?|\.\d+)\]"
)


@dataclass(frozen=True)
class Directives:
    """The script choices found in a turn's text (see README.md beside this module)."""

    flags: frozenset[str] = frozenset()
    silent: float | None = None
    fast: int | None = None
    rest: str = ""

    @classmethod
    def parse(cls, text: str) -> Directives:
        flags: set[str] = set()
        silent: float | None = None
        fast: int | None = None
        for match in _DIRECTIVE_RE.finditer(text):
            if match.group("flag"):
                flags.add(match.group("flag"))
            elif match.group("arg") == "SILENT":
                silent = float(match.group("num"))
            else:
                fast = int(float(match.group("num")))
        rest = re.sub(r"[ \t]{2,}", " ", _DIRECTIVE_RE.sub("", text)).strip()
        return cls(frozenset(flags), silent, fast, rest)

    def __contains__(self, flag: str) -> bool:
        return flag in self.flags


@dataclass(frozen=True)
class Turn:
    """A new or follow-up turn as the scripts see it (``turns``: the context's count, this one included)."""

    directives: Directives
    iac: dict[str, Any]
    image_types: tuple[str, ...]
    turns: int
