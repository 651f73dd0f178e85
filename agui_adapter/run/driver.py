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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

from agui_adapter.kernel_client.a2a import FrameReader
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.ops.logs import RUN_IDS
from agui_adapter.ops.tracing import NO_TRACE
from agui_adapter.protocol import events as ev
from agui_adapter.protocol.errors import Code
from agui_adapter.protocol.events import Event
from agui_adapter.protocol.timestamps import rfc3339
from agui_adapter.run import detached
from agui_adapter.run import effects as fx
from agui_adapter.run.admitted import Admission
from agui_adapter.run.detached import DETACHED_TICK_SECONDS
from agui_adapter.run.lifecycle import RUNNING, STOPPING, Attach, Lifecycle
from agui_adapter.run.loop import carry_out
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.pump import Chunk, KernelByteStream, KernelPump, Rejected, StreamEnd, Unavailable
from agui_adapter.run.services import RunServices
from agui_adapter.run.translation import BUSY_STATES, inspect_frame
from agui_adapter.state.journal import JournalWriter
from agui_adapter.state.record import Mutation, RetireExecution, RunEnded, StaleExecution
from agui_adapter.state.store import StoreError

log = logging.getLogger("agui_adapter.run")

#: How often an idle run wakes up: watched by its server, to ask whether its client hung up;
#: detached, to see whether its grace period is over (heartbeats go every heartbeat_seconds).
ATTACHED_TICK_SECONDS = 0.5
WATCHED_TICK_SECONDS = 0.2
#: How many kernel frames the machine takes at once when a wake-up finds a backlog queued: the
#: parsed frames of a whole backlog (thousands) alive at once cost the cyclic GC dearly.
FRAMES_PER_STEP = 256
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
        self._trace.set(mode=self._mode)
        self._first_event: float | None = None  # seconds from admission to the first event after RUN_STARTED
        self._events = 0  # events encoded (the ids used)
        self._unsent = 0  # events of the chunk just encoded, counted as sent when the client gets it
        self._bytes = 0  # bytes handed to the server (heartbeats included)
        self._finish: fx.Finish | None = None
        self._duration: float | None = None
        self._summarized = False  # the run's summary line is logged once
        # reattach (``state.journal``): what was sent, who reads it, and the run without a reader
        self._journal: JournalWriter | None = None
        self._terminal_encoded = False
        # the server's "did the client hang up?" (the built-in server's ``agui.client_gone``)
        self._client_gone = client_gone
        self._watch = client_gone  # kept for ``hung_up_now`` once the stream stopped asking
        self._next_check = 0.0
        tick = WATCHED_TICK_SECONDS if client_gone is not None else ATTACHED_TICK_SECONDS
        self._tick = min(tick, services.settings.heartbeat_seconds)

    # ------------------------------------------------------------------ WSGI iterable
    def __iter__(self) -> RunDriver:
        return self

    def __next__(self) -> bytes:
        self._life.move_if((Attach.NEW,), Attach.ATTACHED)
        token = RUN_IDS.set(self._ids)
        trace = self._trace.attach()
        try:
            while True:
                if self._hung_up():
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
        return chunk

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
        if self._life.state is Attach.ENDED:
            return
        token = RUN_IDS.set(self._ids)
        self._watch = self._client_gone = None  # the connection may serve other requests now
        trace = self._trace.attach()
        try:
            if self._detachable() and self._life.move_if((Attach.ATTACHED,), Attach.DETACHED):
                self._detach()
                return
            try:
                try:
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

    def _wind_up(self) -> None:
        """The run is over (or abandoned): stop the pump, end the journal, give the slot
        back, and sum the run up if its final chunk did not."""
        self._life.move(Attach.ENDED)
        try:
            if self._pump is not None:
                self._pump.stop()
            if self._journal is not None:
                self._journal_end()
        finally:
            self.services.run_ended(self)
            if not self._summarized:  # abandoned: no final chunk was written
                self._log_summary(self._bytes)
            finish = self._finish
            outcome = finish.outcome.value if finish is not None else "abandoned"
            self._trace.end(
                error=(finish.code or "error") if outcome == "error" and finish is not None else None,
                outcome=outcome,
                error_code=finish.code if finish is not None else None,
                events_sent=self._events,
                bytes_sent=self._bytes,
            )

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
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.hand_over(self._clock())
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
            items = self._wait_for_kernel()
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
            yield from self._take(items, out)
            if out:
                last_write = time.monotonic()
                yield self._encode(out)
            else:
                yield _IDLE  # woken for nothing to write: ``__next__`` looks at the client

    def _wait_for_kernel(self) -> list[Any]:
        """What the kernel pump queued, after a tick at most."""
        assert self._pump is not None
        try:
            return self._pump.get(timeout=self._tick)
        except Empty:
            return []

    def _stop(self, state: Attach) -> Iterator[bytes]:
        """The run was told to stop: left to the kernel (a hand-over, once the run has a task
        and a journal to adopt it from), else ended with its final events."""
        if state is Attach.HANDING_OVER and self._journal is not None and self.machine.task_id:
            self._leave_to_kernel()
            return
        now = self._clock()
        effects = self.machine.abandoned(now) if state is Attach.ABANDONED else self.machine.shutting_down(now)
        out: list[Event] = []
        yield from self._carry_out(effects, out)
        yield self._encode(out)

    def _take(self, items: list[Any], out: list[Event]) -> Iterator[bytes]:
        """What the pump queued in one wake-up: the bytes are decoded together and the machine
        takes all their frames at once; anything else queued is handled in its place."""
        machine = self.machine
        now = self._clock()
        frames: list[Any] = []
        for item in items:
            match item:
                case Chunk(data=data):
                    frames += self._reader.feed(data)
                    if len(frames) < FRAMES_PER_STEP:
                        continue
                    # a long backlog is taken a step at a time: its frames and events are freed as they go
                    yield from self._carry_out(machine.frames(frames, now), out)
                    frames = []
                    if machine.ended:
                        return
                    if out:
                        yield self._encode(out)
                        out.clear()
                    continue
                case StreamEnd():
                    frames += self._reader.close()
            if frames:
                yield from self._carry_out(machine.frames(frames, now), out)
                frames = []
                if machine.ended:
                    return
            effects = self._on_item(item, now)
            if effects is None:
                continue
            yield from self._carry_out(effects, out)
            if machine.ended:
                return
        if frames:
            effects = machine.frames(frames, now)
            if len(effects) == 1 and type(effects[0]) is fx.Emit:  # the common case: events only
                out.extend(effects[0].events)  # type: ignore[union-attr]
            else:
                yield from self._carry_out(effects, out)

    def _on_item(self, item: Any, now: float) -> list[fx.Effect] | None:
        """What the machine makes of a queued item other than bytes (None: a wake-up only)."""
        match item:
            case StreamEnd():
                return self.machine.stream_ended(now)
            case Rejected(error=error):
                return self.machine.kernel_rejected(error, now)
            case Unavailable(error=error):
                return self.machine.kernel_unavailable(str(error), now)
            case _:  # Wake
                return None

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
            self._terminal_encoded = True  # the journal ends with this chunk (``_journal_chunk``)
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
        props = self.machine.run_input.props
        meta = {  # what a process adopting the run needs (``adoption``); never a secret
            "threadId": self.thread_id,
            "runId": self.run_id,
            "parentRunId": self.machine.run_input.parent_run_id,
            "mode": self.machine.mode.value,
            "language": self.machine.language,
            "rosInvocationId": props.ros_invocation_id,
            "preferredLanguage": props.preferred_language,
            "runMode": props.run_mode,
            "pipelineName": props.pipeline_name,
        }
        try:
            self._journal = self.services.journals.open_writer(self.thread_id, self.run_id, meta)
        except OSError as exc:
            log.warning("run %s: no journal, it cannot be reattached: %s", self.run_id, exc)

    def _journal_chunk(self, chunk: bytes) -> None:
        journal = self._journal
        if journal is None:
            return
        try:
            journal.append(chunk, self._events + 1)
        except OSError as exc:
            log.warning("run %s: journal write failed, it cannot be reattached any more: %s", self.run_id, exc)
            self._journal = None
            journal.close()
            return
        if self._terminal_encoded:  # ended with the terminal event: a reader that has it gets 204 at once
            self._journal_end()
        elif self.machine.translator.pipeline_seen:  # for an adopter: what the kernel's journal delivered
            try:
                journal.note_pipeline(self.machine.translator.pipeline.to_json())
            except OSError as exc:
                log.warning("run %s: could not note the pipeline's progress: %s", self.run_id, exc)

    def _journal_end(self) -> None:
        journal, self._journal = self._journal, None
        if journal is not None:
            try:
                journal.end()
            except OSError as exc:
                log.warning("run %s: could not end its journal: %s", self.run_id, exc)

    def _hung_up(self) -> bool:
        """Whether the server says the client hung up (asked once a tick at most)."""
        client_gone = self._client_gone
        if client_gone is None:
            return False
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + self._tick
        if not client_gone():
            return False
        self._client_gone = None
        log.info("run %s: the client hung up", self.run_id)
        return True

    def _detachable(self) -> bool:
        """Whether the run goes on without its own client (which leaves the readers here)."""
        if self._life.state is not Attach.ATTACHED or self.machine.ended or not self._journal:
            return False
        grace = self.services.settings.disconnect_grace_seconds
        try:
            self._journal.client_left()
            return grace > 0 or self._journal.readers() > 0
        except OSError as exc:
            log.warning("run %s: journal readers: %s", self.run_id, exc)
            return grace > 0

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
        journal = self._journal
        try:
            return journal is not None and journal.readers() > 0
        except OSError:
            return False

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
                return self._persist(effect)
            case fx.SendStreaming(message=message):
                self._open(lambda: kernel.send_streaming_message(message))
            case fx.Follow(task_id=task_id):
                self._open(lambda: kernel.follow(task_id))
            case fx.RestoreSession(cwd=cwd, session_id=session_id, task_id=task_id):
                return self._ask(lambda: kernel.ensure_restored(cwd, session_id, task_id))
            case fx.GetTask(task_id=task_id):
                return self._ask(lambda: (200, kernel.get_task(task_id)))
            case fx.FetchPipelineState(params=params):
                return self._ask(lambda: kernel.pipeline_state(params))
            case fx.SendMessage(message=message):
                return self._ask(lambda: (200, kernel.send_message(message)))
            case fx.StopTask(task_id=task_id):
                return self._ask(lambda: (200, self._stop_task(task_id)))
            case fx.CancelTask(task_id=task_id):
                self.services.cancel_task_quietly(task_id)
            case fx.CancelWhenKnown(execution_id=execution_id):
                if self._pump is not None:
                    self._pump.cancel_when_known(self._retire_later(execution_id))
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
        self._record_end(finish)

    def _record_end(self, finish: fx.Finish) -> None:
        """The run's outcome in the thread's recent runs (``GET /threads/{threadId}``), written
        before its final events reach the client; a run whose client left ends ``CANCELLED``."""
        outcome, code = finish.outcome.value, finish.code
        if finish.outcome is fx.Outcome.ABANDONED:
            outcome, code = fx.Outcome.ERROR.value, code or Code.CANCELLED
        tool_calls: tuple[str, ...] = ()
        if finish.outcome is fx.Outcome.INTERRUPT:
            pending = self.machine.record.execution.pending.values()
            tool_calls = tuple(str(p.interrupt.get("toolCallId")) for p in pending if p.interrupt.get("toolCallId"))
        ended = RunEnded(self.run_id, outcome, rfc3339(self._clock()), code, self.machine.task_id, tool_calls)
        self._persist(fx.Persist(ended))

    def _log_summary(self, sent: int) -> None:
        """The run's one summary line (its fields also as structured extras for JSON logs);
        ``sent``: the bytes of the whole stream, its final chunk included."""
        self._summarized = True
        finish = self._finish
        outcome = finish.outcome.value if finish is not None else "abandoned"
        code = finish.code if finish is not None else None
        duration = self._duration if self._duration is not None else time.monotonic() - self._admitted
        log.info(
            "run %s on thread %s: %s, %d events, %d bytes, %.3f s",
            self.run_id,
            self.thread_id,
            code or outcome,
            self._events,
            sent,
            duration,
            extra={
                "outcome": outcome,
                "error_code": code,
                "events_sent": self._events,
                "bytes_sent": sent,
                "duration_seconds": round(duration, 6),
            },
        )

    def _persist(self, effect: fx.Persist) -> fx.Reply | None:
        try:
            record = self.services.store.update(self.thread_id, effect.mutation)
            if record is None:
                raise StoreError("the thread state disappeared")
        except (StoreError, StaleExecution) as exc:
            reason = str(exc) if isinstance(exc, StoreError) else "the execution ended while the run was live"
            if effect.required:
                return fx.Failed(reason)
            log.warning("run %s: could not record %s: %s", self.run_id, type(effect.mutation).__name__, reason)
            return None
        return fx.Persisted(record) if effect.required else None

    def _ask(self, call: Callable[[], tuple[int, object]]) -> fx.Reply:
        try:
            status, body = call()
        except KernelRejected as exc:
            return fx.KernelRefused(exc)
        except KernelUnavailable as exc:
            return fx.Failed(str(exc))
        return fx.KernelAnswer(status, body)

    def _stop_task(self, task_id: str) -> object:
        """Cancel a task and wait until the kernel reports it no longer working (ended, or
        waiting for input, which does not block a new turn); its last snapshot."""
        self.services.cancel_task_quietly(task_id)
        deadline = time.monotonic() + self.services.settings.stale_task_timeout_seconds
        while True:
            task = self.kernel.get_task(task_id)
            if inspect_frame({"result": task}).state not in BUSY_STATES or time.monotonic() >= deadline:
                return task
            time.sleep(0.1)

    def _open(self, open_stream: Callable[[], KernelByteStream]) -> None:
        if self._pump is not None:
            self._pump.stop()
        self._reader = FrameReader()
        self._pump = KernelPump(open_stream, name=f"kernel-pump-{self.run_id[:16]}")
        self._pump.start()
        if self._life.state in STOPPING:
            self._pump.wake()

    def _retire_later(self, execution_id: str) -> Callable[[str], None]:
        """For an abandoned stream whose task id only the reader will learn."""
        services, thread_id = self.services, self.thread_id

        def cancel_and_retire(task_id: str) -> None:
            services.cancel_task_quietly(task_id)
            mutation: Mutation = RetireExecution(execution_id, task_id=task_id)
            try:
                services.store.update(thread_id, mutation)
            except StoreError as exc:
                log.warning("thread %s: could not retire an abandoned execution: %s", thread_id, exc)

        return cancel_and_retire

    def settling(self) -> bool:
        """Whether the run was adopted and has not heard from the kernel yet (``adoption``), or
        heard that the task is gone and is about to give the thread back."""
        return self.machine.adopted and self.machine.reconciling and self._run_lock is not None

    @property
    def holds_thread(self) -> bool:
        """Whether the run still holds its thread's run lock."""
        return self._run_lock is not None

    def hung_up_now(self) -> bool:
        """From another thread: whether this run's client hung up (the server's word, when it
        offers one); if so the run is woken to end as on a disconnect."""
        watch = self._watch
        if watch is None or self.machine.ended or not watch():
            return False
        pump = self._pump
        if pump is not None:
            pump.wake()
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
