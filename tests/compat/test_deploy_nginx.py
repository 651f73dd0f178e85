"""The nginx recipes of ``deploy/`` proven with Debian's real nginx on loopback (marker ``nginx``).

``deploy/nginx-tls.conf`` in front of one ``python run.py``: TLS with a certificate made by
``openssl`` for the test, the first delta of a ``[SLOW]`` run arrives long before the run ends,
heartbeats of a ``[SILENT n]`` run pass promptly and keep the stream open through nginx's read
timeout, a client that goes away still cancels the kernel task, ``X-Request-ID`` flows
through, and nginx's gzip does not touch the event stream. Over HTTP/2 (``curl --http2``) the
stream is just as unbuffered; ``/metrics`` answers only an allowed address (a JSON 403 from
127.0.0.2); an upstream that took the request and never answered is 504 ``GATEWAY_TIMEOUT``,
one refusing or not accepting connections 503 ``A2A_UNAVAILABLE``.

``deploy/nginx-sticky-threads.conf`` in front of two adapter+kernel pairs (each adapter with
its own state directory and its own scripted kernel, whose request log shows which pair a
request reached): every run, Resume and cancel of a thread reaches the pair its
``X-AGUI-Thread-Id`` hashes to, and when a pair is down its threads get the recipe's 503
``A2A_UNAVAILABLE`` while the other pair's threads keep working; a thread-bound request without
the header is refused by nginx (400, JSON) instead of reaching some pair, and ``X-Request-ID``
flows through as in the TLS recipe.

Without nginx the tests fail under ``CI=true`` and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.scripted_kernel import ScriptedKernel
from agui_adapter.state.store import thread_key
from tests.support.agui_client import Client, resume, run_body, session_value
from tests.support.agui_stream import RECORDER, check_stream, parse_sse
from tests.support.flow import KERNEL_TOKEN, kernel_calls
from tests.support.nginx import Nginx, render_recipe, require_nginx, self_signed_cert
from tests.support.ports import free_port
from tests.support.secrets import ADAPTER_LOGS, STATE_DIRS
from tests.support.servers import AdapterProcess

pytestmark = pytest.mark.nginx

#: ``[SLOW]`` waits 1 s before each of its 10 deltas and ``[SILENT n]`` n s, times this scale.
DELAY_SCALE = 0.3
HEARTBEAT = 0.2
#: The recipe's read timeout shrunk for the test: still longer than the heartbeat, much shorter
#: than the silences below, so only heartbeats can keep those streams open.
READ_TIMEOUT = "1s"


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def _start_adapter(state_dir: Path, allowed: Path, kernel_url: str, *extra: str) -> AdapterProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("IAC_CODE_AGUI_")}
    environ.update(
        {"IAC_CODE_AGUI_A2A_TOKEN": KERNEL_TOKEN, "IAC_CODE_AGUI_ALLOWED_CWDS": str(allowed), "PYTHONUNBUFFERED": "1"}
    )
    args = ["--host", "127.0.0.1", "--port", "0", "--state-dir", str(state_dir), "--a2a-url", kernel_url, *extra]
    process = AdapterProcess(args, environ).start()
    STATE_DIRS.append(state_dir)
    ADAPTER_LOGS.append(process)
    return process


def _tls_client(url: str, cert: Path) -> Client:
    client = Client(url)
    client.session.verify = str(cert)
    return client


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    return require_nginx()


@pytest.fixture(scope="module")
def slow_kernel() -> Iterator[ScriptedKernel]:
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=DELAY_SCALE)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.fixture(scope="module")
def proxied(
    nginx_binary: str, slow_kernel: ScriptedKernel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One adapter (heartbeat 0.2 s) behind ``deploy/nginx-tls.conf``, over TLS."""
    root = tmp_path_factory.mktemp("nginx-tls")
    workspace = root / "ws"
    workspace.mkdir()
    adapter = _start_adapter(root / "state", root, slow_kernel.url, "--heartbeat-seconds", str(HEARTBEAT))
    cert, key = self_signed_cert(root)
    port = free_port()
    site = render_recipe(
        "nginx-tls.conf",
        {
            "server 127.0.0.1:8000;": f"server 127.0.0.1:{_port(adapter.url)};",
            "listen 443 ssl http2;": f"listen 127.0.0.1:{port} ssl http2;",
            "/etc/nginx/tls/agui-adapter.crt": str(cert),
            "/etc/nginx/tls/agui-adapter.key": str(key),
            "proxy_read_timeout 120s;": f"proxy_read_timeout {READ_TIMEOUT};",
        },
    )
    nginx = Nginx(nginx_binary, root / "nginx", site, port).start()
    try:
        yield {"url": f"https://127.0.0.1:{port}/", "cert": cert, "adapter": adapter, "workspace": workspace}
    finally:
        nginx.stop()
        adapter.stop()


