"""The I/O of one run: carries out what ``run.machine`` decides.

A ``RunDriver`` is the WSGI body of an admitted run (an iterable with ``close()``). It
owns everything that touches the world: the kernel pump and client, the thread store,
the thread's run lock, the clock and the SSE bytes. It feeds the machine, performs
the effects in the order given, answers the requests at once, and writes what is to
be written as one chunk per wake-up (``: heartbeat`` comments while the kernel is
silent). Events already decided are written before a disk write or a kernel call that
may take a while (RUN_STARTED before a Resume's checks, a run's last deltas before the
write that records its end).

The run lock is released in one place, ``_release``, reached through the machine's
``ReleaseThread`` (when the client goes away, or the server closes the body before its
first write, ``close()`` asks the machine, ``client_gone``, and carries out its answer
the same way) and through ``release_now``, by which the cancel extension frees the
thread at once even while this run's writer is blocked on a client that stopped reading.

Where the run stands towards its client is one state (``lifecycle.Attach``: new, attached,
detached, abandoned, shutting down, handing over, handed over, ended), moved only through
``Lifecycle.move``, which checks the move; the machine's phase says where the run itself is.
The driver sees the process through the narrow ``RunServices`` it is given (``services``),
never through the engine.

Every chunk the run writes (heartbeats aside) is also appended to the run's journal
(``state.journal``), each event numbered by its SSE ``id``, so that a client can reattach; any
number of readers follow the journal at once, the run's own client among them. When the
client goes away and a disconnect grace period is set, or while other readers still follow
the run, ``close()`` does not end the run: it goes on, on a thread of its own, into its
journal (``detached``), until it ends or nobody has been attached for the grace period (counted from the
last reader leaving; the machine's ``abandoned``).

At shutdown with ``--on-shutdown handover`` (``shut_down(hand_over=True)``), a run that did not
end in the shutdown grace is left running in the kernel: its stream stops without a terminal
event, its thread is given back and its journal is let go, marked handed over, for the next
process to adopt (``adoption``, whose ``AdoptedDriver`` is this driver without a client of its
own, going on in the journal after its last id).

A client that hangs up is noticed while the run waits for its next event, not only when a
write fails: when the server offers it (the built-in server's ``agui.client_gone``), the
stream asks on every idle tick whether its client is still there, and ends as on a
disconnect within a fraction of a second. Under other servers the next write tells
(a heartbeat at the latest).

What operators see of a run is counted here too, cheaply: events and bytes per written
chunk (one add each, never per event), the time to the first event after RUN_STARTED and
the run's duration, both observed at ``Finish`` by run mode and outcome (``metrics``), a
client gone before the end, a run going on detached; and one log line sums the run up
(outcome, error code, events, bytes, duration) just before its final chunk is handed to
the server, or when the body is closed if none was (abandoned).
While the body is iterated or closed, ``RUN_IDS`` holds the run's thread and run ids, so
every log line of the run (the machine's, the kernel pump's) carries them (``logs``), and
the run's span (``tracing``, when on) is current, so that its kernel calls and state writes
are its children; the span ends with the run.

Jobs of the driver live beside it, each in a module of its own: the journal (``run_journal``),
the store's and the kernel's side of the effects (``perform``), what the pump queued handed to
the machine (``intake``), the server's word on a hung-up client (``client_watch``) and the run's
summary line and span end (``run_summary``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty
from typing import Any

from agui_adapter.kernel_client.a2a import FrameReader
from agui_adapter.ops.logs import RUN_IDS
from agui_adapter.ops.tracing import NO_TRACE
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.events import Event
from agui_adapter.run import detached, intake, perform, run_summary
from agui_adapter.run import effects as fx
from agui_adapter.run.admitted import Admission
from agui_adapter.run.client_watch import ClientWatch
from agui_adapter.run.detached import DETACHED_TICK_SECONDS
from agui_adapter.run.lifecycle import RUNNING, STOPPING, Attach, Lifecycle
from agui_adapter.run.loop import carry_out
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.pump import KernelByteStream, KernelPump
from agui_adapter.run.run_journal import RunJournal
from agui_adapter.run.services import RunServices

log = logging.getLogger("agui_adapter.run")

#: How often an idle run wakes up: where its server answers only when asked (the built-in
#: server's watch lapsed, ``client_watch``), to ask whether its client hung up; detached, to
#: see whether its grace period is over. A run its server watches wakes for its kernel, its
#: heartbeat (every heartbeat_seconds) or the hang-up, never on a tick.
ATTACHED_TICK_SECONDS = 0.5
WATCHED_TICK_SECONDS = 0.2
_IDLE = b""  # what the stream yields on an idle wake-up: nothing to write
_TERMINAL = ("RUN_FINISHED", "RUN_ERROR")


class RunDriver:
    """One run's stream; lives on the WSGI worker thread (plus one pump thread)."""

    def __init__(
        self,
        services: RunServices,
        admission: Admission,
        machine: RunMachine,
        client_gone: Callable[[], bool] | None = None,
        client_watch: Callable[[Callable[[bool], None]], bool] | None = None,
    ) -> None:
        self.services = services
        self.kernel = services.kernel
        self.thread_id = admission.thread_id
        self.run_id = admission.run_id
        self.machine = machine
        self._run_lock = admission.run_lock
        self._release_lock = threading.Lock()
        self._pump: KernelPump | None = None
        self._reader = FrameReader()
        self._body = self._stream()
        self._life = Lifecycle()  # where the run stands towards its client (``lifecycle``)
        self._clock: Callable[[], float] = services.clock
        self._metrics = services.metrics
        self._ids = (self.thread_id, self.run_id)
        self._admitted = time.monotonic()
        self._mode = admission.run_mode
        self._trace = admission.trace if admission.trace is not None else NO_TRACE
        self._start_slot = admission.start_slot  # given back with the first chunk (``ops.start_gate``)
        self._trace.set(mode=self._mode)
        self._first_event: float | None = None  # seconds from admission to the first event after RUN_STARTED
        self._events = 0  # events encoded (the ids used)
        self._unsent = 0  # events of the chunk just encoded, counted as sent when the client gets it
        self._bytes = 0  # bytes handed to the server (heartbeats included)
        self._finish: fx.Finish | None = None
        self._duration: float | None = None
        self._summarized = False  # the run's summary line is logged once
        # reattach (``state.journal``): what was sent, who reads it, and the run without a reader
        self._journal = RunJournal(self.run_id)  # ``run_journal``
        # the server's "did the client hang up?" (the built-in server's ``agui.client_watch``
        # and ``agui.client_gone``)
        self._client = ClientWatch(client_gone, self.run_id, client_watch, self._wake)  # ``client_watch``
        tick = WATCHED_TICK_SECONDS if client_gone is not None else ATTACHED_TICK_SECONDS
        self._tick = min(tick, services.settings.heartbeat_seconds)

    # ------------------------------------------------------------------ WSGI iterable
    def __iter__(self) -> RunDriver:
        return self

    def __next__(self) -> bytes:
        self._life.move_if((Attach.NEW,), Attach.ATTACHED)
        self._journal.sent()  # the server wrote the chunk before: what waited for that
        token = RUN_IDS.set(self._ids)
        trace = self._trace.attach()
        try:
            while True:
                if self._client.hung_up(self._tick):
                    raise StopIteration  # the client left: ``close`` ends the run, or detaches it
                chunk = next(self._body)
                if chunk is not _IDLE:
                    break
        finally:
            self._trace.detach(trace)
            RUN_IDS.reset(token)
        if chunk is not ev.HEARTBEAT:
            self._sent(self._unsent)
            self._journal_chunk(chunk)
        self._bytes += len(chunk)
        if self._start_slot is not None:  # the start is made: the next run's turn
            self._leave_start()
        return chunk

    def _leave_start(self) -> None:
        slot, self._start_slot = self._start_slot, None
        if slot is not None:
            slot.leave()

    def _sent(self, count: int) -> None:
        """The events of a chunk handed to the client's server (counted per chunk)."""
        self._unsent = 0
        self._metrics.events_sent(count)
        if self._first_event is None and self._events >= 2:  # the first event after RUN_STARTED
            self._first_event = time.monotonic() - self._admitted
            self._trace.first_event()

    def close(self) -> None:
        """End of the response: the client left, the server closed it, or the run is over.
        A live run whose client left goes on detached when a grace period is set or other
        readers follow it; else it ends here."""
        self._leave_start()  # a start that never got to its first chunk
        if self._life.state is Attach.ENDED:
            return
        token = RUN_IDS.set(self._ids)
        self._client.stop()  # the connection may serve other requests now
        trace = self._trace.attach()
        try:
            if self._detachable() and self._life.move_if((Attach.ATTACHED,), Attach.DETACHED):
                self._detach()
                return
            try:
                try:
                    if self.machine.ended:
                        self._end_quietly()
                    else:
                        self._body.close()
                finally:
                    if not self.machine.ended and self._life.state is not Attach.HANDED_OVER:
                        self._metrics.client_disconnected()
                        self._carry_out_quietly(self.machine.client_gone(self._clock()))
            finally:
                self._wind_up()
        finally:
            self._trace.detach(trace)
            RUN_IDS.reset(token)

    def _end_quietly(self) -> None:
        """The client left while the run was writing its end (the machine decided it as one
        batch: the last deltas went out before the write that records the end): the rest of
        the batch is carried out into the journal only, so that the end is recorded and the
        journal ends with the terminal event."""
        for chunk in self._body:
            if chunk is not _IDLE and chunk is not ev.HEARTBEAT:
                self._journal_chunk(chunk)

    def _wind_up(self) -> None:
        """The run is over (or abandoned): stop the pump, end the journal, give the slot
        back, and sum the run up if its final chunk did not."""
        self._life.move(Attach.ENDED)
        try:
            if self._pump is not None:
                self._pump.stop()
            self._journal.sent()  # past RUN_STARTED but never sent on (a detached run's end)
            self._journal.end()
        finally:
            self.services.run_ended(self)
            if not self._summarized:  # abandoned: no final chunk was written
                self._log_summary(self._bytes)
            run_summary.end_trace(self._trace, self._finish, self._events, self._bytes)

    @property
    def client_attached(self) -> bool:
        """Whether the run's own client still reads it (a run without a journal)."""
        return self._life.state in (Attach.NEW, Attach.ATTACHED, Attach.SHUTTING_DOWN, Attach.HANDING_OVER)

    def shut_down(self, *, hand_over: bool = False) -> None:
        """From another thread: end the run now with its final event (``shutting_down``), or,
        with ``hand_over``, leave it running in the kernel: its stream closes without a
        terminal event and the next process adopts it (``adoption``)."""
        if not self._life.move_if(RUNNING, Attach.HANDING_OVER if hand_over else Attach.SHUTTING_DOWN):
            return  # stopping already, or over
        pump = self._pump
        if pump is not None:
            pump.wake()

    def _leave_to_kernel(self) -> None:
        """Hand-over: stop reading the kernel (its task goes on), give the thread back, then
        the journal (marked handed over, no end), in that order so that an adopter that
        takes the journal finds the thread free."""
        self._life.move(Attach.HANDED_OVER)
        if self._pump is not None:
            self._pump.stop()
        self._release()
        self._journal.hand_over(self._clock())
        log.info("run %s: handed over; it goes on in the kernel, and the next adapter process adopts it", self.run_id)

    # ------------------------------------------------------------------ the stream
    def _stream(self) -> Iterator[bytes]:
        """The run's chunks: its start, then one per wake-up with something to write
        (``_IDLE`` when nothing, a heartbeat after ``heartbeat_seconds`` of silence), until
        the machine ends or the run is told to stop."""
        self._open_journal()
        out: list[Event] = []
        yield from self._carry_out(self.machine.start(self._clock()), out)
        if out:
            yield self._encode(out)
        heartbeat = self.services.settings.heartbeat_seconds
        last_write = time.monotonic()
        while not self.machine.ended:
            items = self._wait_for_kernel(last_write + heartbeat)
            state = self._life.state
            if state in STOPPING:
                yield from self._stop(state)
                return
            if not items:
                if time.monotonic() - last_write < heartbeat:
                    yield _IDLE
                    continue
                last_write = time.monotonic()
                yield ev.HEARTBEAT
                continue
            out = []
            yield from intake.take(
                self.machine, lambda: self._reader, items, out, self._clock(), self._carry_out, self._encode
            )
            if out:
                last_write = time.monotonic()
                yield self._encode(out)
            else:
                yield _IDLE  # woken for nothing to write: ``__next__`` looks at the client

    def _wait_for_kernel(self, heartbeat_due: float) -> list[Any]:
        """What the kernel pump queued, after a tick at most; when the server tells of a
        hang-up itself, until the next heartbeat is due at most (a hang-up wakes the run)."""
        assert self._pump is not None
        client = self._client
        timeout = self._tick
        if client.pushed:
            if client.told:  # told before the pump was there to wake
                return []
            timeout = max(0.0, heartbeat_due - time.monotonic())
        try:
            return self._pump.get(timeout=timeout)
        except Empty:
            return []

    def _wake(self) -> None:
        """Wake the run out of its wait for the kernel (any thread)."""
        pump = self._pump
        if pump is not None:
            pump.wake()

    def _stop(self, state: Attach) -> Iterator[bytes]:
        """The run was told to stop: left to the kernel (a hand-over, once the run has a task
        and a journal to adopt it from), else ended with its final events."""
        if state is Attach.HANDING_OVER and self._journal.writer is not None and self.machine.task_id:
            self._leave_to_kernel()
            return
        now = self._clock()
        effects = self.machine.abandoned(now) if state is Attach.ABANDONED else self.machine.shutting_down(now)
        out: list[Event] = []
        yield from self._carry_out(effects, out)
        yield self._encode(out)

    def _carry_out(self, effects: list[fx.Effect], out: list[Event]) -> Iterator[bytes]:
        """Perform effects in order (``run.loop``); events go to ``out`` (written by the caller),
        except that what is already decided is written before a disk write or a kernel call."""
        for _request in carry_out(self.machine, effects, self._perform, out.extend, self._clock):
            if out:
                yield self._encode(out)
                out.clear()

    def _encode(self, out: list[Event], *, to_client: bool = True) -> bytes:
        """One chunk of events with their ids; counted as sent when ``__next__`` hands it to
        the client's server, unless it is only for the journal (``to_client`` false)."""
        count = len(out)
        before = self._events
        self._events = before + count
        self._unsent = count if to_client else 0
        chunk = ev.encode_many(out, before + 1)
        if out and out[-1]["type"] in _TERMINAL:
            self._journal.terminal_encoded = True  # the journal ends with this chunk (``_journal_chunk``)
        if self._finish is not None:  # the final events: sum the run up before the client sees its end
            self._log_summary(self._bytes + len(chunk))
        return chunk

    def _carry_out_quietly(self, effects: list[fx.Effect]) -> None:
        """Effects of a run nobody reads any more (``run.loop``; an ended run asks nothing):
        its events only go to its journal (a reattach within the retention time replays them)."""
        out: list[Event] = []
        for _request in carry_out(self.machine, effects, self._perform, out.extend, self._clock):
            pass
        if out:
            self._journal_chunk(self._encode(out, to_client=False))

    # ------------------------------------------------------------------ the journal (reattach)
    def _open_journal(self) -> None:
        self._journal.open(self.services.journals, self.thread_id, self.machine)

    def _journal_chunk(self, chunk: bytes) -> None:
        self._journal.append(chunk, self._events + 1, self.machine.translator)

    def _detachable(self) -> bool:
        """Whether the run goes on without its own client (which leaves the readers here)."""
        if self._life.state is not Attach.ATTACHED or self.machine.ended or not self._journal.writer:
            return False
        return self._journal.client_left(self.services.settings.disconnect_grace_seconds)

    def _detach(self) -> None:
        """The run goes on without its client, on a thread of its own, into its journal."""
        self._metrics.client_disconnected()
        log.info(
            "run %s: the client went away; the run goes on while readers follow it, and %gs after the last left",
            self.run_id,
            self.services.settings.disconnect_grace_seconds,
        )
        self._metrics.run_detached()
        self._tick = min(DETACHED_TICK_SECONDS, self._tick)
        self._journal.hear_readers(self._wake)  # a reader here leaving: looked at at once
        detached.start(self._go_on_detached, f"detached-{self.run_id[:16]}")

    def grace_seconds(self) -> float:
        """How long the run goes on with nobody attached (``--disconnect-grace-seconds``)."""
        return self.services.settings.disconnect_grace_seconds

    def _go_on_detached(self) -> None:
        """The detached run's thread (``detached.go_on``)."""
        token = RUN_IDS.set(self._ids)
        try:
            detached.go_on(self, self.grace_seconds(), self.services.monotonic)
        finally:
            RUN_IDS.reset(token)

    # ------------------------------------------------------------------ detached.DetachedRun
    def chunks(self) -> Iterator[bytes]:
        return self._body

    def journal_chunk(self, chunk: bytes) -> None:
        self._journal_chunk(chunk)

    def going_on(self) -> bool:
        return self._life.state is Attach.DETACHED and not self.machine.ended

    def followed(self) -> bool:
        return self._journal.followed()

    def readers_left(self) -> bool:
        return self._journal.readers_left()

    def abandon(self) -> None:
        if self._life.move_if((Attach.DETACHED,), Attach.ABANDONED) and self._pump is not None:
            self._pump.wake()

    def wind_up_detached(self) -> None:
        try:
            if not self.machine.ended and self._life.state is not Attach.HANDED_OVER:
                self._carry_out_quietly(self.machine.client_gone(self._clock()))
        finally:
            self._metrics.detached_run_ended()
            self._wind_up()

    # ------------------------------------------------------------------ effects
    def _perform(self, effect: fx.Effect) -> fx.Reply | None:
        kernel = self.kernel
        match effect:
            case fx.Persist():
                return perform.persist(self.services, self.thread_id, self.run_id, effect)
            case fx.SendStreaming(message=message):
                self._open(lambda: kernel.send_streaming_message(message))
            case fx.Follow(task_id=task_id):
                self._open(lambda: kernel.follow(task_id))
            case fx.RestoreSession(cwd=cwd, session_id=session_id, task_id=task_id):
                return perform.ask(lambda: kernel.ensure_restored(cwd, session_id, task_id))
            case fx.GetTask(task_id=task_id):
                return perform.ask(lambda: (200, kernel.get_task(task_id)))
            case fx.FetchPipelineState(params=params):
                return perform.ask(lambda: kernel.pipeline_state(params))
            case fx.SendMessage(message=message):
                return perform.ask(lambda: (200, kernel.send_message(message)))
            case fx.StopTask(task_id=task_id):
                return perform.ask(lambda: (200, perform.stop_task(self.services, kernel, task_id)))
            case fx.CancelTask(task_id=task_id):
                self.services.cancel_task_quietly(task_id)
            case fx.CancelWhenKnown(execution_id=execution_id):
                if self._pump is not None:
                    self._pump.cancel_when_known(perform.retire_later(self.services, self.thread_id, execution_id))
            case fx.StopStream():
                if self._pump is not None:
                    self._pump.stop()
            case fx.ReleaseThread():
                self._release()
            case fx.Finish():
                self._finished(effect)
        return None

    def _finished(self, finish: fx.Finish) -> None:
        self._finish = finish
        self._duration = time.monotonic() - self._admitted
        self._metrics.run_finished(finish.outcome.value, finish.code, self._duration, self._mode, self._first_event)
        ended = perform.run_ended(finish, self.machine, self.run_id, self._clock())
        perform.persist(self.services, self.thread_id, self.run_id, ended)

    def _log_summary(self, sent: int) -> None:
        """The run's one summary line (``run_summary``); ``sent``: the bytes of the whole stream."""
        self._summarized = True
        duration = self._duration if self._duration is not None else time.monotonic() - self._admitted
        run_summary.log_line(self.run_id, self.thread_id, self._finish, self._events, sent, duration)

    def _open(self, open_stream: Callable[[], KernelByteStream]) -> None:
        if self._pump is not None:
            self._pump.stop()
        self._reader = FrameReader()
        self._pump = KernelPump(open_stream, name=f"kernel-pump-{self.run_id[:16]}")
        self._pump.start()
        if self._life.state in STOPPING:
            self._pump.wake()

    def settling(self) -> bool:
        """Whether the run was adopted and has not heard from the kernel yet (``adoption``), or
        heard that the task is gone and is about to give the thread back."""
        return self.machine.adopted and self.machine.reconciling and self._run_lock is not None

    @property
    def journal_held(self) -> Path | None:
        """The run's journal directory while this process writes it (``adoption`` skips it)."""
        return self._journal.held_directory()

    @property
    def holds_thread(self) -> bool:
        """Whether the run still holds its thread's run lock."""
        return self._run_lock is not None

    def hung_up_now(self) -> bool:
        """From another thread: whether this run's client hung up (the server's word, when it
        offers one); if so the run is woken to end as on a disconnect (or it is ending)."""
        if not self._client.gone_now():
            return False
        if not self.machine.ended:
            self._wake()
        return True

    def release_now(self) -> None:
        """From another thread: give the thread back at once, whatever the writer is blocked on
        (the cancel extension retired the execution; the run itself ends when it next runs)."""
        self._release()

    def _release(self) -> None:
        """The only place a run gives its thread back (once, from whichever thread comes first)."""
        with self._release_lock:
            lock, self._run_lock = self._run_lock, None
        if lock is not None:
            lock.release()
