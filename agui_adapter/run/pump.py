"""The reader thread of a run: owns the blocking kernel stream, feeds a bounded queue.

The thread is one of the process's warm reader threads (``READERS``, ``ops.warm_threads``:
a thread that finished a run's kernel stream waits for the next one, so a run does not wait
for a thread's birth on its way to the first delta): ``start()`` hands the reading over and
returns at once; ``join`` and ``is_alive`` say when it is done.

The reader only does I/O: it queues the raw bytes of each network read, and the WSGI
thread decodes and translates them after taking everything already queued in one go
(one chunk per wake-up, heartbeats on timeout). Keeping the parsing on one thread
avoids handing the GIL back and forth for every batch.

Two threads meet here, so the handshake is explicit: one ``PumpState`` under one
lock, changed by the reader (``OPENING`` -> ``READING`` -> ``DONE``) and by the run
(``stop()`` -> ``STOPPED``; ``cancel_when_known()`` -> ``SEEKING_TASK``). ``stop()``
unblocks the reader from any thread by closing the stream. The reader keeps the
bytes it queued while the task id is not known, so that a run abandoned before it
learned its task from them can still have that task cancelled: ``cancel_when_known`` looks
into them, and in ``SEEKING_TASK`` the reader reads on, queues nothing, and hands the task
id to the callback once it is known. They are looked into only then (or once more than
``UNREAD_BYTES`` of them pile up): parsed on the reader's thread as they came, they held the
interpreter's lock from the run on its way to its first delta, which parses them anyway.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from agui_adapter.kernel_client.a2a import FrameReader
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.ops.warm_threads import WarmThreads
from agui_adapter.run.translation import inspect_frame

log = logging.getLogger("agui_adapter.run.pump")

#: The process's reader threads, every run's pump among them: a thread with nothing to read
#: waits 10 s for the next run, and at most 8 wait at once.
READERS = WarmThreads(idle_seconds=10.0, max_idle=8, name="kernel-reader")

#: The most bytes a reader keeps unread while its stream has not named its task (the kernel
#: names it in its first frame); past that they are looked into at once, and so on after.
UNREAD_BYTES = 64 * 1024


class KernelByteStream(Protocol):
    """What the pump reads: ``a2a.KernelStream`` or ``a2a.SnapshotStream``."""

    def chunks(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


# --- what the queue carries -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Chunk:
    """Raw bytes of one network read of the kernel's SSE stream."""

    data: bytes


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The kernel closed the stream."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The kernel answered the call with a JSON-RPC error."""

    error: KernelRejected


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The kernel could not be reached, or the stream broke."""

    error: KernelUnavailable


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing from the kernel: the run is asked to look at something else (shutdown)."""


Item = Chunk | StreamEnd | Rejected | Unavailable | Wake


class PumpState(enum.Enum):
    OPENING = "opening"  # the kernel call is being made
    READING = "reading"  # bytes flow into the queue
    SEEKING_TASK = "seeking-task"  # abandoned before the task id was known: read on until it is
    STOPPED = "stopped"  # told to stop; the stream is (being) closed, nothing more is queued
    DONE = "done"  # the stream ended by itself; its last item is queued