def _timed_stream(proxied: dict[str, Any], body: dict[str, Any]) -> tuple[requests.Response, list[tuple[float, bytes]]]:
    """POST a run through nginx; every chunk as it arrives, with its arrival time."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(proxied["cert"])
    start = time.monotonic()
    chunks: list[tuple[float, bytes]] = []
    with session.post(
        proxied["url"], json=body, headers={"Accept": "text/event-stream"}, stream=True, timeout=30
    ) as response:
        for chunk in response.raw.stream(1024, decode_content=False):  # the bytes nginx sent
            chunks.append((time.monotonic() - start, chunk))
    raw = b"".join(c for _, c in chunks)
    events = parse_sse(raw)
    check_stream(events)
    RECORDER.record(body["threadId"], raw)
    return response, chunks


def _first_arrival(chunks: list[tuple[float, bytes]], marker: bytes) -> float:
    seen = b""
    for at, chunk in chunks:
        seen += chunk
        if marker in seen:
            return at
    raise AssertionError(f"{marker!r} never arrived")


def test_the_first_delta_arrives_before_the_run_ends(proxied: dict[str, Any]) -> None:
    body = run_body("[SLOW]", cwd=str(proxied["workspace"]))
    response, chunks = _timed_stream(proxied, body)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    # the client asked for gzip (requests does) and nginx gzips text/event-stream globally in
    # this test's nginx.conf: the recipe's location switches it off for the stream
    assert "Content-Encoding" not in response.headers
    first_delta = _first_arrival(chunks, b'"TEXT_MESSAGE_CONTENT"')
    finished = _first_arrival(chunks, b'"RUN_FINISHED"')
    # 10 deltas, 0.3 s apart: the first arrives about 2.7 s before the end, unless buffered
    assert finished - first_delta > 1.5, (first_delta, finished)
    events = parse_sse(b"".join(c for _, c in chunks))
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT").startswith("Slowly counting")


def test_heartbeats_pass_and_keep_a_silent_stream_open(proxied: dict[str, Any]) -> None:
    # 3 s of kernel silence behind a 1 s proxy_read_timeout: only the adapter's heartbeats,
    # passed on by nginx as they come, keep the stream open
    body = run_body("[SILENT 10] hi", cwd=str(proxied["workspace"]))
    response, chunks = _timed_stream(proxied, body)
    assert response.status_code == 200
    first_delta = _first_arrival(chunks, b'"TEXT_MESSAGE_CONTENT"')
    assert first_delta > 2.5, first_delta
    beats = []
    seen = b""
    for at, chunk in chunks:
        before = seen.count(b": heartbeat")
        seen += chunk
        beats += [at] * (seen.count(b": heartbeat") - before)
    during = [at for at in beats if at < first_delta]
    assert len(during) >= 5, beats
    gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
    assert max(gaps) < 0.9, gaps  # each one arrived on its own, well within the read timeout
    assert parse_sse(seen)[-1]["type"] == "RUN_FINISHED"


def test_a_client_disconnect_cancels_the_kernel_task(proxied: dict[str, Any], slow_kernel: ScriptedKernel) -> None:
    body = run_body("[SILENT 100] [SLOW]", cwd=str(proxied["workspace"]))  # 30 s of kernel silence
    payload = json.dumps(body).encode()
    port = _port(proxied["url"])
    context = ssl.create_default_context(cafile=str(proxied["cert"]))
    sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    data = b""
    while b"iac-code.session.v1" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    task_id = data.split(b'"taskId":"')[1].split(b'"')[0].decode()
    assert not any(c["params"].get("id") == task_id for c in kernel_calls(slow_kernel, "CancelTask"))
    sock.close()
    deadline = time.monotonic() + 30  # nginx closes upstream; the next heartbeat write notices
    while time.monotonic() < deadline:
        if any(c["params"].get("id") == task_id for c in kernel_calls(slow_kernel, "CancelTask")):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the adapter never sent CancelTask through nginx")


def test_x_request_id_flows_through(proxied: dict[str, Any]) -> None:
    direct = requests.get(proxied["adapter"].url + "health", headers={"X-Request-ID": "probe-1"}, timeout=5)
    if direct.headers.get("X-Request-ID") != "probe-1":
        pytest.skip("this adapter does not echo X-Request-ID (the edge work of issue 11 adds it)")
    client = _tls_client(proxied["url"], proxied["cert"])
    mine = f"req-{uuid.uuid4().hex}"
    result = client.run(run_body("hello", cwd=str(proxied["workspace"])), headers={"X-Request-ID": mine})
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"
    assert result.headers["X-Request-ID"] == mine
    assert mine.encode() in proxied["adapter"].log  # the adapter logged the client's id
    # no id from the client: nginx makes one up ($request_id) and the adapter uses it
    made_up = client.run(run_body("hello", cwd=str(proxied["workspace"])))
    assert made_up.status == 200
    assert re.fullmatch(r"[0-9a-f]{32}", made_up.headers["X-Request-ID"]), made_up.headers


def _require_curl() -> str:
    """curl (the HTTP/2 client); fails under ``CI=true`` and skips otherwise when it is missing."""
    curl = shutil.which("curl")
    if curl is None:
        message = "curl not found; install it with: apt-get install -y curl  (or: bash .ci/setup-peers.sh)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return curl


def _curl_stream(
    proxied: dict[str, Any], body: dict[str, Any], tmp_path: Path
) -> tuple[str, list[tuple[float, bytes]]]:
    """POST a run through nginx with ``curl --http2``; the HTTP version curl used and every
    piece of its output as it arrived, with its arrival time."""
    curl = _require_curl()
    payload = tmp_path / "body.json"
    payload.write_text(json.dumps(body))
    command = [
        curl, "--http2", "-sS", "-N", "--cacert", str(proxied["cert"]), "-H", "Content-Type: application/json",
        "-H", "Accept: text/event-stream", "--data-binary", f"@{payload}", "-w", "\\nHTTP-VERSION %{http_version}\\n",
        "--max-time", "60", proxied["url"],
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    chunks: list[tuple[float, bytes]] = []
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        chunks.append((time.monotonic() - start, chunk))
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    raw = b"".join(c for _, c in chunks)
    version = raw.rsplit(b"HTTP-VERSION ", 1)[1].strip().decode()
    return version, chunks


def test_sse_over_http2_is_not_buffered(proxied: dict[str, Any], tmp_path: Path) -> None:
    body = run_body("[SLOW]", cwd=str(proxied["workspace"]))
    version, chunks = _curl_stream(proxied, body, tmp_path)
    assert version == "2"  # curl and nginx agreed on HTTP/2 (ALPN)
    first_delta = _first_arrival(chunks, b'"TEXT_MESSAGE_CONTENT"')
    finished = _first_arrival(chunks, b'"RUN_FINISHED"')
    assert finished - first_delta > 1.5, (first_delta, finished)  # 10 deltas 0.3 s apart, each sent at once
    raw = b"".join(c for _, c in chunks).rsplit(b"HTTP-VERSION ", 1)[0]
    events = parse_sse(raw)
    check_stream(events)
    assert events[-1]["type"] == "RUN_FINISHED"


def test_http2_health_and_json_errors(proxied: dict[str, Any], tmp_path: Path) -> None:
    curl = _require_curl()
    done = subprocess.run(
        [curl, "--http2", "-sS", "--cacert", str(proxied["cert"]), "-w", "\\n%{http_version} %{http_code}",
         "-H", "Content-Type: text/plain", "--data-binary", "x", proxied["url"]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition("\n")
    assert status == "2 415", done.stdout + done.stderr
    assert json.loads(body)["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"


def _get_from(source: str, url: str, cert: Path) -> requests.Response:
    """``GET url`` with the connection's source address bound to ``source`` (a loopback alias)."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cert)

    class SourceAdapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["source_address"] = (source, 0)
            super().init_poolmanager(*args, **kwargs)

    session.mount("https://", SourceAdapter())
    return session.get(url, timeout=10)


