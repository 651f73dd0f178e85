"""The AG-UI client of the tests: runs over real HTTP, every stream checked and recorded.

``Client.run`` posts a ``RunAgentInput`` and returns a ``RunResult``; an SSE answer is parsed
and checked against the AG-UI 1.0 models and lifecycle rules (``check_stream``), recorded for
the official client (``RECORDER``), and the body's secrets are remembered for the session-wide
secrets check. ``run_body`` builds a ``RunAgentInput`` with ``forwardedProps.iacCode``,
``resume`` the Resume run that answers a previous run's interrupts, and ``session_value``
reads the ``iac-code.session.v1`` event of a result. ``LiveStream`` reads a run
incrementally, for tests that act while it streams (kill, disconnect, signal, cancel, and
reattach: ``Client.reattach`` and ``Client.events`` open a run's stream again after an
event id; ``joined`` puts the pieces of a run read across reattaches back together).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from tests.support.agui_stream import RECORDER, check_stream, parse_sse, parse_sse_ids
from tests.support.secrets import remember_secrets


@dataclass
class RunResult:
    status: int
    headers: dict[str, str]
    raw: bytes
    events: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def terminal(self) -> dict[str, Any]:
        return self.events[-1]

    def text(self) -> str:
        return "".join(e["delta"] for e in self.of("TEXT_MESSAGE_CONTENT"))


class Client:
    """A small AG-UI client over real HTTP."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.session = requests.Session()
        self.session.trust_env = False

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    def run(
        self, body: dict[str, Any] | bytes, *, headers: dict[str, str] | None = None, check: bool = True
    ) -> RunResult:
        remember_secrets(body)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = self.session.post(self.url, data=data, headers=self.headers(headers), timeout=60)
        result = RunResult(response.status_code, dict(response.headers), response.content)
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            result.events = parse_sse(response.content)
            if check:
                check_stream(result.events)
            thread = body.get("threadId", "") if isinstance(body, dict) else ""
            RECORDER.record(str(thread), response.content)
        else:
            try:
                result.error = response.json().get("error")
            except ValueError:
                result.error = None
        return result

    def reattach(self, body: dict[str, Any], last_event_id: int | str) -> LiveStream:
        """``POST /`` with the run's own body and ``Last-Event-ID``."""
        return LiveStream(self, body, headers={"Last-Event-ID": str(last_event_id)})

    def events(self, thread_id: str, run_id: str, last_event_id: int | str | None = None) -> LiveStream:
        """``GET /threads/{t}/runs/{r}/events`` (as a browser's EventSource sends it)."""
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        url = f"{self.url}threads/{quote(thread_id, safe='')}/runs/{quote(run_id, safe='')}/events"
        response = self.session.get(url, headers=headers, stream=True, timeout=60)
        return LiveStream.of(response, {"threadId": thread_id, "runId": run_id})

    def cancel(self, execution_id: str, body: dict[str, Any]) -> requests.Response:
        return self.session.post(
            f"{self.url}extensions/iac-code/v1/executions/{execution_id}/cancel",
            data=json.dumps(body),
            headers=self.headers(),
            timeout=30,
        )


