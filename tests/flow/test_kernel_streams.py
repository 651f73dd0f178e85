"""The kernel client's streaming calls over ``http.client`` (``a2a.StreamConnections``), on
real sockets against a small kernel stand-in: what the call sends, how each kind of answer
maps to ``KernelRejected``/``KernelUnavailable``, keep-alive reuse, and ``close()`` from
another thread unblocking a reader.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agui_adapter.kernel_client.a2a import KernelClient
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from tests.support.flow import wait_for

TOKEN = "kernel-secret-token-xyz"


class Kernel(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "stream"
        self.requests: list[dict[str, Any]] = []
        self.peers: list[int] = []
        self.release = threading.Event()
        self.closed = 0  # connections this side has closed

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed += 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Kernel

    def log_message(self, *_args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"headers": dict(self.headers), "body": body})
        self.server.peers.append(self.client_address[1])
        mode = self.server.mode
        if mode == "http-error":
            self._send(500, "application/json", b'{"detail":"boom"}')
        elif mode == "rejected":
            answer = {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32602, "message": "bad params"}}
            self._send(200, "application/json", json.dumps(answer).encode())
        elif mode == "html":
            self._send(200, "text/html", b"<html></html>")
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for n in range(3):
                self._chunk(b"data: " + json.dumps({"result": {"n": n}}).encode() + b"\n\n")
            if mode == "hold":
                self.server.release.wait(10)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            if mode == "drop":
                self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    server = Kernel()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_a_stream_carries_the_call_and_reuses_its_connection(kernel: Kernel) -> None:
    client = KernelClient(kernel.url, TOKEN)
    for _ in range(2):
        stream = client.send_streaming_message({"messageId": "m-1", "parts": [{"text": "hi"}]})
        data = b"".join(stream.chunks())
        assert data.count(b"data: ") == 3
    first, second = kernel.requests
    assert first["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert first["headers"]["A2A-Version"] == "1.0"
    assert first["body"]["method"] == "SendStreamingMessage"
    assert first["body"]["params"]["message"]["messageId"] == "m-1"
    assert first["body"]["id"] != second["body"]["id"]
    assert kernel.peers[0] == kernel.peers[1]  # the same kept-alive connection
    client.close()


def test_a_json_rpc_error_is_kernel_rejected(kernel: Kernel) -> None:
    kernel.mode = "rejected"
    client = KernelClient(kernel.url, TOKEN)
    with pytest.raises(KernelRejected) as caught:
        client.send_streaming_message({"messageId": "m"})
    assert caught.value.rpc_code == -32602 and caught.value.detail == "bad params"
    kernel.mode = "stream"
    assert b"".join(client.send_streaming_message({"messageId": "m"}).chunks())
    assert kernel.peers[0] == kernel.peers[1]


@pytest.mark.parametrize(("mode", "words"), [("http-error", "HTTP 500"), ("html", "unexpected text/html")])
def test_other_answers_are_kernel_unavailable(kernel: Kernel, mode: str, words: str) -> None:
    kernel.mode = mode
    client = KernelClient(kernel.url, TOKEN)
    with pytest.raises(KernelUnavailable) as caught:
        client.send_streaming_message({"messageId": "m"})
    assert words in str(caught.value) and TOKEN not in str(caught.value)


def test_an_unreachable_kernel_is_kernel_unavailable_without_the_token() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = KernelClient(f"http://127.0.0.1:{port}/", TOKEN, connect_timeout=2.0)
    with pytest.raises(KernelUnavailable) as caught:
        client.send_streaming_message({"messageId": "m"})
    assert "SendStreamingMessage" in str(caught.value) and TOKEN not in repr(caught.value)


def test_a_connection_the_kernel_closed_is_not_reused(kernel: Kernel) -> None:
    kernel.mode = "drop"  # the kernel closes its side once the response is over (an idle timeout)
    client = KernelClient(kernel.url, TOKEN)
    for n in range(2):
        assert b"".join(client.send_streaming_message({"messageId": "m"}).chunks()).count(b"data: ") == 3
        wait_for(lambda n=n: kernel.closed > n, 10)  # the kernel closed that connection
    assert len(kernel.requests) == 2 and kernel.peers[0] != kernel.peers[1]


def test_close_from_another_thread_unblocks_the_reader(kernel: Kernel) -> None:
    kernel.mode = "hold"
    client = KernelClient(kernel.url, TOKEN)
    stream = client.send_streaming_message({"messageId": "m"})
    got: list[bytes] = []
    ended = threading.Event()

    def read() -> None:
        got.extend(stream.chunks())
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 30
    while b"".join(got).count(b"data: ") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not ended.is_set()
    stream.close()
    assert ended.wait(30), "the reader stayed blocked"
    assert stream.closed
    kernel.release.set()
    # the aborted connection is not given back: the next call opens a new one
    kernel.mode = "stream"
    assert b"".join(client.send_streaming_message({"messageId": "m"}).chunks())
    assert kernel.peers[-1] != kernel.peers[0]
