"""One smoke scenario under three real WSGI servers, each a separate process.

The adapter is served as ``agui_adapter.wsgi:application`` (or ``python run.py``),
configured only through ``IAC_CODE_AGUI_*`` environment variables and pointed at the
in-process scripted kernel. Per server: a turn streams as it is produced (not
buffered to the end), heartbeats flow while the kernel is silent, and a client that
drops the socket gets its kernel task cancelled (see the conformance notes on SSE
under WSGI servers: flushing, and a disconnect is only noticed when a write fails).

Reattach (issue 13) under gunicorn with four worker processes and under waitress: a client
that dropped a run comes back with ``Last-Event-ID`` (``GET .../events`` or ``POST /``) and
gets exactly the rest of the run. Under gunicorn the test reattaches, each time on a new
connection, until one reattach is served by another worker than the one running the run:
the run's worker is the process holding the lock on the run's journal directory (read from
``/proc/locks``, the kernel's own record, while the run is live); the reattach's worker is
the ``pid`` of the JSON log line "run ... reattached after event K", which the serving
worker writes before its response starts.

Adoption (issue 22) under gunicorn ``-w 2``: a worker killed mid-run (``kill -9``) or recycled
(``--max-requests 1``) does not cost the run: another worker adopts it; a graceful stop of gunicorn
(SIGTERM, or a HUP reload) hands the workers' runs over to the next workers (the last sections).

Run with ``pytest -m wsgi_servers tests/compat/test_wsgi_servers.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel.turn_scripts import SLOW_PIECES
from agui_adapter.state.store import thread_key
from tests.support.agui_client import Client, LiveStream, joined, run_body
from tests.support.agui_stream import check_stream, parse_sse
from tests.support.flow import KERNEL_TOKEN
from tests.support.kernel_rpc import rpc
from tests.support.ports import free_port
from tests.support.processes import alive, children
from tests.support.secrets import STATE_DIRS
from tests.support.servers import ROOT

pytestmark = pytest.mark.wsgi_servers

HEARTBEAT = 0.3
APP = "agui_adapter.wsgi:application"
SERVERS = ("werkzeug", "gunicorn", "waitress")


def _command(kind: str, port: int, workers: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
    if kind == "werkzeug":
        return [sys.executable, str(ROOT / "run.py"), "--port", "0"]
    if kind == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "8", "-w", str(workers),
            "--graceful-timeout", "5", *extra, "-b", f"127.0.0.1:{port}", APP,
        ]  # fmt: skip
    return [sys.executable, "-m", "waitress", f"--listen=127.0.0.1:{port}", "--threads=8", APP]


@dataclass
class Server:
    kind: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    workspace: Path
    url: str = ""
    workers: int = 1  # gunicorn's -w: ready only once all of them are up

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        session = requests.Session()
        session.trust_env = False
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log()}")
            if not self.url:  # run.py --port 0 prints where it listens
                match = re.search(r"listening on (http://\S+/)", self.log())
                if match:
                    self.url = match.group(1)
            if self.url and len(self.worker_pids()) == self.workers:
                try:
                    if session.get(self.url + "health", timeout=1).status_code == 200:
                        return
                except requests.RequestException:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.kind} did not become ready in {timeout} s:\n{self.log()}")

    def worker_pids(self) -> set[int]:
        """The processes serving requests: gunicorn's live workers, else the server itself."""
        if self.kind != "gunicorn":
            return {self.proc.pid}
        return {pid for pid in children(self.proc.pid) if alive(pid)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module", params=SERVERS)
def server(request: Any, tmp_path_factory: Any, scripted_kernel: Any) -> Iterator[Server]:
    srv = _serve(request.param, tmp_path_factory, scripted_kernel)
    yield srv
    srv.stop()


def _serve(
    kind: str,
    tmp_path_factory: Any,
    scripted_kernel: Any,
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    base: Path | None = None,
) -> Server:
    """``kind`` serving the adapter on a fresh state directory (or ``base``'s again), ready
    (``workers``: gunicorn's ``-w``)."""
    if kind != "werkzeug" and importlib.util.find_spec(kind) is None:
        message = f"{kind} is not installed (pip install -e .[test])"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    again = base is not None
    if base is None:
        base = tmp_path_factory.mktemp(f"wsgi-{kind}")
        (base / "state").mkdir()
        (base / "ws").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    env.update(
        {
            "IAC_CODE_AGUI_A2A_URL": scripted_kernel.url,
            "IAC_CODE_AGUI_A2A_TOKEN": KERNEL_TOKEN,
            "IAC_CODE_AGUI_STATE_DIR": str(base / "state"),
            "IAC_CODE_AGUI_ALLOWED_CWDS": str(base),
            "IAC_CODE_AGUI_HEARTBEAT_SECONDS": str(HEARTBEAT),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    STATE_DIRS.append(base / "state")
    port = free_port()
    log_path = base / ("server-again.log" if again else "server.log")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            _command(kind, port, workers, extra_args), cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    url = "" if kind == "werkzeug" else f"http://127.0.0.1:{port}/"
    srv = Server(kind, proc, log_path, base / "ws", url, workers if kind == "gunicorn" else 1)
    try:
        srv.wait_ready()
    except RuntimeError:
        srv.stop()
        raise
    return srv


def _post(server: Server, body: dict[str, Any]) -> requests.Response:
    session = requests.Session()
    session.trust_env = False
    return session.post(server.url, json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30)


def _timed_events(response: requests.Response, started: float) -> tuple[bytes, list[tuple[float, int, bytes]]]:
    """The raw body, and (arrival time, read number, block) for every SSE block."""
    raw = b""
    pending = b""
    blocks: list[tuple[float, int, bytes]] = []
    for read, chunk in enumerate(response.iter_content(None)):
        now = time.monotonic() - started
        raw += chunk
        pending += chunk
        *complete, pending = pending.split(b"\n\n")
        blocks.extend((now, read, block) for block in complete if block.strip())
    return raw, blocks


def test_turn_streams_as_produced(server: Server) -> None:
    body = run_body("[SLOW]", cwd=str(server.workspace))
    started = time.monotonic()
    with _post(server, body) as response:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
        assert "Content-Length" not in response.headers
        assert response.headers.get("Transfer-Encoding") == "chunked"
        raw, blocks = _timed_events(response, started)
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_FINISHED"
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == (
        "Slowly counting: one, two, three, four, five, six, seven, eight."
    )
    content = [(t, read) for t, read, block in blocks if b'"TEXT_MESSAGE_CONTENT"' in block]
    assert len(content) == 10, blocks
    times = [t for t, _ in content]
    # ten deltas 0.05 s apart: spread over ~0.45 s, not all delivered at the end in one read
    assert times[-1] - times[0] >= 0.25, times
    assert len({read for _, read in content}) >= 5, content
    finished = next(t for t, _, block in blocks if b'"RUN_FINISHED"' in block)
    assert finished - times[0] >= 0.25, (times, finished)


def test_heartbeats_while_the_kernel_is_silent(server: Server) -> None:
    body = run_body("[SILENT 40]", cwd=str(server.workspace))
    started = time.monotonic()
    with _post(server, body) as response:
        assert response.status_code == 200, response.text
        raw, blocks = _timed_events(response, started)
    stamps = [t for t, _, block in blocks if block.strip() == b": heartbeat"]
    assert len(stamps) >= 3, (stamps, server.log())
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(HEARTBEAT * 0.6 < g < HEARTBEAT * 3 for g in gaps), gaps
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_FINISHED"


def test_disconnect_cancels_the_kernel_task(server: Server, scripted_kernel: Any) -> None:
    # 5 s of kernel silence: only heartbeats are written, so only they can reveal the
    # disconnect (waitress needs up to three writes, gunicorn two, werkzeug one).
    body = run_body("[SILENT 100] [SLOW]", cwd=str(server.workspace))
    host, port = server.url.split("//")[1].rstrip("/").rsplit(":", 1)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        data = b""
        while b"iac-code.session.v1" not in data or b'"taskId":"' not in data.split(b"iac-code.session.v1")[1]:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    finally:
        sock.close()
    closed = time.monotonic()
    task_id = data.split(b"iac-code.session.v1")[1].split(b'"taskId":"')[1].split(b'"')[0].decode()
    deadline = closed + HEARTBEAT * 6 + 1.0  # three failed writes' worth, plus slack
    while time.monotonic() < deadline:
        if any(
            r["method"] == "CancelTask" and r["params"].get("id") == task_id for r in list(scripted_kernel.requests)
        ):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"{server.kind}: no CancelTask for {task_id} after the disconnect\n{server.log()}")
    task = rpc(scripted_kernel, "GetTask", {"id": task_id}, rid=1).json()
    assert task["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    # the conversation thread is free again
    with _post(server, run_body(thread_id=body["threadId"], cwd=str(server.workspace))) as nxt:
        assert nxt.status_code == 200, nxt.text
        check_stream(parse_sse(nxt.content))


# ============================================================================ reattach (issue 13)
REATTACH_SERVERS = {"gunicorn-w4": ("gunicorn", 4), "waitress": ("waitress", 1)}


@pytest.fixture(scope="module", params=sorted(REATTACH_SERVERS))
def reattach_server(request: Any, tmp_path_factory: Any, scripted_kernel: Any) -> Iterator[Server]:
    kind, workers = REATTACH_SERVERS[request.param]
    srv = _serve(
        kind,
        tmp_path_factory,
        scripted_kernel,
        workers,
        {"IAC_CODE_AGUI_DISCONNECT_GRACE_SECONDS": "30", "IAC_CODE_AGUI_LOG_FORMAT": "json"},
    )
    yield srv
    srv.stop()


def _lock_holder(directory: Path) -> int:
    """The pid holding the flock on ``directory`` (the run's journal: its writer), per /proc/locks."""
    stat = os.stat(directory)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
            return int(fields[4])
    raise AssertionError(f"nobody holds the lock of {directory}")


def _reattach_pids(server: Server, run_id: str) -> list[int]:
    """The pids that logged a reattach of ``run_id``, oldest first (JSON log lines)."""
    pids = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if (
                record["message"].startswith(f"run {run_id} on thread ")
                and "reattached after event" in record["message"]
            ):
                pids.append(int(record["pid"]))
    return pids


@pytest.mark.parametrize("route", ["get", "post"])
def test_reattach_after_a_disconnect_gets_exactly_the_rest_even_on_another_worker(
    reattach_server: Server, scripted_kernel: Any, route: str
) -> None:
    server = reattach_server
    body = run_body("[SILENT 100] [TOOL] [SLOW] go", cwd=str(server.workspace))  # 5 s of silence first
    first = LiveStream(Client(server.url), body)
    task_id = first.session()["taskId"]
    seen = first.read_events(2)
    state = server.log_path.parent / "state"
    writer = _lock_holder(state / "journal" / thread_key(body["threadId"]) / thread_key(body["runId"]))
    first.close()
    workers = server.worker_pids()
    assert writer in workers and len(workers) == server.workers, (writer, workers, server.log())
    pieces = [seen]
    for attempt in range(1, 41):
        client = Client(server.url)  # a new connection: any worker may accept it
        again = (
            client.reattach(body, seen[-1][0])
            if route == "post"
            else client.events(body["threadId"], body["runId"], seen[-1][0])
        )
        assert again.status == 200, again.response.text
        logged = _reattach_pids(server, body["runId"])
        reader = logged[-1]
        assert reader in workers and len(logged) == attempt, (attempt, logged, workers, server.log())
        if reader != writer or server.kind != "gunicorn":
            break
        pieces.append(again.read_events(0))
        again.close()
    else:
        raise AssertionError(f"40 reattaches all reached the run's own worker {writer}")
    rest = again.rest()
    try:
        events = joined(*pieces, rest)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nattempts {attempt}, writer {writer}, reader {reader}\n{server.log()}") from None
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, server.log()
    assert [e["type"] for e in events].count("TOOL_CALL_START") == 1
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT").endswith(
        "Slowly counting: one, two, three, four, five, six, seven, eight."
    )
    assert task_id not in {r["params"].get("id") for r in list(scripted_kernel.requests) if r["method"] == "CancelTask"}
    # after the end, from whichever worker: the whole run from its first event
    assert [e for _, e in Client(server.url).events(body["threadId"], body["runId"]).rest()] == events


# ============================================================================ several readers (issue 20)
@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: Any, scripted_kernel: Any) -> Iterator[Server]:
    """gunicorn ``-w 2``, no grace period (the default), JSON logs (the readers' pids)."""
    srv = _serve("gunicorn", tmp_path_factory, scripted_kernel, 2, {"IAC_CODE_AGUI_LOG_FORMAT": "json"})
    yield srv
    srv.stop()


def test_readers_on_both_workers_follow_one_run_after_its_own_client_left(
    two_workers: Server, scripted_kernel: Any
) -> None:
    server = two_workers
    body = run_body("[SILENT 60] [TOOL] [SLOW] go", cwd=str(server.workspace))  # 3 s of silence first
    own = LiveStream(Client(server.url), body)
    task_id = own.session()["taskId"]
    seen = own.read_events(2)
    state = server.log_path.parent / "state"
    writer = _lock_holder(state / "journal" / thread_key(body["threadId"]) / thread_key(body["runId"]))
    readers: list[Any] = []
    for attempt in range(1, 21):  # new connections until a reader is served by the other worker
        readers.append(Client(server.url).events(body["threadId"], body["runId"], seen[-1][0] if attempt % 2 else 0))
        assert readers[-1].status == 200, readers[-1].response.text
        if any(pid != writer for pid in _reattach_pids(server, body["runId"])):
            break
    else:
        raise AssertionError(f"20 readers all reached the run's own worker {writer}")
    own.close()  # no grace period, but readers (one in the other worker) still follow the run
    for number, reader in enumerate(readers, 1):
        pieces = reader.rest()
        events = joined(seen, pieces) if number % 2 else joined(pieces)
        assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, server.log()
    assert task_id not in {r["params"].get("id") for r in list(scripted_kernel.requests) if r["method"] == "CancelTask"}


# ============================================================================ adoption (issue 22)
# gunicorn ``-w 2``: the worker running a run (the holder of its journal's lock) is killed with
# ``kill -9`` (its stream is cut), or recycled by ``--max-requests 1`` (a gthread worker lets its
# open streams end before it exits: observed, the run then simply ends there). A cut client
# reattaches with ``Last-Event-ID``; whichever worker serves it (the other one, or the one
# gunicorn started in place of the dead one) has adopted the run (``agui_adapter/run/adoption.py``)
# and follows it to its end: one valid run with the kernel's whole text.
def _adoption_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def _come_back_until_the_end(
    url: str, body: dict[str, Any], after: int, timeout: float = 30.0
) -> list[tuple[int, dict[str, Any]]]:
    """Reattach until the run ends: a stream cut by a dying worker is reattached again."""
    pieces: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stream = Client(url).events(body["threadId"], body["runId"], after)
        if stream.status == 204:
            return pieces
        assert stream.status == 200, stream.response.text
        try:
            got = stream.rest()
        except Exception:  # noqa: BLE001 - the worker died under the stream: come back again
            got = []
        pieces += got
        if pieces and pieces[-1][1]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
            return pieces
        after = pieces[-1][0] if pieces else after
        time.sleep(0.2)
    raise AssertionError("the run did not end")


@pytest.mark.parametrize("how", ["kill-9", "max-requests-1"])
def test_a_worker_that_dies_mid_run_is_replaced_by_an_adopter(
    tmp_path_factory: Any, scripted_kernel: Any, how: str
) -> None:
    extra = ("--max-requests", "1") if how == "max-requests-1" else ()
    server = _serve("gunicorn", tmp_path_factory, scripted_kernel, 2, {"IAC_CODE_AGUI_LOG_FORMAT": "json"}, extra)
    try:
        body = run_body("[SILENT 200] [SLOW] go", cwd=str(server.workspace))  # 10 s of silence, then text
        own = LiveStream(Client(server.url), body)
        own.session()
        seen = own.read_events(2)
        state = server.log_path.parent / "state"
        directory = state / "journal" / thread_key(body["threadId"]) / thread_key(body["runId"])
        writer = _lock_holder(directory)
        if how == "kill-9":
            os.kill(writer, signal.SIGKILL)
        # max-requests 1: the worker stops by itself after its graceful timeout (5 s)
        try:
            seen += own.rest()  # cut: no terminal event
        except Exception:  # noqa: BLE001 - the connection may be reset
            pass
        cut = seen[-1][1]["type"] not in ("RUN_FINISHED", "RUN_ERROR")
        # kill -9 cuts the stream; a recycled gthread worker lets its open streams end first
        assert cut or how == "max-requests-1"
        rest = _come_back_until_the_end(server.url, body, seen[-1][0], timeout=60) if cut else []
        events = joined(seen, rest)
        assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, server.log()
        assert _adoption_text(events) == "".join(SLOW_PIECES)
        assert not cut or "adopted after event" in server.log_path.read_text(errors="replace")
        # either way the thread is free and the next turn runs, on whichever worker
        nxt = Client(server.url).run(run_body("next", thread_id=body["threadId"], cwd=str(server.workspace)))
        assert nxt.terminal["type"] == "RUN_FINISHED"
    finally:
        server.stop()


def _pids_logging(servers: list[Server], prefix: str) -> list[int]:
    """The pids whose JSON log lines start with ``prefix``, oldest first."""
    pids = []
    for server in servers:
        for line in server.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line)["message"].startswith(prefix):
                pids.append(int(json.loads(line)["pid"]))
    return pids


