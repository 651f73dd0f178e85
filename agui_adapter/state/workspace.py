"""The iac-code workspace (``forwardedProps.iacCode.cwd``): where a run may work.

Why this module exists: ``cwd`` is a client-chosen path on the adapter's host, so it must be
confined to the operator's allowed roots, the same ones the kernel enforces
(``IAC_CODE_AGUI_ALLOWED_CWDS``, else ``IACCODE_A2A_ALLOWED_CWDS``; default: the adapter's
own directory and the system temp dir). It is the only module of the protocol core that
touches the filesystem, and it splits the job in two so that nothing is created for a
request that is then refused (upstream creates the directory during admission, before the
busy and conflict checks, and leaves it behind):

- :func:`resolve_workspace` checks and resolves, and creates nothing;
- :func:`ensure_workspace` creates the directory, once the request is admitted.

:class:`Workspaces` is the check a server makes on every run: the roots and the reserved
directories resolved once a second rather than per request (resolving them is most of the
check's cost), and a client's path resolved once for each such second it is used in (then
confirmed with one ``lstat``).

The adapter's own state directory is never a workspace, even under an allowed root (the
default roots include the temp dir, where a state dir may well live): a workspace inside it,
equal to it or containing it would let a tool call write next to, or over, the thread
records. The caller passes it as ``reserved``; real paths are compared, symlinks resolved.

Unlike upstream, ``$VAR`` sequences are **not** expanded: the value comes from the client,
and expanding it against the adapter's environment would let a client probe that
environment (and make the meaning of a path depend on how the server was started). ``$`` is
an ordinary file name character, so ``/data/$USER`` names exactly that directory. ``~`` is
still expanded, as the contract's examples and upstream allow.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agui_adapter.ops.faults import describe
from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.errors import AguiError, Code

__all__ = ["CWD_FIELD", "ROOT_VARIABLES", "Workspaces", "allowed_roots", "ensure_workspace", "resolve_workspace"]

#: The variables naming the allowed roots, by precedence (the first non-empty one wins).
ROOT_VARIABLES = ("IAC_CODE_AGUI_ALLOWED_CWDS", "IACCODE_A2A_ALLOWED_CWDS")

#: The field every workspace error names, as the envelope's field errors name theirs.
CWD_FIELD = "forwardedProps.iacCode.cwd"

#: The longest workspace path accepted, in UTF-8 bytes (Linux's PATH_MAX less the NUL), and
#: the most components it may have: a deeper path is no workspace anyone works in, and
#: creating it would cost one directory per component.
MAX_CWD_BYTES = 4095
MAX_CWD_DEPTH = 128
#: The longest component (a file name: Linux's NAME_MAX, in bytes).
MAX_NAME_BYTES = 255

log = logging.getLogger("agui_adapter.state.workspace")


def _invalid(template: str) -> AguiError:
    return AguiError(Code.INVALID_INPUT, template, {"field": CWD_FIELD})


def allowed_roots(env: Mapping[str, str], process_cwd: str, temp_dir: str) -> list[Path]:
    """The resolved, existing directories a workspace must lie in (possibly none).

    The first non-empty variable of :data:`ROOT_VARIABLES` is split on ``os.pathsep``;
    empty items are skipped, ``~`` is expanded and relative items are taken from
    ``process_cwd``. With neither variable set, the roots are ``process_cwd`` and
    ``temp_dir``. Items that are not existing directories are dropped, so an empty result
    refuses every workspace.
    """
    configured = next((env[name] for name in ROOT_VARIABLES if env.get(name)), None)
    if configured is None:
        candidates = [process_cwd, temp_dir]
    else:
        candidates = [item for item in configured.split(os.pathsep) if item]
    roots: list[Path] = []
    for item in candidates:
        path = Path(os.path.expanduser(item))
        if not path.is_absolute():
            path = Path(process_cwd) / path
        try:
            resolved = path.resolve(strict=False)
            if resolved.is_dir() and resolved not in roots:
                roots.append(resolved)
        except (OSError, RuntimeError, ValueError):
            continue
    return roots


def resolve_workspace(raw: str, roots: Sequence[Path], reserved: Sequence[Path] = ()) -> Path:
    """Check ``raw`` against the roots and return its resolved path; creates nothing.

    ``raw`` must be absolute after ``~`` expansion. It is normalized, then resolved with
    symlinks followed, so a link pointing out of a root is refused. It must not be one of
    the ``reserved`` directories (the adapter's state directory), lie inside one or contain
    one. Raises ``AguiError(Code.INVALID_INPUT, CWD_*)``.
    """
    try:
        resolved_roots = [Path(root).resolve(strict=False) for root in roots]
        resolved_reserved = [_real(os.path.abspath(path)) for path in reserved]
    except (OSError, RuntimeError, ValueError):
        raise _invalid(messages.CWD_INVALID) from None
    return _refused_on_failure(lambda: _check(raw, resolved_roots, resolved_reserved), messages.CWD_INVALID)


def _refused_on_failure(check: Callable[[], Path], template: str) -> Path:
    """``check()``, with any failure but a refusal turned into one: whatever the client's
    path makes the standard library raise (a ``RecursionError``, an ``OSError``, a
    ``ValueError``...) is a 400 naming the field, logged as one bounded line."""
    try:
        return check()
    except AguiError:
        raise
    except Exception as exc:  # noqa: BLE001 - no workspace path reaches a 500
        log.info("workspace refused: %s", describe(exc))
        raise _invalid(template) from None


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


#: What ``lstat`` may say of a path that is simply not there (as ``Path.exists`` reads them).
_ABSENT = {errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP}


def _within(path: str, root: str) -> bool:
    """Whether the absolute, normalized ``path`` is ``root`` or lies under it (string
    components compared, as ``PurePath.is_relative_to`` does, at a fraction of its cost)."""
    return path == root or path.startswith(root if root.endswith("/") else root + "/")


def _is_plain_directory(path: str | Path) -> bool:
    """Whether ``path`` is a directory and no link (one ``lstat``); False when it is not there."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _check(raw: str, roots: Sequence[Path], reserved: Sequence[Path]) -> Path:
    """``resolve_workspace`` with ``roots`` and ``reserved`` resolved already.

    On strings, not ``pathlib``: it runs on every run's way to ``RUN_STARTED``, and
    ``pathlib``'s parsing made it cost 120 µs where this costs about 60 (about 30 when the
    workspace is there: one ``lstat`` instead of the walk up its components)."""
    if not isinstance(raw, str) or not raw:
        raise _invalid(messages.CWD_NOT_ABSOLUTE)
    if "\x00" in raw or len(raw) > MAX_CWD_BYTES or raw.count("/") > MAX_CWD_DEPTH:
        raise _invalid(messages.CWD_INVALID)
    # os.path.expanduser leaves an unknown ~user alone (pathlib would raise), which then
    # fails the absolute check below.
    expanded = os.path.expanduser(raw)
    if not os.path.isabs(expanded):
        raise _invalid(messages.CWD_NOT_ABSOLUTE)
    try:
        resolved = os.path.realpath(os.path.normpath(expanded))
    except (OSError, RuntimeError, ValueError):
        raise _invalid(messages.CWD_INVALID) from None
    names = [name for name in resolved.split("/") if name]
    if len(os.fsencode(resolved)) > MAX_CWD_BYTES or len(names) > MAX_CWD_DEPTH:
        raise _invalid(messages.CWD_INVALID)
    if any(len(os.fsencode(name)) > MAX_NAME_BYTES for name in names):
        raise _invalid(messages.CWD_INVALID)  # refused here, not after creating its parents
    if not any(_within(resolved, str(root)) for root in roots):
        raise _invalid(messages.CWD_OUTSIDE_ROOTS)
    for path in reserved:
        own = str(path)
        if _within(resolved, own) or _within(own, resolved):
            raise _invalid(messages.CWD_STATE_DIR)
    # The common case in one call: the workspace is there, a directory and no link, so
    # every ancestor was followed to reach it and none is a link left unresolved.
    if _is_plain_directory(resolved):
        return Path(resolved)
    # A symlink left in the resolved path could not be followed (a loop, say), and Python
    # versions differ on raising for it: refuse it here, uniformly. The workspace, or the
    # nearest ancestor that exists, must be a directory: a path under a regular file could
    # never be created.
    nearest: int | None = None  # the mode of the nearest existing one
    current = resolved
    while True:
        try:
            mode = os.lstat(current).st_mode
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise _invalid(messages.CWD_INVALID) from None
        else:
            if stat.S_ISLNK(mode):
                raise _invalid(messages.CWD_INVALID)
            if nearest is None:
                nearest = mode
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if nearest is None or not stat.S_ISDIR(nearest):
        raise _invalid(messages.CWD_NOT_DIRECTORY)
    return Path(resolved)


class Workspaces:
    """The workspace check of a server: ``resolve(raw)`` is ``resolve_workspace`` against
    the roots of ``env`` (``allowed_roots``) and the ``reserved`` directories, both resolved
    again at most every ``refresh_seconds`` (the process's directory, a default root, read
    again then too), so that a root created, removed or re-linked is seen within that time.

    A client's path is resolved once per such refresh: the resolved path is kept with the
    roots it was checked against, and taken again while those are the roots and it is still
    a directory that is no link (``_is_plain_directory``, the check's own fast path).
    Resolving it costs a ``getcwd`` and an ``lstat`` per component, six system calls for
    ``/tmp/a/b/c/ws``: under many runs starting at once each system call hands the
    interpreter's lock over (``ops.process_local`` has the figure). What is given out was
    checked against the roots in force; a link swapped into the path since is seen at the
    next refresh, as it would be by a request that came a moment earlier (the kernel opens
    the path later in any case)."""

    #: The most client paths kept; all are forgotten when there would be more.
    SEEN_MAX = 1024

    def __init__(
        self,
        env: Mapping[str, str],
        reserved: Sequence[Path] = (),
        *,
        refresh_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._env = dict(env)
        self._reserved = tuple(reserved)
        self._refresh = refresh_seconds
        self._clock = clock
        self._known: tuple[float, list[Path], list[Path]] | None = None
        self._seen: dict[str, tuple[object, Path]] = {}  # raw path -> (the roots checked against, resolved)

    def roots(self) -> list[Path]:
        """The allowed roots, resolved (possibly none)."""
        return self._resolved()[1]

    def resolve(self, raw: str) -> Path:
        known = self._resolved()
        seen = self._seen.get(raw)
        if seen is not None and seen[0] is known and _is_plain_directory(seen[1]):
            return seen[1]
        _, roots, reserved = known
        path = _refused_on_failure(lambda: _check(raw, roots, reserved), messages.CWD_INVALID)
        if len(self._seen) >= self.SEEN_MAX:
            self._seen.clear()
        self._seen[raw] = (known, path)
        return path

    def _resolved(self) -> tuple[float, list[Path], list[Path]]:
        now = self._clock()
        known = self._known
        if known is None or now - known[0] >= self._refresh:
            roots = allowed_roots(self._env, os.getcwd(), tempfile.gettempdir())
            try:
                reserved = [_real(os.path.abspath(path)) for path in self._reserved]
            except (OSError, RuntimeError, ValueError):
                reserved = [Path(os.path.abspath(path)) for path in self._reserved]
            known = self._known = (now, roots, reserved)  # one tuple, replaced whole
        return known


def ensure_workspace(path: Path) -> None:
    """Create the workspace directory (and its parents) if missing.

    Call it only once the request is admitted. Raises
    ``AguiError(Code.INVALID_INPUT, CWD_CANNOT_CREATE)`` on any failure. The missing
    directories are made one by one from the nearest existing ancestor down, not by
    ``Path.mkdir(parents=True)``, which recurses once per missing component.
    """
    _refused_on_failure(lambda: _make_directories(path), messages.CWD_CANNOT_CREATE)


def _make_directories(path: Path) -> Path:
    missing: list[Path] = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not directory.is_dir():
                raise
    return path
