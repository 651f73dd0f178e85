"""The kernel client: JSON-RPC 2.0 over HTTP to the iac-code A2A runtime, with ``requests``.

One pooled ``requests.Session`` serves every call. Every request carries
``A2A-Version: 1.0`` (without it the kernel assumes 0.3) and the kernel's bearer token.
A streaming call the kernel rejects comes back as a plain JSON-RPC error, not SSE: the
content type decides. ``KernelStream`` owns one blocking SSE response; ``close()`` may be
called from another thread and unblocks a reader stuck in ``recv``.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from .sse import SSEDecoder

try:  # the optional "speedups" extra: about 25% more events/s on the kernel's frames
    from orjson import loads as _decode_batch
except ImportError:  # the standard library is the default and always works
    _decode_batch = json.loads

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class KernelUnavailable(Exception):
    """The kernel could not be reached, or answered with an HTTP error."""


class KernelRejected(Exception):
    """The kernel answered with a JSON-RPC error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.error = error if isinstance(error, dict) else {}
        message = self.error.get("message")
        self.detail = message if isinstance(message, str) else "JSON-RPC error"
        self.rpc_code = self.error.get("code")
        super().__init__(f"{self.rpc_code}: {self.detail}")

    @property
    def data(self) -> Any:
        return self.error.get("data")


def check_kernel_url(url: str, *, allow_remote: bool) -> str:
    """Validate and normalise a kernel URL (loopback only unless explicitly allowed)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"The kernel URL must be an http(s) URL, got {url!r}.")
    if not allow_remote and parts.hostname.lower() not in LOOPBACK_HOSTS:
        raise ValueError(
            "The kernel URL must be on loopback (127.0.0.1, localhost or ::1); "
            "set allow_remote_kernel to use a remote kernel."
        )
    return url.rstrip("/") + "/"


def _socket_of(response: requests.Response) -> socket.socket | None:
    """The socket under a streaming response, so that another thread can shut it down.

    For a ``Connection: close`` response http.client has already detached the socket
    from its connection object; the response's file object still holds it.
    """
    raw = response.raw
    connection = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    if sock is None:
        fp = getattr(getattr(raw, "_fp", None), "fp", None)  # http.client.HTTPResponse.fp
        sock = getattr(getattr(fp, "raw", None), "_sock", None)  # BufferedReader -> SocketIO
    return sock if isinstance(sock, socket.socket) else None


class KernelStream:
    """One streaming JSON-RPC response, read as batches of decoded frames."""

    def __init__(self, response: requests.Response) -> None:
        self._response = response
        self._lock = threading.Lock()
        self._done = False
        self._sock = _socket_of(response)

    def chunks(self) -> Iterator[bytes]:
        """The raw bytes of the response, one item per network read."""
        raw = self._response.raw
        try:
            if raw.chunked:
                yield from raw.read_chunked(None, decode_content=True)
            else:
                yield from iter(lambda: raw.read1(65536), b"")
        except Exception as exc:  # requests/urllib3/socket errors alike
            if self.closed:
                return
            raise KernelUnavailable(f"kernel stream broke: {exc.__class__.__name__}") from exc
        finally:
            with self._lock:
                self._done = True

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._done

    def close(self) -> None:
        """Abort the stream; safe from any thread, idempotent."""
        with self._lock:
            if not self._done and self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._done = True
        try:
            self._response.close()
        except Exception:  # noqa: BLE001 - closing must never raise
            pass


class FrameReader:
    """Kernel SSE bytes in, JSON-RPC frames out (sans-I/O)."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = SSEDecoder()

    def feed(self, chunk: bytes) -> list[Any]:
        payloads = self._decoder.feed(chunk)
        return _load_all(payloads) if payloads else []

    def close(self) -> list[Any]:
        payloads = self._decoder.close()
        return _load_all(payloads) if payloads else []


class SnapshotStream:
    """A task snapshot served like a one-frame stream (a task that is no longer running)."""

    def __init__(self, task: Any) -> None:
        self._body = b"data: " + json.dumps({"result": {"task": task}}).encode("utf-8") + b"\n\n"
        self.closed = False

    def chunks(self) -> Iterator[bytes]:
        yield self._body
        self.closed = True

    def close(self) -> None:
        self.closed = True


def _load_all(payloads: list[str]) -> list[Any]:
    """Decode many frames with one parser call; frame by frame only if one is bad."""
    if len(payloads) > 1:
        try:
            frames = _decode_batch("[" + ",".join(payloads) + "]")
            if len(frames) == len(payloads):
                return frames
        except ValueError:
            pass
    return [_loads(p) for p in payloads]


