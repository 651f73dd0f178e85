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
"""

from __future__ import annotations

import atexit

from agui_adapter.cli import build_app, configure_logging
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
