"""One live run's journal, as its driver keeps it (``run.driver``).

Moved out of ``RunDriver`` so the driver keeps to the stream: the journal is opened with what a
process adopting the run needs (never a secret), every written chunk is appended with the id after its
last event, the journal ends with the chunk holding the terminal event, the pipeline's progress is
noted for an adopter, and a journal whose disk fails is dropped (the run goes on, it just cannot
be reattached any more). At a hand-over the journal is let go marked handed over (``adoption``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agui_adapter.state.journal import JournalStore, JournalWriter, first_id_of

log = logging.getLogger("agui_adapter.run")


class RunJournal:
    """The journal of one run (``writer`` is None when there is none, or none any more)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.writer: JournalWriter | None = None
        self.terminal_encoded = False  # the chunk with the terminal event was encoded: the journal ends with it
        self._journals: JournalStore | None = None  # until it asked for the next spare journal
        self._spare_due = False  # a chunk past RUN_STARTED was appended: ask once it is sent

    def open(self, journals: JournalStore, thread_id: str, machine: Any) -> None:
        props = machine.run_input.props
        meta = {  # what a process adopting the run needs (``adoption``); never a secret
            "threadId": thread_id,
            "runId": self.run_id,
            "parentRunId": machine.run_input.parent_run_id,
            "mode": machine.mode.value,
            "language": machine.language,
            "rosInvocationId": props.ros_invocation_id,
            "preferredLanguage": props.preferred_language,
            "runMode": props.run_mode,
            "pipelineName": props.pipeline_name,
        }
        try:
            self.writer = journals.open_writer(thread_id, self.run_id, meta)
            self._journals = journals
        except OSError as exc:
            log.warning("run %s: no journal, it cannot be reattached: %s", self.run_id, exc)

    def held_directory(self) -> Path | None:
        """The journal's directory while this process writes it (its lock held), else None."""
        writer = self.writer
        return writer.directory if writer is not None and writer.holding else None

    def append(self, chunk: bytes, next_id: int, translator: Any) -> None:
        """A chunk the run wrote; ``next_id`` is the id after its last event."""
        if self._journals is not None and first_id_of(chunk, next_id) > 1:  # past RUN_STARTED
            self._spare_due = True
        journal = self.writer
        if journal is None:
            return
        try:
            journal.append(chunk, next_id)
        except OSError as exc:
            log.warning("run %s: journal write failed, it cannot be reattached any more: %s", self.run_id, exc)
            self.writer = None
            journal.close()
            return
        if self.terminal_encoded:  # ended with the terminal event: a reader that has it gets 204 at once
            self.end()
        elif translator.pipeline_seen:  # for an adopter: what the kernel's journal delivered
            try:
                journal.note_pipeline(translator.pipeline.to_json())
            except OSError as exc:
                log.warning("run %s: could not note the pipeline's progress: %s", self.run_id, exc)

    def sent(self) -> None:
        """The chunk appended last is with the client's server: once the run is past
        RUN_STARTED, the next run's journal is asked for now (made while this one streams).
        Not at the append: the maker's thread would take the interpreter's lock from the run
        on its way to send its first events."""
        if self._spare_due and self._journals is not None:
            self._journals.replenish()
            self._journals = None
            self._spare_due = False

    def end(self) -> None:
        journal, self.writer = self.writer, None
        if journal is not None:
            try:
                journal.end()
            except OSError as exc:
                log.warning("run %s: could not end its journal: %s", self.run_id, exc)

    def hand_over(self, now: float) -> None:
        """Let the journal go, marked handed over (no end), for the next process to adopt."""
        journal, self.writer = self.writer, None
        if journal is not None:
            journal.hand_over(now)

    def client_left(self, grace: float) -> bool:
        """The run's own client left: whether the run goes on (a grace period, or other readers)."""
        assert self.writer is not None
        try:
            self.writer.client_left()
            return grace > 0 or self.writer.readers() > 0
        except OSError as exc:
            log.warning("run %s: journal readers: %s", self.run_id, exc)
            return grace > 0

    def hear_readers(self, wake: Callable[[], None]) -> None:
        """Have ``wake`` called when a reader in this process leaves (``journal_bell``)."""
        if self.writer is not None:
            self.writer.hear_readers(wake)

    def readers_left(self) -> bool:
        """Whether a reader in this process left since the last look."""
        return self.writer is not None and self.writer.readers_left()

    def followed(self) -> bool:
        """Whether readers follow the run now."""
        journal = self.writer
        try:
            return journal is not None and journal.readers() > 0
        except OSError:
            return False
