"""The reader thread of a run: owns the blocking kernel stream, feeds a bounded queue.

The reader only does I/O: it queues the raw bytes of each network read, and the WSGI
generator decodes and translates them after taking everything already queued in one
go (one chunk per wake-up, heartbeats on timeout). Keeping the parsing on one thread
avoids handing the GIL back and forth for every batch. ``stop()`` unblocks the reader
from any thread by closing the stream. The reader does read the first frames itself,
to learn the kernel task id: a run abandoned before the consumer saw it can still
have its task cancelled (``cancel_when_known``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from .a2a import FrameReader, KernelRejected, KernelStream, KernelUnavailable, SnapshotStream
from .translate import inspect_frame

log = logging.getLogger("agui_adapter.pump")

Item = tuple[str, Any]  # ("bytes", chunk) | ("end", None) | ("rejected", exc) | ("unavailable", exc)


class KernelPump(threading.Thread):
    """Reads one kernel stream on its own thread."""

    def __init__(
        self, open_stream: Callable[[], KernelStream | SnapshotStream], *, maxsize: int = 64, name: str = "kernel-pump"
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._open_stream = open_stream
        self._queue: queue.Queue[Item] = queue.Queue(maxsize=maxsize)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._stream: KernelStream | SnapshotStream | None = None
        self._on_task_id: Callable[[str], None] | None = None
        self.task_id: str | None = None

    # --- reader side ------------------------------------------------------------------
    def run(self) -> None:
        try:
            stream = self._open_stream()
        except KernelRejected as exc:
            self._put(("rejected", exc))
            return
        except KernelUnavailable as exc:
            self._put(("unavailable", exc))
            return
        except Exception as exc:  # noqa: BLE001 - reported to the run, never lost
            log.exception("opening the kernel stream failed")
            self._put(("unavailable", KernelUnavailable(exc.__class__.__name__)))
            return
        with self._lock:
            self._stream = stream
            stopped = self._stopped.is_set() and self._on_task_id is None
        if stopped:
            stream.close()
            return
        reader: FrameReader | None = FrameReader()
        try:
            for chunk in stream.chunks():
                if reader is not None:  # only until the task id is known
                    for frame in reader.feed(chunk):
                        task_id = inspect_frame(frame).task_id
                        if task_id:
                            self.task_id, reader = task_id, None
                            break
                callback = self._on_task_id
                if callback is not None:
                    if self.task_id:
                        self._on_task_id = None
                        callback(self.task_id)
                        stream.close()
                        return
                    continue
                if not self._put(("bytes", chunk)):
                    return
        except KernelUnavailable as exc:
            self._put(("unavailable", exc))
            return
        finally:
            if self._stopped.is_set():
                stream.close()
        self._put(("end", None))

    def _put(self, item: Item) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.25)
                return True
            except queue.Full:
                continue
        return False

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

    def stop(self) -> None:
        """Stop reading and close the kernel stream (any thread)."""
        self._stopped.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def cancel_when_known(self, callback: Callable[[str], None]) -> None:
        """Abandon the stream, but first learn its task id and pass it to ``callback``."""
        if self.task_id:
            self.stop()
            callback(self.task_id)
            return
        self._on_task_id = callback
        self._stopped.set()
        with self._lock:
            stream = self._stream
        if stream is not None and stream.closed:
            self._on_task_id = None  # the stream is over; nothing more will come
