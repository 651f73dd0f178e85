"""The kernel's lifeline: a kernel child the adapter started never outlives the adapter.

Why this module exists: the adapter starts its kernel (``iac-code a2a`` or the embedded
scripted kernel) as a child process, and a child is not stopped when its parent dies.
Ctrl-C and SIGTERM are handled by ``KernelProcess.stop()``, but ``kill -9``, an OOM kill or a
gunicorn worker killed on timeout run no Python code at all, and would leave the kernel
(and whatever it started) running, orphaned.

How: the adapter does not start the kernel directly but this tiny supervisor, run by path
with ``python -I`` (standard library only, nothing of the package is imported)::

    adapter ──stdin pipe──▶ lifeline (new session, group leader) ──▶ kernel (same group)
                                                                       └──▶ its children

* The adapter holds the only write end of the supervisor's stdin and never writes to it.
  However the adapter ends, the OS closes that end, the supervisor reads EOF and stops the
  kernel. This does not depend on which thread of the adapter started the kernel (unlike
  ``PR_SET_PDEATHSIG``, which fires when the forking *thread* exits).
* The supervisor starts its own session, so the kernel and everything the kernel starts
  share one process group that nothing else is in. Stopping sends SIGTERM to the whole
  group, waits up to ``--grace`` seconds, then SIGKILLs what is left of it.
* SIGTERM, SIGINT or SIGHUP to the supervisor (``KernelProcess.stop()``'s terminate) stops
  the group the same way; the supervisor exits with the kernel's exit status (128 + signal
  number when the kernel died of a signal), and also when the kernel exits by itself.
* ``KernelProcess.stop()``'s last resort is SIGKILL to the whole group (its id is the
  supervisor's pid), which needs no co-operation from anyone.
* On Linux the kernel additionally gets ``PR_SET_PDEATHSIG`` = SIGTERM (set by the
  single-threaded supervisor, so the thread caveat does not apply), in case the supervisor
  itself is SIGKILLed on its own.
* Between fork and exec the kernel child still runs the supervisor's code, and with it the
  supervisor's SIGTERM/SIGINT/SIGHUP handlers, which only take note: a stop signal arriving
  in that window (the parent-death signal included) would be swallowed and the kernel would
  exec and run on. So the child first restores the default action of those signals.

Limits: a descendant of the kernel that leaves the process group on purpose (``setsid``,
``setpgid``: a daemon) is not followed. The straggler sweep (SIGKILL to members of the group
that survived the kernel) reads ``/proc`` and so is Linux-only; elsewhere (macOS, the BSDs)
the group is SIGKILLed as a whole only when the kernel itself does not exit within the grace
period, and ``PR_SET_PDEATHSIG`` does not exist. Windows is not supported (the adapter needs
POSIX file locks anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

PR_SET_PDEATHSIG = 1
_LINUX = sys.platform.startswith("linux")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _parent_death_signal(parent: int) -> Callable[[], None]:
    """The kernel child's preexec function: stop signals act again, and (Linux only) the
    kernel gets SIGTERM when the supervisor dies.

    libc is loaded here, before the fork; the child only calls ``signal`` and ``prctl``.
    """
    prctl = None
    if _LINUX:
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def preexec() -> None:
        for signum in STOP_SIGNALS:  # the supervisor's handlers would swallow them until exec
            signal.signal(signum, signal.SIG_DFL)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:  # the supervisor died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes of process group ``pgid``; None where /proc is unavailable."""
    if not _LINUX:
        return None
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _killpg(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_group(kernel: subprocess.Popen[bytes], pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to ``grace`` seconds, SIGKILL whatever is left."""
    me = os.getpid()
    _killpg(pgid, signal.SIGTERM)  # the supervisor's own handler only notes it
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if kernel.poll() is not None:
            others = group_members(pgid)
            if others is None or not [pid for pid in others if pid != me]:
                break
        time.sleep(0.05)
    others = group_members(pgid)
    if others is None:
        if kernel.poll() is None:
            _killpg(pgid, signal.SIGKILL)  # the supervisor included: nothing else can tell the rest
    else:
        for pid in others:
            if pid != me:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    kernel.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lifeline.py",
        description="Run a command in its own process group until stdin reaches EOF or a stop signal arrives.",
    )
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the kernel command line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("lifeline.py: no command", file=sys.stderr)
        return 2
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # started without a new session: still give the kernel its own group
    pgid = os.getpgrp()

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)

    kernel = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        preexec_fn=_parent_death_signal(os.getpid()),  # safe: the supervisor is single-threaded
    )
    lifeline = sys.stdin.fileno()
    watched = [lifeline, wake_read]
    while not stopping and kernel.poll() is None:
        try:
            ready, _, _ = select.select(watched, [], [], 0.5)
        except InterruptedError:
            continue
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
        if lifeline in ready:
            try:
                data = os.read(lifeline, 4096)
            except OSError:
                data = b""
            if not data:  # the adapter is gone (or closed the lifeline to stop us)
                break
    stop_group(kernel, pgid, args.grace)
    code = kernel.returncode
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
