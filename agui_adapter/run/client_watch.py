"""Whether a run's client hung up, in the server's word (``run.driver``).

Moved out of ``RunDriver``. Servers differ in what they offer:

- the built-in server watches the response's socket on its I/O thread and says when the client
  hangs up (``agui.client_watch``): the run is woken at that moment and waits for nothing else
  in between, however long its kernel is silent (``pushed``);
- where the server only answers when asked (``agui.client_gone``), the run's stream asks on its
  idle ticks, once a tick at most; so does a run whose server stopped watching (bytes the client
  pipelined behind its request keep its socket readable, or the server's loop ended);
- other servers say nothing: the run learns of a client that left when a write fails.

The engine may ask from another thread (``gone_now``). Once the stream noticed, or once the
response is over (the connection may serve other requests), the server is not asked any more.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable

log = logging.getLogger("agui_adapter.run")


class ClientWatch:
    """The server's "did the client hang up?" for one run (None when it offers none)."""

    def __init__(
        self,
        client_gone: Callable[[], bool] | None,
        run_id: str,
        watch: Callable[[Callable[[bool], None]], bool] | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self._client_gone = client_gone  # asked by the stream, until it noticed
        self._watch = client_gone  # kept for ``gone_now`` once the stream stopped asking
        self._next_check = 0.0
        # weakly: the run holds this watch, and a cycle would keep every ended run (its journal,
        # its frames) alive until the cyclic collector's rare full pass (``ops.collector``)
        self._wake = None if wake is None else weakref.WeakMethod(wake)  # type: ignore[arg-type]
        #: Whether the server told of the hang-up (the stream then ends at its next look).
        self.told = False
        #: Whether the stream noticed that its client hung up (kept once the response is over).
        self.noticed = False
        #: Whether the server watches the socket and will tell (else the stream asks on ticks).
        self.pushed = False
        if client_gone is not None and watch is not None:
            self.pushed = bool(watch(self._word))

    def _word(self, gone: bool) -> None:
        """The server's word, on its I/O thread: the client hung up, or it stopped watching."""
        if gone:
            self.told = True
        else:
            self.pushed = False  # the stream asks on its ticks again
        wake = None if self._wake is None else self._wake()
        if wake is not None:
            wake()

    def hung_up(self, tick: float) -> bool:
        """Whether the server says the client hung up (asked once a ``tick`` at most, unless
        the server watches: then only once it told)."""
        client_gone = self._client_gone
        if client_gone is None:
            return False
        if not self.told:
            if self.pushed:
                return False
            now = time.monotonic()
            if now < self._next_check:
                return False
            self._next_check = now + tick
        if not client_gone():
            return False
        self._client_gone = None
        self.noticed = True
        log.info("run %s: the client hung up", self.run_id)
        return True

    def gone_now(self) -> bool:
        """From another thread: whether the client hung up (the stream noticed, or the server
        says so now)."""
        watch = self._watch
        return self.noticed or (watch is not None and watch())

    def stop(self) -> None:
        """The response is over: the connection may serve other requests now."""
        self._watch = self._client_gone = None
        self.pushed = False