def run_body(
    text: str | None = "hello",
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
    cwd: str,
    ros: str = "inv-1",
    resume: list[dict[str, Any]] | None = None,
    **props: Any,
) -> dict[str, Any]:
    iac: dict[str, Any] = {"schemaVersion": 1, "rosInvocationId": ros, "cwd": cwd}
    iac.update(props)
    body: dict[str, Any] = {
        "threadId": thread_id or f"thread-{uuid.uuid4().hex[:12]}",
        "runId": run_id or f"run-{uuid.uuid4().hex[:12]}",
        "state": {},
        "messages": [] if text is None else [{"id": f"m-{uuid.uuid4().hex[:8]}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {"iacCode": iac},
    }
    if resume is not None:
        body["resume"] = resume
    return body


def resume(body: dict, answers: list[dict], **kw: Any) -> dict:
    """The Resume run of ``body``'s thread (same cwd and rosInvocationId) with ``answers``."""
    props = body["forwardedProps"]["iacCode"]
    return run_body(
        None, thread_id=body["threadId"], cwd=props["cwd"], ros=props["rosInvocationId"], resume=answers, **kw
    )


def session_value(result: RunResult) -> dict[str, Any]:
    """The value of the run's one ``iac-code.session.v1`` CUSTOM event."""
    [event] = [e for e in result.of("CUSTOM") if e["name"] == "iac-code.session.v1"]
    return dict(event["value"])


class LiveStream:
    """A run read incrementally (requests, stream=True); ``finish`` checks and records it."""

    def __init__(self, client: Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.body = body
        self.response = client.session.post(
            client.url, data=json.dumps(body), headers=client.headers(headers), stream=True, timeout=60
        )
        self.chunks = self.response.iter_content(None)
        self.raw = b""

    @classmethod
    def of(cls, response: requests.Response, body: dict[str, Any]) -> LiveStream:
        """A stream already opened (a GET of a run's events)."""
        stream = cls.__new__(cls)
        stream.body, stream.response, stream.raw = body, response, b""
        stream.chunks = response.iter_content(None)
        return stream

    def error(self) -> dict[str, Any]:
        """The JSON error of a stream refused before it started."""
        return dict(self.response.json()["error"])

    def read_events(self, count: int, timeout: float = 30.0) -> list[tuple[int, dict[str, Any]]]:
        """Read until at least ``count`` whole events arrived; the (id, event) pairs so far."""
        deadline = time.monotonic() + timeout
        while True:
            whole = self.raw[: self.raw.rfind(b"\n\n") + 2] if b"\n\n" in self.raw else b""
            pairs = parse_sse_ids(whole)
            if len(pairs) >= count:
                return pairs
            assert time.monotonic() < deadline, f"{count} events not seen in {self.raw[-500:]!r}"
            self.raw += next(self.chunks)

    def rest(self) -> list[tuple[int, dict[str, Any]]]:
        """Read to the end of the response (without the checks of ``finish``)."""
        for chunk in self.chunks:
            self.raw += chunk
        self.response.close()
        return parse_sse_ids(self.raw)

    @property
    def status(self) -> int:
        return self.response.status_code

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.raw:
            assert time.monotonic() < deadline, f"{marker!r} not seen in {self.raw[-500:]!r}"
            self.raw += next(self.chunks)
        return self.raw

    def session(self) -> dict[str, Any]:
        """The value of the session CUSTOM event (read up to the end of its frame)."""
        self.read_until(b"iac-code.session.v1")
        at = self.raw.index(b"iac-code.session.v1")
        while b"\n\n" not in self.raw[at:]:
            self.raw += next(self.chunks)
        events = parse_sse(self.raw[: self.raw.index(b"\n\n", at) + 2])
        [event] = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "iac-code.session.v1"]
        return dict(event["value"])

    def finish(self) -> list[dict[str, Any]]:
        for chunk in self.chunks:
            self.raw += chunk
        self.response.close()
        events = parse_sse(self.raw)
        check_stream(events)
        RECORDER.record(self.body["threadId"], self.raw)
        return events

    def close(self) -> None:
        """Leave the run: the client goes away."""
        self.response.close()


def joined(*pieces: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The events of one run read in pieces (a stream, then reattaches), joined on their
    ids: each piece must go on exactly where the ids before it stopped or overlap them with
    the same events; the result is checked as one run and recorded for the official client."""
    by_id: dict[int, dict[str, Any]] = {}
    for piece in pieces:
        for event_id, event in piece:
            if event_id in by_id:
                assert by_id[event_id] == event, f"event {event_id} differs between pieces"
            by_id[event_id] = event
    ids = sorted(by_id)
    assert ids == list(range(1, len(ids) + 1)), f"missing ids: {sorted(set(range(1, ids[-1] + 1)) - set(ids))}"
    events = [by_id[i] for i in ids]
    check_stream(events)
    raw = b"".join(f"id: {i}\ndata: {json.dumps(by_id[i])}\n\n".encode() for i in ids)
    RECORDER.record(str(events[0].get("threadId", "joined")), raw)
    return events
