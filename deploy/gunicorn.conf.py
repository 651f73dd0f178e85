"""gunicorn settings for agui-adapter: ``gunicorn -c deploy/gunicorn.conf.py agui_adapter.wsgi:application``.

Threads, not sync workers (every open SSE stream holds a worker thread for its whole life; a
sync worker is killed after ``--timeout`` in the middle of a long stream). A graceful stop of a
worker (SIGTERM to gunicorn, HUP reload: gunicorn sends each old worker SIGTERM) hands the
worker's open runs over (``agui_adapter.wsgi.install_shutdown_hook``): they get
``IAC_CODE_AGUI_SHUTDOWN_GRACE_SECONDS`` to end, then their streams close without a terminal
event and another worker (the new ones after a HUP, or the next start) adopts them when their
clients reattach. ``graceful_timeout`` must be longer than that grace plus a few seconds, or
gunicorn kills the worker before it hands over (the runs are then adopted as after a
``kill -9``, their streams cut). Point every worker at one external kernel
(``IAC_CODE_AGUI_A2A_URL``): hand-over is the default then (``IAC_CODE_AGUI_ON_SHUTDOWN``).
"""

import math
import os
from typing import Any

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "16"))
#: above the adapter's shutdown grace (10 s unless IAC_CODE_AGUI_SHUTDOWN_GRACE_SECONDS says otherwise)
graceful_timeout = math.ceil(float(os.environ.get("IAC_CODE_AGUI_SHUTDOWN_GRACE_SECONDS", "10"))) + 10


def post_worker_init(worker: Any) -> None:
    """In the worker, after the application was loaded: the SIGTERM hand-over hook (already
    there when the worker imported the application itself; with ``--preload``, installed here),
    and the garbage collector sized for batches of kernel frames, as the built-in server's
    (``agui_adapter.ops.collector``)."""
    from agui_adapter.ops import collector
    from agui_adapter.wsgi import install_shutdown_hook

    collector.tune()
    if not install_shutdown_hook():
        worker.log.warning("agui-adapter: no SIGTERM hand-over hook in this worker")


def child_exit(server: Any, worker: Any) -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` (the ``metrics`` extra): forget a dead worker's live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        try:
            from prometheus_client import multiprocess
        except ImportError:
            return
        multiprocess.mark_process_dead(worker.pid)
