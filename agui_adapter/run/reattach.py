"""Reattach: a reader of a run's journal after the id a client last saw.

Any number of readers follow a run at once (none ends another); a run whose process is
gone is adopted first (``adoption``), so that the reader follows it live.
"""

from __future__ import annotations

import logging

from agui_adapter.ops.metrics import Metrics
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code
from agui_adapter.run.adoption import Adoption
from agui_adapter.state.journal import JournalReader, JournalStore, ReplayUnavailable, RunNotFound
from agui_adapter.state.store import StoreError, ThreadStore

log = logging.getLogger("agui_adapter.run.engine")


class Reattachment:
    def __init__(self, store: ThreadStore, journals: JournalStore, adoption: Adoption, metrics: Metrics) -> None:
        self.store = store
        self.journals = journals
        self.adoption = adoption
        self.metrics = metrics

    def reattach(
        self, thread_id: str, run_id: str, after: int, digest: str | None = None, *, attach: bool = True
    ) -> JournalReader | None:
        """A reader of the run's events after id ``after``, attached among the run's readers.

        With ``digest`` (``POST /`` with ``Last-Event-ID``): None when the thread never saw
        that run id (the request is then a new run, the header ignored), RUN_ID_CONFLICT
        when the run had another body. RUN_NOT_FOUND for a run whose journal is gone or
        never was; REPLAY_UNAVAILABLE when the events after ``after`` fell out of it.
        Without ``attach`` (a HEAD, or a look before answering 204) the reader is not attached:
        ``attach_reader`` does it.
        """
        if digest is not None:
            try:
                record = self.store.load(thread_id)
            except StoreError as exc:
                log.error("thread %s: %s", thread_id, exc)
                raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
            known = record.run_digests.get(run_id) if record is not None else None
            if known is None:
                return None
            if known != digest:
                raise AguiError(Code.RUN_ID_CONFLICT, msg.RUN_ID_CONFLICT)
        try:
            reader = self.journals.open_reader(thread_id, run_id, after)
        except RunNotFound:
            raise AguiError(Code.RUN_NOT_FOUND, msg.RUN_NOT_FOUND) from None
        except ReplayUnavailable:
            raise AguiError(Code.REPLAY_UNAVAILABLE, msg.REPLAY_UNAVAILABLE) from None
        except OSError as exc:
            log.error("run %s: journal unreadable: %s", run_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        if not reader.ended:
            self.adoption.run(thread_id, run_id)  # an orphan: adopted now, so the reader follows it live
        if not attach:
            return reader
        self.attach_reader(thread_id, run_id, reader)
        return reader

    def attach_reader(self, thread_id: str, run_id: str, reader: JournalReader) -> None:
        """Count the reader among the run's readers (the run goes on while one follows it)."""
        try:
            reader.attach()
        except OSError as exc:
            reader.close()
            log.error("run %s: journal unreadable: %s", run_id, exc)
            raise AguiError(Code.STATE_UNAVAILABLE, msg.STATE_UNAVAILABLE) from None
        self.metrics.reattached()
        log.info("run %s on thread %s reattached after event %d", run_id, thread_id, reader.after)
