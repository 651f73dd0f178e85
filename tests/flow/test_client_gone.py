"""A client that leaves is noticed at once (issue 20, item 1), over real sockets.

The built-in server owns the socket, so while a stream waits for its next event it asks
whether the client hung up (``agui.client_gone``) instead of waiting for a write to fail,
which with a silent kernel is a heartbeat (15 s) or two away. The kernel here is a scripted
kernel at full scale (``[SILENT 40]`` is forty seconds of silence), the heartbeat the
default 15 s: a thread freed within a second can only be the socket watch. Clients are raw
sockets, so that "the client left" is exactly a close (FIN) or a reset (RST) at a known time.
"""

from __future__ import annotations

import gc
import json
import select
import socket
import struct
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.test import EnvironBuilder

from agui_adapter.http.connection import CLIENT_GONE_KEY, Connection
from agui_adapter.run import detached
from agui_adapter.run import driver as run_driver
from agui_adapter.run.driver import WATCHED_TICK_SECONDS
from agui_adapter.run.pump import KernelPump, PumpState
from agui_adapter.scripted_kernel import ScriptedKernel
from agui_adapter.state import journal
from tests.support.agui_client import Client, LiveStream, joined, run_body
from tests.support.agui_stream import parse_sse
from tests.support.flow import cancelled_tasks, detached_runs, wait_for
from tests.support.servers import InProcessAdapter


@pytest.fixture
def make_watched(make_full_scale_adapter: Any) -> Any:
    return make_full_scale_adapter


