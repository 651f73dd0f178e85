"""The kernel client: JSON-RPC 2.0 over HTTP to the iac-code A2A runtime.

One pooled ``requests.Session`` (made on first use) serves the unary calls. The streaming calls to an
``http://`` kernel (a run's path to its first delta) go over kept-alive sockets of their own
(``connections.StreamConnections``): one write of the request, the answer's head parsed with the
server's wire rules, the body read off the socket; about a millisecond less per call than
``requests``, whose per-request machinery (hooks, adapters, urllib3's pool and response
wrappers) is not needed for one POST and a stream of bytes, and some 75 us less than
``http.client`` (see ``connections``); an ``https://`` kernel keeps ``requests`` (its certificate
handling). Every request carries
``A2A-Version: 1.0`` (without it the kernel assumes 0.3) and the kernel's bearer token, and
goes through ``calls`` (``kernel_calls.KernelCalls``): the request id and the trace context
as headers, its latency and failure kind to the metrics, one debug line.
A streaming call the kernel rejects comes back as a plain JSON-RPC error, not SSE: the
content type decides. ``KernelStream`` owns one blocking SSE response; ``close()`` may be
called from another thread and unblocks a reader stuck in ``recv``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agui_adapter.http.rules import ResponseStart
from agui_adapter.kernel_client import connections, repeats
from agui_adapter.kernel_client.calls import PLAIN, Call, KernelCalls
from agui_adapter.kernel_client.connections import KernelConnection, StreamConnections
from agui_adapter.kernel_client.failures import KernelRejected, KernelUnavailable
from agui_adapter.kernel_client.sse import SSEDecoder
from agui_adapter.ops import process_local, speedups


def _first_batch(text: bytes) -> Any:
    """The batch decoder, chosen at the first batch of frames rather than at import (orjson
    costs about 1 MiB of an idle process): the optional "speedups" extra's orjson (about 25%
    more events/s on the kernel's frames), else the standard library, which always works."""
    global _decode_batch
    loads = speedups.orjson_loads() or json.loads
    _decode_batch = loads
    return loads(text)


_decode_batch: Callable[[bytes], Any] = _first_batch

if TYPE_CHECKING:
    import requests

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _requests() -> Any:
    """``requests``, imported on first use: the unary calls and an ``https://`` kernel's
    streams need it, a run's stream from an ``http://`` kernel does not (``StreamConnections``),
    and importing it (urllib3, charset_normalizer, certifi, idna) is a fifth of the start-up."""
    import requests

    return requests


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
            self._ended()

    def _ended(self) -> None:
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
        self._close_response()

    def _close_response(self) -> None:
        try:
            self._response.close()
        except Exception:  # noqa: BLE001 - closing must never raise
            pass


class ConnectionStream(KernelStream):
    """A streaming answer read off a pooled connection (``connections``); the connection goes back
    to its pool when the body was read to its end.

    A chunked body (what the kernel sends) is de-chunked with the server's own decoder
    (``http.rules.ChunkedDecoder``), all that arrived with each network read in one item:
    the kernel writes one chunk per frame, so one item carries every frame that has
    arrived, and the run decodes them in one go instead of one queue item and one parser
    call per frame."""

    def __init__(self, start: ResponseStart, connection: KernelConnection, pool: StreamConnections) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._done = False
        self._sock = connection.sock
        self._connection: KernelConnection | None = connection
        self._pool = pool

    def chunks(self) -> Iterator[bytes]:
        finished = False
        connection = self._connection
        try:
            if connection is not None:
                yield from connection.body(self._start)
                finished = self._start.keep_alive
        except Exception as exc:  # wire and socket errors alike
            if self.closed:
                return
            raise KernelUnavailable(f"kernel stream broke: {exc.__class__.__name__}") from exc
        finally:
            self._ended()
            self._let_go(reuse=finished)  # read to its end, never aborted: it can serve again

    def _let_go(self, *, reuse: bool) -> None:
        """Give the connection back to the pool, or close it (once)."""
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is None:
            return
        if reuse:
            self._pool.give_back(connection)
        else:
            connection.close()

    def _close_response(self) -> None:  # ``close`` (inherited) aborts; the connection is not reused
        self._let_go(reuse=False)