def test_metrics_only_from_an_allowed_address(proxied: dict[str, Any]) -> None:
    url, cert = proxied["url"], proxied["cert"]
    allowed = _get_from("127.0.0.1", url + "metrics", cert)
    assert allowed.status_code == 200 and "agui_" in allowed.text
    refused = _get_from("127.0.0.2", url + "metrics", cert)
    assert refused.status_code == 403
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "FORBIDDEN"
    assert "agui_" not in refused.text
    # only /metrics: the rest of the adapter answers the same address
    assert _get_from("127.0.0.2", url + "health", cert).status_code == 200


class SilentUpstream:
    """A TCP server that reads requests and never answers (an adapter that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _full_backlog() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket whose backlog is full: a new connection's SYN is dropped, so connecting
    to it times out (an adapter host that does not answer)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(server.getsockname())
        except BlockingIOError:
            pass
        fillers.append(filler)
    return server, fillers


def test_a_read_timeout_is_told_apart_from_the_adapter_down(nginx_binary: str, tmp_path: Path) -> None:
    """An adapter that took the request and never answered: 504 GATEWAY_TIMEOUT; one refusing
    connections, or not answering the connect: 503 A2A_UNAVAILABLE with Retry-After."""
    silent = SilentUpstream()
    closed_port = free_port()  # nothing listens there
    unreachable, fillers = _full_backlog()
    cert, key = self_signed_cert(tmp_path)
    answers: dict[str, requests.Response] = {}
    upstreams = {"hung": silent.port, "refused": closed_port, "unreachable": unreachable.getsockname()[1]}
    try:
        for name, upstream_port in upstreams.items():
            port = free_port()
            site = render_recipe(
                "nginx-tls.conf",
                {
                    "server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream_port};",
                    "listen 443 ssl http2;": f"listen 127.0.0.1:{port} ssl http2;",
                    "/etc/nginx/tls/agui-adapter.crt": str(cert),
                    "/etc/nginx/tls/agui-adapter.key": str(key),
                    "proxy_read_timeout 120s;": "proxy_read_timeout 1s;",
                    "proxy_connect_timeout 5s;": "proxy_connect_timeout 1s;",
                },
            )
            nginx = Nginx(nginx_binary, tmp_path / f"nginx-{name}", site, port).start()
            try:
                client = _tls_client(f"https://127.0.0.1:{port}/", cert)
                answers[name] = client.session.post(
                    client.url, data=b"{}", headers={"Content-Type": "application/json"}, timeout=30
                )
                if name == "unreachable":
                    assert "timed out (110: Connection timed out) while connecting to upstream" in nginx.error_log()
            finally:
                nginx.stop()
    finally:
        silent.close()
        for sock in (unreachable, *fillers):
            sock.close()
    hung = answers["hung"]
    assert hung.status_code == 504, hung.text
    assert hung.json() == {"error": {"code": "GATEWAY_TIMEOUT", "message": "The adapter did not answer in time."}}
    assert "Retry-After" not in hung.headers
    for name in ("refused", "unreachable"):
        down = answers[name]
        assert down.status_code == 503, (name, down.text)
        assert down.json() == {
            "error": {"code": "A2A_UNAVAILABLE", "message": "The adapter is unavailable; retry later."}
        }
        assert down.headers["Retry-After"] == "10"


# ------------------------------------------------------------------- two pairs, sticky threads
class Pair:
    """One machine: a scripted kernel and the adapter in front of it, with its own state dir."""

    def __init__(self, root: Path, allowed: Path) -> None:
        self.kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.05)
        self.kernel.start()
        self.state_dir = root / "state"
        self.adapter = _start_adapter(self.state_dir, allowed, self.kernel.url)

    def holds(self, thread_id: str) -> bool:
        return (self.state_dir / "threads" / f"{thread_key(thread_id)}.json").exists()

    def stop(self) -> None:
        self.adapter.stop()
        self.kernel.stop()


@pytest.fixture
def two_pairs(nginx_binary: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    pairs = [Pair(tmp_path / name, tmp_path) for name in ("a", "b")]
    cert, key = self_signed_cert(tmp_path)
    port = free_port()
    site = render_recipe(
        "nginx-sticky-threads.conf",
        {
            "server 10.0.0.11:8000 ": f"server 127.0.0.1:{_port(pairs[0].adapter.url)} ",
            "server 10.0.0.12:8000 ": f"server 127.0.0.1:{_port(pairs[1].adapter.url)} ",
            "listen 443 ssl;": f"listen 127.0.0.1:{port} ssl;",
            "/etc/nginx/tls/agui-adapter.crt": str(cert),
            "/etc/nginx/tls/agui-adapter.key": str(key),
        },
    )
    nginx = Nginx(nginx_binary, tmp_path / "nginx", site, port).start()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    try:
        yield {"pairs": pairs, "client": _tls_client(f"https://127.0.0.1:{port}/", cert), "workspace": workspace}
    finally:
        nginx.stop()
        for pair in pairs:
            pair.stop()


def _pair_of(pairs: list[Pair], context_id: str) -> int:
    [index] = [i for i, p in enumerate(pairs) if kernel_calls(p.kernel, "SendStreamingMessage", context_id)]
    return index


def _threads_on_both_pairs(env: dict[str, Any], per_pair: int) -> dict[int, list[tuple[dict, Any]]]:
    """Threads started with a permission interrupt through nginx, until each pair holds ``per_pair``."""
    client, pairs = env["client"], env["pairs"]
    placed: dict[int, list[tuple[dict, Any]]] = {0: [], 1: []}
    for _ in range(40):
        body = run_body("[WRITE] make a file", cwd=str(env["workspace"]))
        result = client.run(body, headers={"X-AGUI-Thread-Id": body["threadId"]})
        assert result.status == 200 and result.terminal["outcome"]["type"] == "interrupt", result.raw
        index = _pair_of(pairs, session_value(result)["contextId"])
        assert pairs[index].holds(body["threadId"]) and not pairs[1 - index].holds(body["threadId"])
        placed[index].append((body, result))
        if min(len(v) for v in placed.values()) >= per_pair:
            return placed
    raise AssertionError(f"40 threads did not reach both pairs: {[len(v) for v in placed.values()]}")


def test_every_run_resume_and_cancel_of_a_thread_reaches_its_pair(two_pairs: dict[str, Any]) -> None:
    client, pairs = two_pairs["client"], two_pairs["pairs"]
    placed = _threads_on_both_pairs(two_pairs, per_pair=2)
    for index, threads in placed.items():
        mine, other = pairs[index], pairs[1 - index]
        for body, result in threads:
            thread = body["threadId"]
            context = session_value(result)["contextId"]
            header = {"X-AGUI-Thread-Id": thread}
            # the Resume
            [interrupt] = result.terminal["outcome"]["interrupts"]
            answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
            sent = len(kernel_calls(mine.kernel, "SendStreamingMessage", context))
            resumed = client.run(resume(body, answer), headers=header)
            assert resumed.terminal["type"] == "RUN_FINISHED", resumed.raw
            assert resumed.terminal["outcome"] == {"type": "success"}
            assert len(kernel_calls(mine.kernel, "SendStreamingMessage", context)) > sent
            # a next turn, cancelled through the cancel extension
            slow = run_body("[SLOW]", thread_id=thread, cwd=body["forwardedProps"]["iacCode"]["cwd"])
            session = requests.Session()
            session.trust_env, session.verify = False, client.session.verify
            with session.post(
                client.url, json=slow, headers={"Accept": "text/event-stream", **header}, stream=True, timeout=30
            ) as r:
                raw = b""
                chunks = r.iter_content(None)
                for chunk in chunks:
                    raw += chunk
                    if b"iac-code.session.v1" in raw:
                        break
                value = next(e for e in parse_sse(raw) if e.get("name") == "iac-code.session.v1")["value"]
                cancel = client.session.post(
                    f"{client.url}extensions/iac-code/v1/executions/{value['executionId']}/cancel",
                    json={"threadId": thread, "rosInvocationId": "inv-1"},
                    headers=header,
                    timeout=30,
                )
                assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
                for chunk in chunks:
                    raw += chunk
            events = parse_sse(raw)
            check_stream(events)
            assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "CANCELLED"
            assert any(c["params"].get("id") == value["taskId"] for c in kernel_calls(mine.kernel, "CancelTask"))
            # nothing of this thread ever reached the other pair
            assert kernel_calls(other.kernel, "SendStreamingMessage", context) == []
            assert not any(c["params"].get("id") == value["taskId"] for c in kernel_calls(other.kernel, "CancelTask"))
            assert mine.holds(thread) and not other.holds(thread)


def test_when_a_pair_is_down_its_threads_get_503_and_the_others_keep_working(two_pairs: dict[str, Any]) -> None:
    client, pairs = two_pairs["client"], two_pairs["pairs"]
    placed = _threads_on_both_pairs(two_pairs, per_pair=1)
    (down_body, down_result), (up_body, up_result) = placed[0][0], placed[1][0]
    port = str(_port(pairs[0].adapter.url))
    pairs[0].adapter.kill()
    # a thread of the stopped pair: the recipe's JSON 503, again and again (nginx never marks
    # the pair failed and hashes the thread elsewhere), for a Resume as for a new turn
    [interrupt] = down_result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    cwd = down_body["forwardedProps"]["iacCode"]["cwd"]
    for body in (
        resume(down_body, answer),
        resume(down_body, answer),
        run_body("hi", thread_id=down_body["threadId"], cwd=cwd),
    ):
        refused = client.run(body, headers={"X-AGUI-Thread-Id": body["threadId"]})
        assert refused.status == 503, refused.raw
        assert refused.error == {
            "code": "A2A_UNAVAILABLE",
            "message": "The machine that holds this thread is unavailable; retry later.",
        }
        assert refused.headers["Retry-After"] == "10"
        assert not pairs[1].holds(body["threadId"])
    # a thread of the other pair is not affected
    [interrupt] = up_result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    resumed = client.run(resume(up_body, answer), headers={"X-AGUI-Thread-Id": up_body["threadId"]})
    assert resumed.status == 200 and resumed.terminal["outcome"] == {"type": "success"}
    # the pair comes back on its address with its state: its thread resumes there
    pair = pairs[0]
    pair.adapter = _start_adapter(pair.state_dir, two_pairs["workspace"].parent, pair.kernel.url, "--port", port)
    [interrupt] = down_result.terminal["outcome"]["interrupts"]
    answer = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}]
    back = client.run(resume(down_body, answer), headers={"X-AGUI-Thread-Id": down_body["threadId"]})
    assert back.status == 200 and back.terminal["outcome"] == {"type": "success"}, back.raw
    assert kernel_calls(pairs[1].kernel, "SendStreamingMessage", session_value(down_result)["contextId"]) == []


def test_a_header_that_differs_from_the_body_is_refused_by_the_pair(two_pairs: dict[str, Any]) -> None:
    client = two_pairs["client"]
    body = run_body("hello", cwd=str(two_pairs["workspace"]))
    result = client.run(body, headers={"X-AGUI-Thread-Id": "thread-of-someone-else"})
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"
    assert "X-AGUI-Thread-Id" in result.error["message"]
    assert not any(p.holds(body["threadId"]) for p in two_pairs["pairs"])


REFUSAL = (
    "X-AGUI-Thread-Id is required: this proxy routes every request of a thread "
    "(POST /, the cancel extension, /threads/...) by that header."
)


def test_thread_bound_requests_need_the_header_and_the_request_id_flows(two_pairs: dict[str, Any]) -> None:
    client, pairs = two_pairs["client"], two_pairs["pairs"]
    session = client.session
    base = client.url
    body = run_body("[WRITE] make a file", cwd=str(two_pairs["workspace"]))
    thread = body["threadId"]
    # without the header, nginx refuses every thread-bound request itself, with its reason
    without = [
        session.post(base, json=body, headers={"Accept": "text/event-stream"}, timeout=30),
        session.post(f"{base}extensions/iac-code/v1/executions/ex-1/cancel", json={"threadId": thread}, timeout=30),
        session.get(f"{base}threads/{thread}", timeout=30),
        session.get(f"{base}threads/{thread}/messages", timeout=30),
        session.get(f"{base}threads/{thread}/runs/{body['runId']}/events", timeout=30),
    ]
    for response in without:
        assert response.status_code == 400, (response.request.url, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.json() == {"error": {"code": "INVALID_INPUT", "message": REFUSAL}}
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"])
    assert not any(p.holds(thread) for p in pairs)
    assert all(kernel_calls(p.kernel, "SendStreamingMessage") == [] for p in pairs)
    # the console's own requests carry it: they reach the thread's pair
    header = {"X-AGUI-Thread-Id": thread, "X-Request-ID": "console-req-1"}
    result = client.run(body, headers=header)
    assert result.status == 200 and result.terminal["outcome"]["type"] == "interrupt", result.raw
    assert result.headers["X-Request-ID"] == "console-req-1"
    [mine] = [p for p in pairs if p.holds(thread)]
    assert b"console-req-1" in mine.adapter.log  # the adapter logged the client's request id
    shown = session.get(f"{base}threads/{thread}", headers=header, timeout=30)
    assert shown.status_code == 200, shown.text
    assert shown.json()["pendingInterrupts"] == result.terminal["outcome"]["interrupts"]
    assert shown.headers["X-Request-ID"] == "console-req-1"
    messages = session.get(f"{base}threads/{thread}/messages", headers=header, timeout=30)
    assert messages.status_code == 200 and messages.json()["messages"][0]["content"] == "[WRITE] make a file"
    # requests of no thread go to any pair, with or without the header
    for path, accept in (("", "text/html"), ("health", "*/*"), ("ready", "*/*"), ("metrics", "*/*")):
        response = session.get(base + path, headers={"Accept": accept}, timeout=30)
        assert response.status_code == 200, (path, response.text)
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-ID"])
    module = session.get(f"{base}agui-adapter-client.mjs", timeout=30)  # served by the pair (404 before it exists)
    assert module.status_code in (200, 404), module.text
