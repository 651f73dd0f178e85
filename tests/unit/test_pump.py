"""The pump's cross-thread handshake, with a fake kernel stream: no sockets.

The fake stream blocks where a real one would (opening the call, waiting for bytes),
under the test's control, so every interleaving of the reader and the run is forced,
not hoped for.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator

import pytest

from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.run.pump import Chunk, KernelPump, PumpState, Rejected, StreamEnd, Unavailable

WAIT = 5.0


def frame(task_id: str | None = None, text: str = "x") -> bytes:
    update = {"status": {"state": "TASK_STATE_WORKING"}, "contextId": "ctx", "text": text}
    if task_id:
        update["taskId"] = task_id
    return b"data: " + json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": update}}).encode() + b"\n\n"


class FakeStream:
    """A kernel stream fed by the test; ``close()`` unblocks a reader waiting for bytes."""

    def __init__(self) -> None:
        self._chunks: queue.Queue[bytes | None] = queue.Queue()
        self.closed = threading.Event()

    def push(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self._chunks.put(chunk)

    def end(self) -> None:
        self._chunks.put(None)

    def chunks(self) -> Iterator[bytes]:
        while not self.closed.is_set():
            try:
                chunk = self._chunks.get(timeout=0.01)
            except queue.Empty:
                continue
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        self.closed.set()


class Opener:
    """The kernel call: blocks until the test lets it return (or raise)."""

    def __init__(self, stream: FakeStream | None = None, error: Exception | None = None) -> None:
        self.stream = stream or FakeStream()
        self.error = error
        self.called = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> FakeStream:
        self.called.set()
        assert self.release.wait(WAIT)
        if self.error is not None:
            raise self.error
        return self.stream


def started(opener: Opener) -> KernelPump:
    pump = KernelPump(opener, maxsize=4)
    pump.start()
    assert opener.called.wait(WAIT)
    return pump


def drain(pump: KernelPump, until: type) -> list[object]:
    items: list[object] = []
    while not any(isinstance(i, until) for i in items):
        items += pump.get(timeout=WAIT)
    return items


def test_bytes_then_the_end_arrive_in_order() -> None:
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    opener.stream.push(frame("task-1"), frame(text="y"))
    opener.stream.end()
    items = drain(pump, StreamEnd)
    assert [type(i) for i in items] == [Chunk, Chunk, StreamEnd]
    pump.join(WAIT)
    assert pump.state is PumpState.DONE


def test_the_reader_looks_for_the_task_id_only_when_asked() -> None:
    """The run parses what it gets; the reader does not parse it too (on its thread, it held the
    interpreter's lock from the run on its way to the first delta), unless the run asks."""
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    opener.stream.push(frame(text="before"), frame("task-1"), frame(text="y"))
    opener.stream.end()
    drain(pump, StreamEnd)
    pump.join(WAIT)
    assert pump.task_id is None  # not looked for
    called: list[str] = []
    pump.cancel_when_known(called.append)
    assert called == ["task-1"] and pump.task_id == "task-1"


def test_the_bytes_kept_unread_are_bounded() -> None:
    """A stream that does not name its task at once: what the reader keeps is looked into once it
    passes ``UNREAD_BYTES``, and nothing is kept once the task id is known."""
    from agui_adapter.run.pump import UNREAD_BYTES

    opener = Opener()
    opener.release.set()
    pump = started(opener)
    big = "z" * 10_000
    chunks = [frame(text=big) for _ in range(3)] + [frame("task-5")] + [frame(text=big) for _ in range(6)]
    opener.stream.push(*chunks)
    opener.stream.end()
    drain(pump, StreamEnd)
    pump.join(WAIT)
    assert pump.task_id == "task-5" and pump._unread is None and pump._unread_bytes <= UNREAD_BYTES


@pytest.mark.parametrize(
    ("error", "item"),
    [(KernelRejected({"code": -32602, "message": "bad"}), Rejected), (KernelUnavailable("refused"), Unavailable)],
)
def test_a_call_that_fails_is_reported(error: Exception, item: type) -> None:
    opener = Opener(error=error)
    opener.release.set()
    pump = started(opener)
    [reported] = pump.get(timeout=WAIT)
    assert isinstance(reported, item)


def test_stop_before_the_stream_opened_closes_it_when_it_arrives() -> None:
    opener = Opener()
    pump = started(opener)
    pump.stop()
    opener.release.set()
    pump.join(WAIT)
    assert not pump.is_alive() and opener.stream.closed.is_set()
    with pytest.raises(queue.Empty):
        pump.get(timeout=0.05)


def test_stop_while_blocked_on_the_kernel_unblocks_the_reader() -> None:
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    opener.stream.push(frame("task-1"))
    assert isinstance(pump.get(timeout=WAIT)[0], Chunk)
    pump.stop()  # the reader is waiting for bytes that never come
    pump.join(WAIT)
    assert not pump.is_alive() and opener.stream.closed.is_set()
    with pytest.raises(queue.Empty):
        pump.get(timeout=0.05)  # no end is reported for a stream the run stopped


def test_cancel_when_known_calls_back_at_once_when_the_task_id_is_known() -> None:
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    opener.stream.push(frame("task-1"))
    pump.get(timeout=WAIT)
    called: list[str] = []
    pump.cancel_when_known(called.append)
    assert called == ["task-1"] and opener.stream.closed.is_set()
    pump.join(WAIT)
    assert pump.state is PumpState.STOPPED


def test_cancel_when_known_waits_for_the_task_id() -> None:
    opener = Opener()
    pump = started(opener)  # still opening: no task id yet
    called: list[str] = []
    done = threading.Event()
    pump.cancel_when_known(lambda task_id: (called.append(task_id), done.set()))
    assert pump.state is PumpState.SEEKING_TASK and not called
    opener.release.set()
    opener.stream.push(frame(text="before the task is named"), frame("task-7"))
    assert done.wait(WAIT) and called == ["task-7"]
    pump.join(WAIT)
    assert opener.stream.closed.is_set() and pump.state is PumpState.STOPPED
    with pytest.raises(queue.Empty):
        pump.get(timeout=0.05)  # an abandoned stream queues nothing


def test_cancel_when_known_with_a_full_queue_still_learns_the_task() -> None:
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    opener.stream.push(*[frame(text=str(i)) for i in range(6)])  # more than the queue holds
    deadline = time.monotonic() + WAIT
    while opener.stream._chunks.qsize() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the reader is blocked on the full queue with the 5th chunk
    assert opener.stream._chunks.qsize() == 1
    called: list[str] = []
    done = threading.Event()
    pump.cancel_when_known(lambda task_id: (called.append(task_id), done.set()))
    opener.stream.push(frame("task-9"))
    assert done.wait(WAIT) and called == ["task-9"]


def test_a_stream_that_ends_before_naming_its_task_cancels_nothing() -> None:
    opener = Opener()
    opener.release.set()
    pump = started(opener)
    called: list[str] = []
    pump.cancel_when_known(called.append)
    opener.stream.push(frame(text="no task id"))
    opener.stream.end()
    pump.join(WAIT)
    assert not pump.is_alive() and called == []


def test_stop_wins_over_a_pending_cancel_when_known() -> None:
    opener = Opener()
    pump = started(opener)
    called: list[str] = []
    pump.cancel_when_known(called.append)
    pump.stop()
    opener.release.set()
    opener.stream.push(frame("task-1"))
    pump.join(WAIT)
    assert called == [] and opener.stream.closed.is_set()