# A graceful stop of the workers (SIGTERM to gunicorn; HUP: new workers, the old ones get
# SIGTERM) hands their open runs over (``agui_adapter.wsgi.install_shutdown_hook``, installed when
# the worker imports the application; ``deploy/gunicorn.conf.py`` installs it again from
# ``post_worker_init``): the stream closes without a terminal event within the shutdown grace,
# the kernel task goes on, and the client's reattach reaches a worker that adopted the run.
@pytest.mark.parametrize("how", ["sigterm", "hup-with-deploy-config"])
def test_a_graceful_stop_of_gunicorn_hands_the_runs_over_to_the_next_workers(
    tmp_path_factory: Any, scripted_kernel: Any, how: str
) -> None:
    env = {"IAC_CODE_AGUI_LOG_FORMAT": "json", "IAC_CODE_AGUI_SHUTDOWN_GRACE_SECONDS": "0.5"}
    extra = ("-c", str(ROOT / "deploy" / "gunicorn.conf.py")) if how.startswith("hup") else ()
    server = _serve("gunicorn", tmp_path_factory, scripted_kernel, 2, env, extra)
    servers = [server]
    try:
        body = run_body("[SILENT 100] [SLOW] go", cwd=str(server.workspace))  # 5 s of silence, then text
        own = LiveStream(Client(server.url), body)
        task_id = own.session()["taskId"]
        seen = own.read_events(2)
        state = server.log_path.parent / "state"
        writer = _lock_holder(state / "journal" / thread_key(body["threadId"]) / thread_key(body["runId"]))
        stopped = time.monotonic()
        server.proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGHUP)
        seen += own.rest()  # closed by the worker, not cut: no terminal event
        closed_after = time.monotonic() - stopped
        assert seen[-1][1]["type"] not in ("RUN_FINISHED", "RUN_ERROR"), seen[-1]
        assert closed_after < 4, closed_after  # within the grace (0.5 s), not gunicorn's graceful timeout (5 s)
        if how == "sigterm":
            assert server.proc.wait(15) == 0, server.log()
            server = _serve("gunicorn", tmp_path_factory, scripted_kernel, 2, env, extra, base=server.log_path.parent)
            servers.append(server)
        rest = _come_back_until_the_end(server.url, body, seen[-1][0], timeout=60)
        events = joined(seen, rest)
        assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, server.log()
        assert _adoption_text(events) == "".join(SLOW_PIECES)
        handed = _pids_logging(servers, f"run {body['runId']}: handed over")
        adopted = _pids_logging(servers, f"run {body['runId']} on thread {body['threadId']} adopted after event")
        assert handed == [writer], handed  # the stopped worker handed it over ...
        assert len(adopted) == 1 and adopted[0] != writer, adopted  # ... and another one adopted it
        cancelled = {r["params"].get("id") for r in list(scripted_kernel.requests) if r["method"] == "CancelTask"}
        assert task_id not in cancelled
    finally:
        for srv in servers:
            srv.stop()