class RawStream:
    """A request on a raw socket, read up to a marker, then closed (FIN) or reset (RST)."""

    def __init__(self, url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
        host, port = url.split("//")[1].rstrip("/").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        if body:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        self.raw = b""

    @classmethod
    def events(cls, url: str, body: dict[str, Any], after: int) -> RawStream:
        """A reader of the run on the events route, from the event after ``after``."""
        path = f"/threads/{body['threadId']}/runs/{body['runId']}/events"
        return cls(url, "GET", path, headers={"Last-Event-ID": str(after)})

    def read_until(self, marker: bytes, timeout: float = 30.0, count: int = 1) -> bytes:
        """Read until ``marker`` was seen ``count`` times."""
        deadline = time.monotonic() + timeout
        while self.raw.count(marker) < count:
            assert time.monotonic() < deadline, f"{marker!r} not seen in {self.raw[-300:]!r}"
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.raw += data
        return self.raw

    def session(self) -> dict[str, Any]:
        self.read_until(b"iac-code.session.v1")
        at = self.raw.index(b"iac-code.session.v1")
        while b"\n\n" not in self.raw[at:]:
            self.raw += self.sock.recv(65536)
        frame = self.raw[self.raw.rindex(b"id: ", 0, at) : self.raw.index(b"\n\n", at)]
        return dict(json.loads(frame.split(b"data: ", 1)[1])["value"])

    def leave(self, reset: bool = False) -> float:
        """Close the socket (or reset it); the moment it happened."""
        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
        return time.monotonic()


def run_request(adapter: InProcessAdapter, body: dict[str, Any]) -> RawStream:
    return RawStream(adapter.url, "POST", "/", json.dumps(body).encode())


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_new_turn_right_after_the_abort_succeeds_and_the_kernel_task_is_cancelled(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path, how: str
) -> None:
    adapter = make_watched()  # heartbeat 15 s, no grace period: the contract's disconnect
    client = adapter.client()
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    stream = run_request(adapter, body)
    task_id = stream.session()["taskId"]
    left = stream.leave(reset=how == "reset")
    # at once, as a user who pressed Stop and sent the next message: admitted, not THREAD_BUSY
    after = client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    admitted = time.monotonic() - left
    assert after.status == 200, after.error
    assert after.terminal["type"] == "RUN_FINISHED" and after.text() == "Hello from the scripted kernel."
    assert task_id in cancelled_tasks(full_scale_kernel)
    assert admitted < 5.0  # the kernel's first answer included; the heartbeat alone is 15 s
    print(f"\n[{how}] next turn answered {admitted:.3f}s after the abort")


def test_with_the_kernel_silent_the_thread_is_free_within_a_second_of_the_abort(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path
) -> None:
    adapter = make_watched()
    client = adapter.client()
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    stream = run_request(adapter, body)
    task_id = stream.session()["taskId"]  # the kernel named its task, then falls silent:
    left = stream.leave()  # the stream is waiting for the kernel, writing nothing
    wait_for(lambda: task_id in cancelled_tasks(full_scale_kernel), 5)
    cancelled = time.monotonic() - left
    # the thread is free: a new turn on another connection is admitted (not THREAD_BUSY)
    after = client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert after.status == 200 and after.terminal["type"] == "RUN_FINISHED"
    assert cancelled < 1.0, f"the kernel task was cancelled {cancelled:.3f}s after the abort"
    print(f"\nkernel task cancelled {cancelled:.3f}s after the abort (heartbeat 15 s)")
    scrape = client.session.get(adapter.url + "metrics", timeout=5).text
    assert "agui_sse_clients_disconnected_total 1" in scrape


def test_a_waiting_stream_is_woken_by_the_hang_up_not_by_ticks(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The built-in server watches the stream's socket and says when the client hangs up, so a
    # stream waiting for a silent kernel waits until its next heartbeat is due, not a tick:
    # with ticks of a minute, a hang-up is still noticed at once.
    monkeypatch.setattr(run_driver, "WATCHED_TICK_SECONDS", 60.0)
    waits: list[float] = []
    get = KernelPump.get

    def counted(pump: KernelPump, timeout: float) -> list[Any]:
        waits.append(timeout)
        return get(pump, timeout)

    monkeypatch.setattr(KernelPump, "get", counted)
    adapter = make_watched()  # heartbeat 15 s
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    stream = run_request(adapter, body)
    task_id = stream.session()["taskId"]
    wait_for(lambda: any(timeout > 10 for timeout in waits), 10)  # waiting for the kernel, up to the heartbeat
    left = stream.leave()
    wait_for(lambda: task_id in cancelled_tasks(full_scale_kernel), 10)
    cancelled = time.monotonic() - left
    assert cancelled < 5.0, f"the kernel task was cancelled {cancelled:.3f}s after the abort"
    print(f"\nkernel task cancelled {cancelled:.3f}s after the abort, waits {[round(w, 2) for w in waits]}")


def test_with_a_grace_period_it_starts_when_the_client_hangs_up(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path
) -> None:
    adapter = make_watched(disconnect_grace_seconds=1)  # heartbeat 15 s
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    stream = run_request(adapter, body)
    task_id = stream.session()["taskId"]
    left = stream.leave()
    wait_for(lambda: task_id in cancelled_tasks(full_scale_kernel), 10)
    waited = time.monotonic() - left
    assert 0.9 <= waited < 3.0, waited  # the grace period, from the hang-up, not from a heartbeat
    print(f"\ngrace 1 s: kernel task cancelled {waited:.3f}s after the abort")


def test_bytes_pipelined_behind_the_request_are_not_a_hang_up(make_watched: Any, workspace: Path) -> None:
    adapter = make_watched(heartbeat_seconds=0.3)
    body = json.dumps(run_body("[SILENT 2] [TOOL] hi", cwd=str(workspace))).encode()
    host = adapter.url.split("//")[1].rstrip("/")
    request = (
        f"POST / HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    health = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    stream = RawStream.__new__(RawStream)
    stream.sock = socket.create_connection(("127.0.0.1", int(host.split(":")[1])), timeout=30)
    stream.raw = b""
    stream.sock.sendall(request + health)  # the next request waits in the socket for seconds
    stream.read_until(b'"status":"ok"')  # the run went to its end, then /health was answered
    head, _, rest = stream.raw.partition(b"\r\n\r\n")
    assert b"200 OK" in head.split(b"\r\n")[0]
    sse = rest[: rest.index(b"\r\n0\r\n\r\n")]
    events = parse_sse(dechunk(sse))
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert b": heartbeat" in sse  # it waited, several ticks, with the bytes there
    stream.leave()


def test_a_reader_is_woken_by_the_runs_appends_not_by_polls(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader of a run this process writes waits for the journal's bell, rung at each append,
    # not for polls: with polls of a minute, it gets the deltas as they come (one a second here).
    monkeypatch.setattr(journal, "POLL_SECONDS", 60.0)
    adapter = make_watched()  # heartbeat 15 s
    body = run_body("[SLOW] count", cwd=str(workspace))
    own = LiveStream(adapter.client(), body)
    seen = own.read_events(3)
    reader = RawStream.events(adapter.url, body, seen[-1][0])
    reader.read_until(b"TEXT_MESSAGE_CONTENT", count=3)  # polled once a minute: one read of them at most
    reader.leave()
    own.close()


def test_a_reader_of_a_silent_run_is_told_of_its_hang_up_not_asked_on_ticks(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server watches a reader's socket as it watches a run's own: with the run silent
    # (no event, no write to fail before the 15 s heartbeat) and ticks of a minute, the
    # reader's hang-up is still seen at once.
    monkeypatch.setattr(journal, "CLIENT_CHECK_SECONDS", 60.0)
    adapter = make_watched()  # heartbeat 15 s
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    own = LiveStream(adapter.client(), body)
    seen = own.read_events(2)
    reader = RawStream.events(adapter.url, body, seen[-1][0])
    reader.read_until(b"200 OK")
    readers = adapter.app.engine.journals.readers
    wait_for(lambda: readers(body["threadId"], body["runId"]) == 2, 5)
    left = reader.leave()
    wait_for(lambda: readers(body["threadId"], body["runId"]) == 1, 10)
    print(f"\nthe reader's hang-up seen {time.monotonic() - left:.3f}s later")
    own.close()


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        out, data = out + data[:n], data[n + 2 :]
    return out


def test_a_reader_that_hangs_up_is_noticed_and_the_last_one_out_cancels(
    make_watched: Any, full_scale_kernel: ScriptedKernel, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last reader leaving wakes the detached run (the journal's bell), which looks at
    # once: with a detached run's looks a minute apart, its kernel task is still cancelled.
    monkeypatch.setattr(detached, "DETACHED_TICK_SECONDS", 60.0)
    adapter = make_watched()  # no grace period: the run ends when its last reader leaves
    client = adapter.client()
    body = run_body("[SILENT 40] think", cwd=str(workspace))
    own = LiveStream(client, body)
    task_id = own.session()["taskId"]
    seen = own.read_events(2)
    reader = RawStream.events(adapter.url, body, seen[-1][0])
    reader.read_until(b"200 OK")
    wait_for(lambda: adapter.app.engine.journals.readers(body["threadId"], body["runId"]) == 2, 5)
    own.close()  # the run's own client leaves: the reader still follows the run
    wait_for(lambda: adapter.app.engine.journals.readers(body["threadId"], body["runId"]) == 1, 5)
    wait_for(lambda: detached_runs(adapter.url) == 1, 10)  # it went on without its client, not cancelled
    assert task_id not in cancelled_tasks(full_scale_kernel)
    busy = client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert busy.error is not None and busy.error["code"] == "THREAD_BUSY"
    left = reader.leave()  # the last reader leaves while the kernel is silent
    wait_for(lambda: task_id in cancelled_tasks(full_scale_kernel), 5)
    cancelled = time.monotonic() - left
    assert cancelled < 1.5
    print(f"\nlast reader gone: kernel task cancelled {cancelled:.3f}s later")
    rest = Client(adapter.url).events(body["threadId"], body["runId"], seen[-1][0]).rest()
    events = joined(seen, rest)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(the server's side, the client's side) of a loopback TCP connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return server, client


@pytest.mark.parametrize("how", ["close", "reset", "bytes", "bytes-then-close", "nothing"])
def test_connection_hung_up_tells_a_close_and_a_reset_from_bytes(how: str) -> None:
    if how == "bytes-then-close" and not hasattr(select, "POLLRDHUP"):
        pytest.skip("only Linux says the peer closed while unread bytes wait")
    server, client = tcp_pair()
    conn = Connection(server, ("127.0.0.1", 0), reserve=False)
    if how.startswith("bytes"):
        client.sendall(b"GET /health HTTP/1.1\r\n\r\n")  # pipelined behind the request
    if how == "reset":
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if how in ("close", "reset", "bytes-then-close"):
        client.close()
    expected = how in ("close", "reset", "bytes-then-close")
    assert wait_for(lambda: conn.hung_up() is expected or None, 2) is True
    assert conn.aborted is expected
    if how == "bytes":
        assert server.recv(100).startswith(b"GET /health")  # nothing was consumed by asking
    client.close()
    server.close()


@pytest.mark.parametrize("grace", [0.0, 10.0])
def test_a_hang_up_while_the_run_writes_its_end_still_journals_the_terminal_event(
    make_adapter: Any, workspace: Path, grace: float
) -> None:
    # The machine decides a run's end as one batch: the last deltas, the write that records
    # the end, then the terminal event. The last deltas go to the client before that write;
    # a client that hangs up right then (the stream asks before its next chunk) must not cut
    # the batch short: the terminal event still reaches the journal (a reattach gets it, not
    # 204 forever) and the end is recorded. Driven through the WSGI app, so that the hang-up
    # falls exactly between the two chunks.
    adapter = make_adapter(disconnect_grace_seconds=grace)
    body = run_body("[SLOW] go", cwd=str(workspace))
    environ = EnvironBuilder(method="POST", path="/", json=body, headers={"Accept": "text/event-stream"}).get_environ()
    gone = {"now": False}
    environ[CLIENT_GONE_KEY] = lambda: gone["now"]
    status: list[str] = []
    response = adapter.app(environ, lambda s, h, e=None: status.append(s))
    stream = iter(response)
    written = b""
    while b"iac-code.session.v1" not in written:  # the kernel's stream is open
        written += next(stream)
    # while the stream is not asked for more, the kernel's whole answer queues up: the next
    # wake-up takes it at once, its last deltas and its end
    driver = adapter.app.engine.live_driver(body["threadId"])
    wait_for(lambda: driver._pump is not None and driver._pump.state is PumpState.DONE, 30)
    written += next(stream)
    assert b"eight." in written and b"RUN_FINISHED" not in written  # the end follows the write
    gone["now"] = True
    time.sleep(WATCHED_TICK_SECONDS)  # the stream asks at most once a tick: now it asks
    assert next(stream, None) is None  # the stream notices the hang-up
    response.close()
    ids = [int(line[4:]) for line in written.split(b"\n") if line.startswith(b"id: ")]
    rest = Client(adapter.url).events(body["threadId"], body["runId"], ids[-1]).rest()
    assert [event["type"] for _, event in rest][-1] == "RUN_FINISHED"
    thread = requests.get(adapter.url + f"threads/{body['threadId']}", timeout=10).json()
    assert thread["activeRun"] is None
    assert [(run["runId"], run["outcome"]) for run in thread["runs"]] == [(body["runId"], "success")]


def test_a_watched_run_is_freed_without_the_cyclic_collector(
    make_adapter: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's watch holds the run's wake-up while the response lasts; once the run is
    # over, nothing may keep its driver (its journal, its frames) alive: the collector's full
    # passes are rare here (``ops.collector``), and a cycle would hold every ended run till then.
    drivers: list[weakref.ref[run_driver.RunDriver]] = []
    init = run_driver.RunDriver.__init__

    def recorded(driver: run_driver.RunDriver, *args: Any, **kwargs: Any) -> None:
        init(driver, *args, **kwargs)
        drivers.append(weakref.ref(driver))

    monkeypatch.setattr(run_driver.RunDriver, "__init__", recorded)
    adapter = make_adapter()
    client = adapter.client()
    gc.disable()
    try:
        for _ in range(3):
            result = client.run(run_body("hello", cwd=str(workspace)))
            assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"
        assert len(drivers) == 3
        wait_for(lambda: all(ref() is None for ref in drivers), 10)
    finally:
        gc.enable()


def test_a_holder_that_gives_the_thread_back_while_it_is_looked_for_is_not_thread_busy(
    adapter: InProcessAdapter, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race a Stop then a new message can meet: the new run's first try for the thread's
    # lock fails, and the run holding it gives it back before the new run looks for holders
    # whose client left; it finds none. The thread is free then, and the new run takes it.
    client = adapter.client()
    first = client.run(run_body("hello", cwd=str(workspace)))
    assert first.status == 200
    thread_id = first.events[0]["threadId"]
    engine = adapter.app.engine
    held = engine.store.try_lock_run(thread_id)  # a run holds the thread...
    assert held is not None
    holders = engine.live.holders

    def released_meanwhile(tid: str) -> list[Any]:
        held.release()  # ...and gives it back just before the holders are listed
        return holders(tid)

    monkeypatch.setattr(engine.live, "holders", released_meanwhile)
    after = client.run(run_body("next", thread_id=thread_id, cwd=str(workspace)))
    assert after.status == 200, after.error
    assert after.terminal["type"] == "RUN_FINISHED"
