"""A loopback TCP proxy that cuts AG-UI streams mid-run, for the client module's reconnect tests.

Why: a client's reconnect is only proven by a connection that really drops while the run goes
on. The proxy forwards bytes both ways unchanged and watches the requests on each connection
(keep-alive included); the n-th *stream* request (``POST /`` or ``GET .../events``) gets the
n-th entry of ``cuts``: the number of response bytes forwarded before both sockets are closed
(0: the client's side is closed as soon as the request went upstream, before any answer,
while the adapter's side stays open and is read to its end, so the adapter never learns of
it); with ``freeze`` the sockets stay open instead and nothing more reaches the client (a
stalled path). Streams past
the list are left alone. ``requests`` records every request line with its ``Last-Event-ID``.
"""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass
from typing import Any

_REQUEST_LINE = re.compile(rb"(GET|POST|HEAD|OPTIONS|PUT|DELETE) (\S+) HTTP/1\.[01]\r\n((?:[^\r\n]*\r\n)*?)\r\n")
_LAST_EVENT_ID = re.compile(rb"(?im)^last-event-id:[ \t]*(\S*)")


@dataclass
class Seen:
    method: str
    path: str
    last_event_id: str | None
    cut_after: int | None  # the budget this request's answer got (None: not cut)


class CuttingProxy:
    """``127.0.0.1:<port>`` -> ``upstream`` (host, port), cutting the first streams as told."""

    def __init__(self, upstream: tuple[str, int], cuts: list[int], *, freeze: bool = False) -> None:
        self.upstream = upstream
        self.cuts = list(cuts)
        self.freeze = freeze
        self.requests: list[Seen] = []
        self.cut_count = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def streams(self) -> list[Seen]:
        return [r for r in self.requests if _is_stream(r.method, r.path)]

    # ------------------------------------------------------------------ internals
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        state: dict[str, Any] = {"budget": None, "closed": False, "lost": False}
        cond = threading.Condition()

        def cut(deliberate: bool = True) -> None:
            with cond:
                if state["closed"]:
                    return
                state["closed"] = True
            if deliberate:
                with self._lock:
                    self.cut_count += 1
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

        def requests_in() -> None:
            buffer = b""
            while True:
                try:
                    data = client.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    break
                buffer += data
                pending: int | None = None
                while True:
                    match = _REQUEST_LINE.search(buffer)
                    if match is None:
                        buffer = buffer[-16384:]
                        break
                    buffer = buffer[match.end() :]
                    method, path = match.group(1).decode(), match.group(2).decode()
                    header = _LAST_EVENT_ID.search(match.group(3))
                    budget = None
                    if _is_stream(method, path):
                        with self._lock:
                            budget = self.cuts.pop(0) if self.cuts else None
                    with self._lock:
                        self.requests.append(Seen(method, path, header.group(1).decode() if header else None, budget))
                    if budget is not None:
                        pending = budget
                with cond:
                    if pending == 0:
                        state["lost"] = True
                    elif pending is not None:
                        state["budget"] = pending
                try:
                    upstream.sendall(data)
                except OSError:
                    break
                if pending == 0:  # the request went up; its answer will reach nobody
                    with self._lock:
                        self.cut_count += 1
                    try:
                        client.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    client.close()
                    return
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        threading.Thread(target=requests_in, daemon=True).start()
        while True:
            try:
                data = upstream.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            with cond:
                if state["lost"]:
                    continue  # read and dropped: the adapter writes on, to nobody
                budget = state["budget"]
                if budget is not None and len(data) >= budget:
                    data, state["budget"] = data[:budget], 0
                elif budget is not None:
                    state["budget"] = budget - len(data)
            try:
                client.sendall(data)
            except OSError:
                break
            if state["budget"] == 0 and self.freeze:
                with self._lock:
                    self.cut_count += 1
                while upstream.recv(65536):  # swallowed: the client hears nothing more
                    pass
                break
            if state["budget"] == 0:
                cut()
                return
        cut(deliberate=False)


def _is_stream(method: str, path: str) -> bool:
    return (method == "POST" and path == "/") or (method == "GET" and path.endswith("/events"))
