"""The I/O of one run: carries out what ``run_machine`` decides.

A ``RunDriver`` is the WSGI body of an admitted run (an iterable with ``close()``). It
owns everything that touches the world: the kernel pump and client, the thread store,
the thread's run lock, the clock and the SSE bytes. It feeds the machine, performs
the effects in the order given, answers the requests at once, and writes what is to
be written as one chunk per wake-up (``: heartbeat`` comments while the kernel is
silent). Events already decided are written before a kernel call that may take a
while (RUN_STARTED before a Resume's checks, say).

The run lock is released in one place, ``_release``, reached only through the
machine's ``ReleaseThread``; when the client goes away, or the server closes the
body before its first write, ``close()`` asks the machine (``client_gone``) and
carries out its answer the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from queue import Empty
from typing import TYPE_CHECKING

from . import events as ev
from .a2a import FrameReader, KernelRejected, KernelUnavailable
from .events import Event
from .pump import Chunk, KernelByteStream, KernelPump, Rejected, StreamEnd
from .record import Mutation, RetireExecution, StaleExecution
from .run_effects import (
    KERNEL_REQUESTS,
    CancelTask,
    CancelWhenKnown,
    Effect,
    Emit,
    FetchPipelineState,
    Finish,
    Follow,
    GetTask,
    KernelAnswer,
    KernelDown,
    KernelRefused,
    Persist,
    Persisted,
    PersistFailed,
    ReleaseThread,
    Reply,
    RestoreSession,
    SendMessage,
    SendStreaming,
    StopStream,
)
from .run_machine import RunMachine
from .store import StoreError

if TYPE_CHECKING:
    from .runs import Admission, RunEngine

log = logging.getLogger("agui_adapter.run")


class RunDriver:
    """One run's stream; lives on the WSGI worker thread (plus one pump thread)."""

    def __init__(self, engine: RunEngine, admission: Admission, machine: RunMachine) -> None:
        self.engine = engine
        self.kernel = engine.kernel
        self.thread_id = admission.thread_id
        self.run_id = admission.run_id
        self.machine = machine
        self._run_lock = admission.run_lock
        self._pump: KernelPump | None = None
        self._reader = FrameReader()
        self._body = self._stream()
        self._clock: Callable[[], float] = engine.clock
        #: Called once when the run ends (its slot among the process's concurrent runs).
        self.on_closed: Callable[[], None] | None = None

    # ------------------------------------------------------------------ WSGI iterable
    def __iter__(self) -> RunDriver:
        return self

    def __next__(self) -> bytes:
        return next(self._body)

    def close(self) -> None:
        """End of the response: the client left, the server closed it, or the run is over."""
        try:
            try:
                self._body.close()
            finally:
                if not self.machine.ended:
                    self._carry_out_quietly(self.machine.client_gone(self._clock()))
                if self._pump is not None:
                    self._pump.stop()
        finally:
            on_closed, self.on_closed = self.on_closed, None
            if on_closed is not None:
                on_closed()

    # ------------------------------------------------------------------ the stream
    def _stream(self) -> Iterator[bytes]:
        machine = self.machine
        out: list[Event] = []
        yield from self._carry_out(machine.start(self._clock()), out)
        if out:
            yield ev.encode_many(out)
        heartbeat = self.engine.settings.heartbeat_seconds
        while not machine.ended:
            assert self._pump is not None
            try:
                items = self._pump.get(timeout=heartbeat)
            except Empty:
                yield ev.HEARTBEAT
                continue
            out = []
            for item in items:
                now = self._clock()
                if type(item) is Chunk:
                    effects = machine.frames(self._reader.feed(item.data), now)
                elif type(item) is StreamEnd:
                    effects = machine.frames(self._reader.close(), now)
                    yield from self._carry_out(effects, out)
                    if machine.ended:
                        break
                    effects = machine.stream_ended(now)
                elif type(item) is Rejected:
                    effects = machine.kernel_rejected(item.error, now)
                else:
                    effects = machine.kernel_unavailable(str(item.error), now)
                yield from self._carry_out(effects, out)
                if machine.ended:
                    break
            if out:
                yield ev.encode_many(out)

    def _carry_out(self, effects: list[Effect], out: list[Event]) -> Iterator[bytes]:
        """Perform effects in order; events go to ``out`` (written by the caller), except
        that what is already decided is written before a kernel call."""
        while effects:
            reply: Reply | None = None
            for effect in effects:
                kind = type(effect)
                if kind is Emit:
                    out.extend(effect.events)  # type: ignore[union-attr]
                    continue
                if kind in KERNEL_REQUESTS and out:
                    yield ev.encode_many(out)
                    out.clear()
                reply = self._perform(effect)
            effects = self.machine.replied(reply, self._clock()) if reply is not None else []

    def _carry_out_quietly(self, effects: list[Effect]) -> None:
        """Effects of a run nobody reads any more: no events, no requests."""
        for effect in effects:
            if type(effect) is not Emit:
                self._perform(effect)

    # ------------------------------------------------------------------ effects
    def _perform(self, effect: Effect) -> Reply | None:
        if isinstance(effect, Persist):
            return self._persist(effect)
        if isinstance(effect, SendStreaming):
            message = effect.message
            self._open(lambda: self.kernel.send_streaming_message(message))
        elif isinstance(effect, Follow):
            task_id = effect.task_id
            self._open(lambda: self.kernel.follow(task_id))
        elif isinstance(effect, RestoreSession):
            return self._ask(lambda: self.kernel.ensure_restored(effect.cwd, effect.session_id, effect.task_id))
        elif isinstance(effect, GetTask):
            return self._ask(lambda: (200, self.kernel.get_task(effect.task_id)))
        elif isinstance(effect, FetchPipelineState):
            return self._ask(lambda: self.kernel.pipeline_state(effect.params))
        elif isinstance(effect, SendMessage):
            return self._ask(lambda: (200, self.kernel.send_message(effect.message)))
        elif isinstance(effect, CancelTask):
            self.engine.cancel_task_quietly(effect.task_id)
        elif isinstance(effect, CancelWhenKnown):
            if self._pump is not None:
                self._pump.cancel_when_known(self._retire_later(effect.execution_id))
        elif isinstance(effect, StopStream):
            if self._pump is not None:
                self._pump.stop()
        elif isinstance(effect, ReleaseThread):
            self._release()
        elif isinstance(effect, Finish):
            log.info("run %s on thread %s: %s", self.run_id, self.thread_id, effect.code or effect.outcome.value)
        return None

    def _persist(self, effect: Persist) -> Reply | None:
        try:
            record = self.engine.store.update(self.thread_id, effect.mutation)
            if record is None:
                raise StoreError("the thread state disappeared")
        except (StoreError, StaleExecution) as exc:
            reason = str(exc) if isinstance(exc, StoreError) else "the execution ended while the run was live"
            if effect.required:
                return PersistFailed(reason)
            log.warning("run %s: could not record %s: %s", self.run_id, type(effect.mutation).__name__, reason)
            return None
        return Persisted(record) if effect.required else None

    def _ask(self, call: Callable[[], tuple[int, object]]) -> Reply:
        try:
            status, body = call()
        except KernelRejected as exc:
            return KernelRefused(exc)
        except KernelUnavailable as exc:
            return KernelDown(str(exc))
        return KernelAnswer(status, body)

    def _open(self, open_stream: Callable[[], KernelByteStream]) -> None:
        if self._pump is not None:
            self._pump.stop()
        self._reader = FrameReader()
        self._pump = KernelPump(open_stream, name=f"kernel-pump-{self.run_id[:16]}")
        self._pump.start()

    def _retire_later(self, execution_id: str) -> Callable[[str], None]:
        """For an abandoned stream whose task id only the reader will learn."""
        engine, thread_id = self.engine, self.thread_id

        def cancel_and_retire(task_id: str) -> None:
            engine.cancel_task_quietly(task_id)
            mutation: Mutation = RetireExecution(execution_id, task_id=task_id)
            try:
                engine.store.update(thread_id, mutation)
            except StoreError as exc:
                log.warning("thread %s: could not retire an abandoned execution: %s", thread_id, exc)

        return cancel_and_retire

    def _release(self) -> None:
        """The only place a run gives its thread back."""
        lock, self._run_lock = self._run_lock, None
        if lock is not None:
            lock.release()