def _loads(payload: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return {"error": {"code": -32700, "message": "Malformed frame from the kernel."}}


class KernelClient:
    """JSON-RPC and extension calls on one kernel."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 3600.0,
        connect_timeout: float = 5.0,
        pool_size: int = 64,
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self._timeout = (connect_timeout, timeout)
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=2, pool_maxsize=pool_size, max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.trust_env = False  # never route loopback traffic through a proxy
        self._headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:  # never show the token
        return f"KernelClient({self.url!r})"

    def close(self) -> None:
        self._session.close()

    # --- JSON-RPC -----------------------------------------------------------------
    def _post(self, method: str, params: dict[str, Any], *, stream: bool, timeout: Any = None) -> requests.Response:
        body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
        try:
            response = self._session.post(
                self.url,
                data=json.dumps(body, ensure_ascii=False).encode("utf-8"),
                headers=self._headers,
                stream=stream,
                timeout=timeout or self._timeout,
            )
        except requests.RequestException as exc:
            raise KernelUnavailable(f"{method}: {exc.__class__.__name__}") from exc
        if response.status_code >= 400:
            response.close()
            raise KernelUnavailable(f"{method}: HTTP {response.status_code}")
        return response

    def call(self, method: str, params: dict[str, Any], *, timeout: Any = None) -> Any:
        """A unary call; returns ``result`` or raises ``KernelRejected``."""
        response = self._post(method, params, stream=False, timeout=timeout)
        try:
            body = response.json()
        except ValueError as exc:
            raise KernelUnavailable(f"{method}: the answer is not JSON") from exc
        if not isinstance(body, dict):
            raise KernelUnavailable(f"{method}: the answer is not a JSON object")
        if "error" in body:
            raise KernelRejected(body["error"])
        return body.get("result")

    def stream(self, method: str, params: dict[str, Any]) -> KernelStream:
        """A streaming call. A rejected request arrives as JSON: ``KernelRejected``."""
        response = self._post(method, params, stream=True)
        content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "text/event-stream":
            try:
                body = json.loads(response.content or b"null")
            except ValueError as exc:
                raise KernelUnavailable(f"{method}: unexpected {content_type or 'untyped'} answer") from exc
            finally:
                response.close()
            if isinstance(body, dict) and "error" in body:
                raise KernelRejected(body["error"])
            raise KernelUnavailable(f"{method}: unexpected {content_type or 'untyped'} answer")
        return KernelStream(response)

    def send_streaming_message(self, message: dict[str, Any]) -> KernelStream:
        return self.stream(
            "SendStreamingMessage",
            {"message": message, "configuration": {"acceptedOutputModes": ["text/plain"]}},
        )

    def send_message(self, message: dict[str, Any]) -> Any:
        return self.call(
            "SendMessage",
            {"message": message, "configuration": {"acceptedOutputModes": ["text/plain"]}},
        )

    def get_task(self, task_id: str, history_length: int | None = None, *, timeout: float = 30.0) -> Any:
        params: dict[str, Any] = {"id": task_id}
        if history_length is not None:
            params["historyLength"] = history_length
        return self.call("GetTask", params, timeout=(min(self._timeout[0], timeout), timeout))

    def cancel_task(self, task_id: str) -> Any:
        return self.call("CancelTask", {"id": task_id}, timeout=(self._timeout[0], 60.0))

    def subscribe(self, task_id: str) -> KernelStream:
        return self.stream("SubscribeToTask", {"id": task_id})

    def follow(self, task_id: str) -> KernelStream | SnapshotStream:
        """The task's live updates, or its current snapshot when it is no longer running."""
        try:
            return self.subscribe(task_id)
        except KernelRejected as exc:
            if exc.rpc_code != -32001:
                raise
        return SnapshotStream(self.get_task(task_id))

    # --- plain HTTP routes -------------------------------------------------------
    def _extension(self, verb: str, path: str, *, timeout: float = 30.0, **kwargs: Any) -> requests.Response:
        headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        try:
            return self._session.request(
                verb, self.url + path, headers=headers, timeout=(self._timeout[0], timeout), **kwargs
            )
        except requests.RequestException as exc:
            raise KernelUnavailable(f"{path}: {exc.__class__.__name__}") from exc

    def health(self, timeout: float = 2.0) -> bool:
        try:
            response = self._extension("GET", "health", timeout=timeout)
        except KernelUnavailable:
            return False
        return response.status_code == 200

    def ensure_restored(self, cwd: str, session_id: str, task_id: str | None) -> tuple[int, Any]:
        body: dict[str, Any] = {"cwd": cwd, "sessionId": session_id}
        if task_id:
            body["taskId"] = task_id
        response = self._extension("POST", "iac-code/session/ensure-restored", json=body)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    def pipeline_state(self, params: dict[str, Any]) -> tuple[int, Any]:
        response = self._extension("GET", "iac-code/pipeline/state", params=params)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None