class KernelPump:
    """Reads one kernel stream on its own thread (one of ``readers``' warm threads)."""

    def __init__(
        self,
        open_stream: Callable[[], KernelByteStream],
        *,
        maxsize: int = 64,
        name: str = "kernel-pump",
        threads: WarmThreads = READERS,
    ) -> None:
        self.name = name
        self._threads = threads
        self._started = False
        self._over = threading.Event()  # the reader returned (``join``, ``is_alive``)
        self._open_stream = open_stream
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=maxsize)
        self._lock = threading.Lock()
        self._state = PumpState.OPENING
        self._stream: KernelByteStream | None = None
        self._on_task_id: Callable[[str], None] | None = None
        self.task_id: str | None = None
        # what was read while the task id is not known, not looked into yet (``_look_for_task``)
        self._unread: list[bytes] | None = []
        self._unread_bytes = 0
        self._finder: FrameReader | None = None
        # The starting request's context (its id on this thread's log lines).
        self._context = contextvars.copy_context()

    @property
    def state(self) -> PumpState:
        return self._state

    # --- reader side ------------------------------------------------------------------
    def start(self) -> None:
        """Start reading on a reader thread; returns at once (once per pump)."""
        if self._started:
            raise RuntimeError("a pump is started once")
        self._started = True
        if not self._threads.run(self.run):
            raise RuntimeError("can't start new thread")

    def join(self, timeout: float | None = None) -> None:
        """Wait until the reader is done with the stream (as ``Thread.join``)."""
        self._over.wait(timeout)

    def is_alive(self) -> bool:
        """Whether the reader is started and not done yet (as ``Thread.is_alive``)."""
        return self._started and not self._over.is_set()

    def run(self) -> None:
        try:
            self._context.run(self._open_and_read)
        finally:
            self._over.set()

    def _open_and_read(self) -> None:
        try:
            stream = self._open_stream()
        except KernelRejected as exc:
            self._finish(Rejected(exc))
            return
        except KernelUnavailable as exc:
            self._finish(Unavailable(exc))
            return
        except Exception as exc:  # noqa: BLE001 - reported to the run, never lost
            log.exception("opening the kernel stream failed")
            self._finish(Unavailable(KernelUnavailable(exc.__class__.__name__)))
            return
        with self._lock:
            self._stream = stream
            if self._state is PumpState.OPENING:
                self._state = PumpState.READING
            stopped = self._state is PumpState.STOPPED
        if stopped:
            stream.close()
            return
        try:
            self._read(stream)
        except KernelUnavailable as exc:
            self._finish(Unavailable(exc))
        else:
            self._finish(StreamEnd())
        finally:
            if self._state is PumpState.STOPPED:
                stream.close()

    def _read(self, stream: KernelByteStream) -> None:
        for chunk in stream.chunks():
            if self._unread is not None:
                self._keep_unread(chunk)  # before it is queued: the run that gets it may ask
            queued = self._state is PumpState.READING and self._put(Chunk(chunk))
            if queued and self._state is PumpState.READING:
                continue
            state = self._state  # changed by the run: abandoned, or stopped
            if state is PumpState.SEEKING_TASK:
                with self._lock:
                    self._look_for_task()
                if self.task_id:
                    self._hand_over_task_id(stream)
                    return
                continue
            return

    def _keep_unread(self, chunk: bytes) -> None:
        with self._lock:
            unread = self._unread
            if unread is None:
                return
            unread.append(chunk)
            self._unread_bytes += len(chunk)
            if self._unread_bytes > UNREAD_BYTES:
                self._look_for_task()

    def _look_for_task(self) -> None:  # holding the lock
        """Look into what was read and not looked into yet for the task id (``task_id``)."""
        unread = self._unread
        if unread is None:
            return
        self._unread, self._unread_bytes = [], 0
        finder = self._finder = self._finder or FrameReader()
        for chunk in unread:
            for frame in finder.feed(chunk):
                task_id = inspect_frame(frame).task_id
                if task_id:
                    self.task_id = task_id
                    self._unread = self._finder = None  # known: nothing more is kept
                    return

    def _hand_over_task_id(self, stream: KernelByteStream) -> None:
        with self._lock:
            callback, self._on_task_id = self._on_task_id, None
            self._state = PumpState.STOPPED
        stream.close()
        if callback is not None and self.task_id:
            callback(self.task_id)

    def _put(self, item: Item) -> bool:
        """Queue an item while reading; False once the run stopped or abandoned the stream."""
        while self._state is PumpState.READING:
            try:
                self._queue.put(item, timeout=0.25)
                return True
            except queue.Full:
                continue
        return False

    def _finish(self, item: Item) -> None:
        """The stream is over by itself: queue its last item unless the run stopped reading."""
        with self._lock:
            if self._state in (PumpState.OPENING, PumpState.READING):
                self._state = PumpState.DONE
                deliver = True
            else:
                self._on_task_id = None  # seeking a task id the stream never gave
                deliver = False
        while deliver:
            try:
                self._queue.put(item, timeout=0.25)
                return
            except queue.Full:
                deliver = self._state is PumpState.DONE

    # --- consumer side ------------------------------------------------------------------
    def get(self, timeout: float) -> list[Item]:
        """Everything available, waiting up to ``timeout`` for the first item."""
        items = [self._queue.get(timeout=timeout)]
        get = self._queue.get_nowait
        try:
            while True:
                items.append(get())
        except queue.Empty:
            pass
        return items

    def wake(self) -> None:
        """Wake the run waiting in ``get`` (any thread); a full queue wakes it anyway."""
        try:
            self._queue.put_nowait(Wake())
        except queue.Full:
            pass

    def stop(self) -> None:
        """Stop reading and close the kernel stream (any thread)."""
        with self._lock:
            self._state = PumpState.STOPPED
            self._on_task_id = None
            stream = self._stream
        if stream is not None:
            stream.close()

    def cancel_when_known(self, callback: Callable[[str], None]) -> None:
        """Abandon the stream, but first learn its task id and pass it to ``callback``."""
        with self._lock:
            state = self._state
            self._look_for_task()
            if self.task_id and state is not PumpState.STOPPED:
                self._state = PumpState.STOPPED
                stream = self._stream
            elif state in (PumpState.OPENING, PumpState.READING):
                self._state = PumpState.SEEKING_TASK
                self._on_task_id = callback
                return
            else:  # stopped, or over: nothing more will come
                return
        if stream is not None:
            stream.close()
        callback(self.task_id)
