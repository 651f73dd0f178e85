"""Whether a run's client hung up, in the server's word (``run.driver``).

Moved out of ``RunDriver``: when the server offers it (the built-in server's
``agui.client_gone``), the run's stream asks on its idle ticks (once a tick at most) whether its
client is still there, and the engine may ask from another thread (``hung_up_now``). Once the
stream noticed, or once the response is over (the connection may serve other requests), the
server is not asked any more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("agui_adapter.run")


class ClientWatch:
    """The server's "did the client hang up?" for one run (None when it offers none)."""

    def __init__(self, client_gone: Callable[[], bool] | None, run_id: str) -> None:
        self.run_id = run_id
        self._client_gone = client_gone  # asked by the stream, until it noticed
        self._watch = client_gone  # kept for ``gone_now`` once the stream stopped asking
        self._next_check = 0.0

    def hung_up(self, tick: float) -> bool:
        """Whether the server says the client hung up (asked once a ``tick`` at most)."""
        client_gone = self._client_gone
        if client_gone is None:
            return False
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + tick
        if not client_gone():
            return False
        self._client_gone = None
        log.info("run %s: the client hung up", self.run_id)
        return True

    def gone_now(self) -> bool:
        """From another thread: whether the server says the client hung up."""
        watch = self._watch
        return watch is not None and watch()

    def stop(self) -> None:
        """The response is over: the connection may serve other requests now."""
        self._watch = self._client_gone = None
