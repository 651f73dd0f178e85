"""``agui_adapter.wsgi:application`` for any WSGI server (gunicorn, waitress, mod_wsgi).

Configured exactly like ``python run.py``: the ``IAC_CODE_AGUI_*`` environment
variables and the config file named by ``IAC_CODE_AGUI_CONFIG``. Without
``IAC_CODE_AGUI_A2A_URL`` each worker process starts its own kernel child; with
several workers, point them all at one kernel with ``IAC_CODE_AGUI_A2A_URL`` so that
every worker sees the same conversations (the state directory is already shared
safely through file locks). A worker's kernel child stops with the worker however the
worker ends (a worker killed on timeout included): see ``lifeline.py``.

With several worker processes, ``/metrics`` gives the totals of all of them when
``PROMETHEUS_MULTIPROC_DIR`` is set and prometheus_client is installed (see ``metrics.py``).

Serve with threads (gunicorn ``-k gthread --threads N``, waitress ``--threads N``):
every open SSE stream holds one worker thread for its whole life.

A graceful stop of the worker (SIGTERM: gunicorn's graceful stop and HUP reload, a
``--max-requests`` recycle excepted, which sends no signal) treats the worker's open runs as
``python run.py`` treats its own on SIGTERM: they get ``shutdown_grace_seconds``, then are
handed over (``on_shutdown`` handover, the default with ``IAC_CODE_AGUI_A2A_URL``: their
streams close without a terminal event, the client reattaches and another worker adopts
them) or ended. ``install_shutdown_hook`` puts that in front of the server's own SIGTERM
handler, which still runs first (gunicorn stops accepting, then waits up to its
``--graceful-timeout`` for the open streams: keep that above the shutdown grace,
``deploy/gunicorn.conf.py``). It is installed at import, which gunicorn does in each worker
after its own handlers (without ``--preload``); ``deploy/gunicorn.conf.py`` installs it again
from ``post_worker_init`` (a no-op when it is there), which covers ``--preload``. A server
without a SIGTERM handler of its own (waitress) then stops once the runs are handed over. A
server that does not allow signal handlers (mod_wsgi; an import outside the main thread) is
left as it is.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Any

from agui_adapter.cli import build_app, configure_logging, shut_down_open_runs
from agui_adapter.config import load_settings
from agui_adapter.kernel_client.launch import start_kernel
from agui_adapter.state.retention import start_retention

_settings = load_settings()
configure_logging(_settings.log_level, _settings.log_format)
_kernel = start_kernel(_settings)
atexit.register(_kernel.stop)

application = build_app(_settings, _kernel)
# Prunes idle thread records at start-up and hourly when IAC_CODE_AGUI_THREAD_RETENTION_DAYS
# is set (each worker prunes; the store's locks make that safe).
_retention = start_retention(_settings)


log = logging.getLogger("agui_adapter.wsgi")


def _hand_over_then(previous: Any) -> None:
    try:
        shut_down_open_runs(application, _settings, _kernel)
    except Exception:  # noqa: BLE001 - the process stops anyway
        log.exception("handing the open runs over at shutdown failed")
    if previous == signal.SIG_DFL:  # nobody else stops the process: as SIGTERM would have
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_shutdown_hook() -> bool:
    """SIGTERM hands this worker's open runs over (or ends them: ``shut_down_open_runs``) on a
    thread of its own, after the server's own handler ran. Whether it is installed now
    (already installed counts; False where the server allows no signal handler)."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        return False
    if getattr(previous, "agui_hand_over", False):
        return True
    if previous == signal.SIG_IGN or previous is None:  # ignored on purpose, or not set from Python
        return False
    stopping = threading.Event()

    def on_sigterm(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)  # the server's own graceful stop first: it stops accepting
        if not stopping.is_set():
            stopping.set()
            log.info("stopping (signal %d): open runs get %ss", signum, _settings.shutdown_grace_seconds)
            # not a daemon: the interpreter waits for it, also when the server has nothing left to serve
            threading.Thread(target=_hand_over_then, args=(previous,), name="graceful-stop").start()

    on_sigterm.agui_hand_over = True  # type: ignore[attr-defined]
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
        signal.siginterrupt(signal.SIGTERM, False)  # as gunicorn sets it: no system call cut short
    except ValueError:  # not the main thread (mod_wsgi and the like): the server decides
        return False
    return True


install_shutdown_hook()