class FrameReader:
    """Kernel SSE bytes in, JSON-RPC frames out (sans-I/O).

    A frame is a parsed JSON value, or a ``repeats.Repeat``: a status frame that repeats the
    one before but for its text, recognised on its bytes and equal to what the parser gives.
    """

    __slots__ = ("_decoder", "_template")

    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._template: repeats.Template | None = None

    def feed(self, chunk: bytes) -> list[Any]:
        decoder = self._decoder
        if self._template is None:
            payloads = decoder.feed(chunk)
            return self._frames(payloads) if payloads else []
        # A read of repeats is taken whole (``_run_of_repeats``) from the first event that
        # begins in it to the last that ends in it; the decoder takes what is around that.
        frames: list[Any] = []
        start = 0
        if not decoder.empty:  # an event begun in an earlier read ends first
            start = chunk.find(b"\r\n\r\n") + 4
            if start < 4:
                start = len(chunk)
            payloads = decoder.feed(chunk[:start])
            if payloads:
                frames = self._frames(payloads)
        cut = chunk.rfind(b"\r\n\r\n")
        if cut >= start and decoder.empty:
            cut += 4
            run = self._run_of_repeats(chunk, start, cut)
            if run is not None:
                frames += run
                start = cut
        if start < len(chunk):
            payloads = decoder.feed(chunk[start:] if start else chunk)
            if payloads:
                frames += self._frames(payloads)
        return frames

    def close(self) -> list[Any]:
        payloads = self._decoder.close()
        return self._frames(payloads) if payloads else []

    def _frames(self, payloads: list[bytes]) -> list[Any]:
        template = self._template
        if template is not None:
            texts = repeats.texts_if_repeats(template, payloads)
            found = [text for text in texts if text is not None]
            decoded = _texts(found) if found else None
            if decoded is not None:
                if len(found) == len(payloads):  # the common case: every one a repeat
                    return [repeats.Repeat(template, text) for text in decoded]
                return self._mixed(payloads, texts, decoded)
        frames = _load_all(payloads)
        self._learn(payloads, frames)
        return frames

    def _run_of_repeats(self, chunk: bytes, start: int, end: int) -> list[Any] | None:
        """The events of ``chunk[start:end]`` as repeats, if every one is a repeat: each text
        runs to the next quote, and the run is checked whole against its template's bytes
        around the texts found (one join, one comparison) rather than event by event."""
        template = self._template
        assert template is not None
        head, tail, between = template.event_head, template.event_tail, template.between
        texts: list[bytes] = []
        find, add = chunk.find, texts.append
        at, tail_length, step = start + len(head), len(tail), len(between)
        while True:
            quote = find(b'"', at, end)  # a repeat's text holds no quote: its end
            if quote < 0:
                return None
            add(chunk[at:quote])
            if quote + tail_length >= end:
                break
            at = quote + step
        if head + between.join(texts) + tail != chunk[start:end]:
            return None
        array = b'","'.join(texts)
        if array.endswith(b"\\") or b'\\","' in array:  # a text ending in a backslash
            return None
        decoded = _texts_of(b'["' + array + b'"]', len(texts))
        if decoded is None:
            return None
        return [repeats.Repeat(template, text) for text in decoded]

    def _mixed(self, payloads: list[bytes], texts: list[bytes | None], decoded: list[str]) -> list[Any]:
        """Repeats where they are, the rest parsed whole (together) between them."""
        rest = [payload for payload, text in zip(payloads, texts, strict=True) if text is None]
        whole = _load_all(rest)
        parsed, found = iter(whole), iter(decoded)
        template = self._template
        assert template is not None
        frames = [repeats.Repeat(template, next(found)) if text is not None else next(parsed) for text in texts]
        self._learn(rest, whole)
        return frames

    def _learn(self, payloads: list[bytes], frames: list[Any]) -> None:
        """The last text frame parsed whole may be the next template (one tried per read)."""
        for payload, frame in zip(reversed(payloads), reversed(frames), strict=True):
            if repeats.text_of(frame) is not None:
                template = repeats.learn(frame, payload, _decode_batch)
                if template is not None:
                    self._template = template
                return


