"""The open-file limit: raised to what the system allows, and checked against the settings.

Why it exists: every connection the server holds is a file descriptor, and every run adds
its kernel stream's socket and its journal files; a soft ``RLIMIT_NOFILE`` of 1024 (the
default of most systems, and of systemd units without ``LimitNOFILE=``) runs out before
``--max-connections 1024`` is reached, and ``accept()`` then fails with ``EMFILE`` while the
adapter looks healthy. At start the adapter raises its soft limit to the hard one (which
needs no privilege; nginx's ``worker_rlimit_nofile`` and many servers do the same; gunicorn
leaves it to the operator) and warns when the connections and runs it is configured for
cannot fit. The arithmetic is pure (``descriptors_needed``); ``raise_soft_limit`` is the
one system call.
"""

from __future__ import annotations

import logging

log = logging.getLogger("agui_adapter.ops.fdlimit")

#: Descriptors used whatever the load: the listening socket, the wake-up pair, std streams,
#: the kernel child's pipes, logs, the state directory's locks, imported modules' files.
BASE_DESCRIPTORS = 64
#: The server's extra connections for ``/health`` beyond ``--max-connections`` (``ServerLimits``).
RESERVE_CONNECTIONS = 16
#: Per run: its kernel stream's socket, its record's lock and its journal segment.
PER_RUN = 3


def descriptors_needed(max_connections: int, max_runs: int) -> int:
    """Descriptors the adapter may hold at once with these limits."""
    return BASE_DESCRIPTORS + max_connections + RESERVE_CONNECTIONS + PER_RUN * min(max_runs, max_connections)


def raise_soft_limit() -> tuple[int, int] | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the (soft, hard) in force after,
    or None where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        target = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft  # the kernel's nr_open
    else:
        target = hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


def check(max_connections: int, max_runs: int) -> int | None:
    """Raise the limit and warn when ``max_connections``/``max_runs`` cannot fit; the soft limit."""
    limits = raise_soft_limit()
    if limits is None:
        return None
    soft, _hard = limits
    needed = descriptors_needed(max_connections, max_runs)
    if soft != -1 and soft < needed:
        log.warning(
            "the open-file limit is %d but --max-connections %d and --max-runs %d may need %d descriptors: "
            "raise it (systemd: LimitNOFILE=, shell: ulimit -n) or lower --max-connections",
            soft,
            max_connections,
            max_runs,
            needed,
        )
    return soft