def _texts(found: list[bytes]) -> list[str] | None:
    """The texts of repeats, one parser call for all; None if the parser refuses any."""
    return _texts_of(b'["' + b'","'.join(found) + b'"]', len(found))


def _texts_of(array: bytes, count: int) -> list[str] | None:
    try:
        texts = _decode_batch(array)
    except ValueError:
        return None
    return texts if type(texts) is list and len(texts) == count else None


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


def _load_all(payloads: list[bytes]) -> list[Any]:
    """Decode many frames with one parser call; frame by frame only if one is bad (bytes in:
    the parser checks the UTF-8, and a payload that is not is a malformed frame)."""
    if len(payloads) > 1:
        try:
            frames = _decode_batch(b"[" + b",".join(payloads) + b"]")
            if len(frames) == len(payloads):
                return frames
        except ValueError:
            pass
    return [_loads(p) for p in payloads]


def _loads(payload: bytes) -> Any:
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
        self._pool_size = pool_size
        self._requests_session: requests.Session | None = None
        self._session_lock = threading.Lock()
        self._headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        parts = urlsplit(self.url)
        self._streams: StreamConnections | None = None
        self._path = parts.path or "/"
        #: What observes every call (metrics, tracing, debug lines); set by ``server.build_app``.
        self.calls: KernelCalls = PLAIN
        if parts.scheme == "http" and parts.hostname:
            self._streams = StreamConnections(
                parts.hostname,
                parts.port or 80,
                connect_timeout=connect_timeout,
                read_timeout=timeout,
                size=pool_size,
            )
            self._stream_head = connections.request_head(
                self._path,
                parts.hostname,
                parts.port or 80,
                {**self._headers, "Accept": "*/*", "User-Agent": "agui-adapter"},
            )

    def __repr__(self) -> str:  # never show the token
        return f"KernelClient({self.url!r})"

    @property
    def _session(self) -> requests.Session:
        """The pooled ``requests`` session of the unary calls, made on first use."""
        session = self._requests_session
        if session is None:
            with self._session_lock:
                if self._requests_session is None:
                    requests = _requests()
                    from requests.adapters import HTTPAdapter

                    session = requests.Session()
                    adapter = HTTPAdapter(pool_connections=2, pool_maxsize=self._pool_size, max_retries=0)
                    session.mount("http://", adapter)
                    session.mount("https://", adapter)
                    session.trust_env = False  # never route loopback traffic through a proxy
                    self._requests_session = session
                session = self._requests_session
        return session

    def close(self) -> None:
        if self._requests_session is not None:
            self._requests_session.close()
        if self._streams is not None:
            self._streams.close()

    # --- JSON-RPC -----------------------------------------------------------------
    def _post(
        self, method: str, params: dict[str, Any], call: Call, *, stream: bool, timeout: Any = None
    ) -> requests.Response:
        body = {"jsonrpc": "2.0", "id": str(process_local.uuid4()), "method": method, "params": params}
        try:
            response = self._session.post(
                self.url,
                data=json.dumps(body, ensure_ascii=False).encode("utf-8"),
                headers={**self._headers, **call.headers} if call.headers else self._headers,
                stream=stream,
                timeout=timeout or self._timeout,
            )
        except _requests().RequestException as exc:
            kind = "timeout" if isinstance(exc, _requests().Timeout) else "connection"
            raise KernelUnavailable(f"{method}: {exc.__class__.__name__}", kind) from exc
        if response.status_code >= 400:
            response.close()
            raise KernelUnavailable(f"{method}: HTTP {response.status_code}", "http_status")
        return response

    def call(self, method: str, params: dict[str, Any], *, timeout: Any = None) -> Any:
        """A unary call; returns ``result`` or raises ``KernelRejected``."""
        with self.calls.call(method) as call:
            response = self._post(method, params, call, stream=False, timeout=timeout)
            try:
                body = response.json()
            except ValueError as exc:
                raise KernelUnavailable(f"{method}: the answer is not JSON", "bad_answer") from exc
            if not isinstance(body, dict):
                raise KernelUnavailable(f"{method}: the answer is not a JSON object", "bad_answer")
            if "error" in body:
                raise KernelRejected(body["error"])
            return body.get("result")

    def stream(self, method: str, params: dict[str, Any]) -> KernelStream:
        """A streaming call. A rejected request arrives as JSON: ``KernelRejected``."""
        with self.calls.call(method) as call:
            if self._streams is not None:
                return self._connection_stream(self._streams, method, params, call)
            response = self._post(method, params, call, stream=True)
            content_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != "text/event-stream":
                unexpected = f"{method}: unexpected {content_type or 'untyped'} answer"
                try:
                    body = json.loads(response.content or b"null")
                except ValueError as exc:
                    raise KernelUnavailable(unexpected, "bad_answer") from exc
                finally:
                    response.close()
                if isinstance(body, dict) and "error" in body:
                    raise KernelRejected(body["error"])
                raise KernelUnavailable(unexpected, "bad_answer")
            return KernelStream(response)

    def _connection_stream(
        self, pool: StreamConnections, method: str, params: dict[str, Any], call: Call
    ) -> KernelStream:
        """``stream`` on a pooled connection of our own (an ``http://`` kernel, ``connections``)."""
        body = {"jsonrpc": "2.0", "id": str(process_local.uuid4()), "method": method, "params": params}
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        connection: KernelConnection | None = None
        try:
            request = connections.encode_request(self._stream_head, call.headers, data)
            connection, _ = pool.take()
            connection.send(request)
            start = connection.read_head()
        except (OSError, ValueError, connections.WireError) as exc:
            if connection is not None:
                connection.close()
            kind = "timeout" if isinstance(exc, TimeoutError) else "connection"
            raise KernelUnavailable(f"{method}: {exc.__class__.__name__}", kind) from exc
        if start.status >= 400:
            connection.close()
            raise KernelUnavailable(f"{method}: HTTP {start.status}", "http_status")
        content_type = (start.header("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "text/event-stream":
            unexpected = f"{method}: unexpected {content_type or 'untyped'} answer"
            try:
                answer = json.loads(connection.read_body(start) or b"null")
            except (ValueError, OSError, connections.WireError) as exc:
                connection.close()
                raise KernelUnavailable(unexpected, "bad_answer") from exc
            if start.keep_alive:
                pool.give_back(connection)
            else:
                connection.close()
            if isinstance(answer, dict) and "error" in answer:
                raise KernelRejected(answer["error"])
            raise KernelUnavailable(unexpected, "bad_answer")
        return ConnectionStream(start, connection, pool)

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
        """A plain HTTP route of the kernel (its callers read the status; 5xx counts as failed)."""
        with self.calls.call(path) as call:
            headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
            headers.update(call.headers)
            try:
                response = self._session.request(
                    verb, self.url + path, headers=headers, timeout=(self._timeout[0], timeout), **kwargs
                )
            except _requests().RequestException as exc:
                kind = "timeout" if isinstance(exc, _requests().Timeout) else "connection"
                raise KernelUnavailable(f"{path}: {exc.__class__.__name__}", kind) from exc
            if response.status_code >= 500:
                call.error = "http_status"
            return response

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

    def session_recovery(self, context_id: str, execution_id: str) -> tuple[int, Any]:
        """The kernel's recovery view of a context's current execution: its ``messages`` are
        the session's conversation as the kernel keeps it (``GET /threads/{t}/messages``)."""
        params = {"contextId": context_id, "executionId": execution_id}
        response = self._extension("GET", "iac-code/session/recovery", params=params)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None
