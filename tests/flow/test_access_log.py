"""The access log over real sockets: ``python run.py`` as a process, every line of its log read.

One line per request, written when the response is over (a stream's when it ends), with
method, route, status, duration, bytes, client address, user agent, request id and the
thread and run ids once the request named them; refusals and reattach/cancel lines carry
those ids too; ``--log-level debug`` adds one line per kernel call. The processes are started
through the ``adapter_process`` fixture, so the session-wide secrets check reads their logs
(the runs below send secrets and a bearer token).
"""

from __future__ import annotations

import io
import json
import logging
import socket
from pathlib import Path
from typing import Any

import requests

from agui_adapter.ops import logs
from tests.support.agui_client import Client, run_body
from tests.support.flow import wait_for
from tests.support.ports import free_port

SECRETS = {
    "llmApiKey": "sk-ACCESS-LOG-SECRET-1",
    "alibabaCloud": {"accessKeySecret": "AKS-ACCESS-LOG-2", "securityToken": "STS-ACCESS-LOG-3"},
}
BEARER = "bearer-ACCESS-LOG-4"
AGENT = "agui-access-test/1.0"
FIELDS = {
    "method",
    "path",
    "protocol",
    "route",
    "status",
    "bytes_sent",
    "duration_seconds",
    "client_address",
    "user_agent",
    "request_id",
    "thread_id",
    "run_id",
}


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.headers["User-Agent"] = AGENT
    return session


def _entries(process: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in process.log.decode("utf-8").splitlines() if line.strip()]


def _access(process: Any, request_id: str) -> dict[str, Any]:
    """The one access line of the request with this id (waited for: it comes once the response is over)."""

    def found() -> list[dict[str, Any]]:
        return [e for e in _entries(process) if e["logger"] == "agui_adapter.access" and e["request_id"] == request_id]

    [line] = wait_for(found)
    assert FIELDS <= set(line), line
    assert line["client_address"] == "127.0.0.1" and line["protocol"] == "HTTP/1.1"
    assert isinstance(line["duration_seconds"], float) and 0 <= line["duration_seconds"] < 30
    return line


def _held_run(url: str, body: dict[str, Any]) -> socket.socket:
    """A run whose kernel goes silent after its first events, read up to its session event."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s" % (BEARER.encode(), len(payload), payload)
    )
    data = b""
    sock.settimeout(10)
    while b"iac-code.session.v1" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return sock


def test_one_json_line_per_request_with_its_route_status_bytes_and_ids(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process("--log-format", "json", "--log-level", "debug", "--auth-token", BEARER)
    url = process.url
    session = _session()
    auth = {"Authorization": f"Bearer {BEARER}"}

    health = session.get(url + "health", headers={"X-Request-ID": "acc-health"}, timeout=10)
    line = _access(process, "acc-health")
    assert (line["method"], line["path"], line["route"], line["status"]) == ("GET", "/health", "health", 200)
    assert line["bytes_sent"] == len(health.content) and line["user_agent"] == AGENT
    assert line["thread_id"] is None and line["run_id"] is None
    assert line["message"].startswith('127.0.0.1 "GET /health HTTP/1.1" 200 ')

    assert session.get(url + "metrics", headers={"X-Request-ID": "acc-m401"}, timeout=10).status_code == 401
    assert (_access(process, "acc-m401")["route"], _access(process, "acc-m401")["status"]) == ("metrics", 401)
    head = session.head(url + "metrics", headers={**auth, "X-Request-ID": "acc-mhead"}, timeout=10)
    assert head.status_code == 200
    line = _access(process, "acc-mhead")
    assert (line["method"], line["route"], line["status"], line["bytes_sent"]) == ("HEAD", "metrics", 200, 0)

    page = session.get(url, headers={"Accept": "text/html", "X-Request-ID": "acc-console"}, timeout=10)
    assert page.status_code == 200
    line = _access(process, "acc-console")
    assert (line["route"], line["status"], line["bytes_sent"]) == ("console", 200, len(page.content))

    bad = Client(url, BEARER).run(b"{not json", headers={"X-Request-ID": "acc-400"})
    assert bad.status == 400
    assert (_access(process, "acc-400")["route"], _access(process, "acc-400")["status"]) == ("run", 400)
    wrong = Client(url, "not-the-bearer")
    refused = wrong.run(run_body(cwd=str(workspace), **SECRETS), headers={"X-Request-ID": "a401"})
    assert refused.status == 401
    assert (_access(process, "a401")["route"], _access(process, "a401")["status"]) == ("run", 401)

    # a stream: its line when it ends, with its ids and every byte
    body = run_body("[THINK] hello", cwd=str(workspace), **SECRETS)
    run = Client(url, BEARER).run(body, headers={"X-Request-ID": "acc-run"})
    assert run.terminal["type"] == "RUN_FINISHED"
    line = _access(process, "acc-run")
    assert (line["route"], line["status"], line["bytes_sent"]) == ("run", 200, len(run.raw))
    assert (line["thread_id"], line["run_id"]) == (body["threadId"], body["runId"])
    assert f"thread={body['threadId']} run={body['runId']}" in line["message"]
    summary = [e for e in _entries(process) if e.get("run_id") == body["runId"] and "outcome" in e]
    assert summary and summary[0]["bytes_sent"] == line["bytes_sent"]  # the run's own count agrees

    # the events route replays the ended run: a reattach line and an access line with the ids
    events_url = f"{url}threads/{body['threadId']}/runs/{body['runId']}/events"
    stream = {**auth, "Accept": "text/event-stream", "X-Request-ID": "acc-ev"}
    replay = session.get(events_url, headers=stream, timeout=10)
    assert replay.status_code == 200
    line = _access(process, "acc-ev")
    assert (line["route"], line["status"], line["bytes_sent"]) == ("events", 200, len(replay.content))
    assert (line["thread_id"], line["run_id"]) == (body["threadId"], body["runId"])
    reattached = [e for e in _entries(process) if "reattached after event" in e["message"]]
    assert reattached and reattached[0]["thread_id"] == body["threadId"] and reattached[0]["run_id"] == body["runId"]

    # a refusal (THREAD_BUSY) names the run it refused, on its log line and its access line
    held_body = run_body("[SILENT 200] [SLOW]", cwd=str(workspace))
    held = _held_run(url, held_body)
    try:
        busy_body = run_body("again", thread_id=held_body["threadId"], cwd=str(workspace))
        busy = Client(url, BEARER).run(busy_body, headers={"X-Request-ID": "acc-busy"})
        assert busy.status == 409 and busy.error["code"] == "THREAD_BUSY"
        line = _access(process, "acc-busy")
        assert (line["status"], line["thread_id"], line["run_id"]) == (409, busy_body["threadId"], busy_body["runId"])
        # one line, not two: the access line carries the code the run was refused with
        refusal = [e for e in _entries(process) if e["request_id"] == "acc-busy" and "refused" in e["message"]]
        assert [e["logger"] for e in refusal] == ["agui_adapter.access"]
        assert refusal[0]["error_code"] == "THREAD_BUSY" and " refused=THREAD_BUSY" in refusal[0]["message"]
        assert refusal[0]["run_id"] == busy_body["runId"]
        assert refusal[0]["thread_id"] == busy_body["threadId"]
    finally:
        held.close()

    # the cancel extension: its lines carry the thread it names
    cancel = session.post(
        url + "extensions/iac-code/v1/executions/exec-none/cancel",
        json={"threadId": "thread-cancel-1", "rosInvocationId": "inv-1"},
        headers={**auth, "X-Request-ID": "acc-cancel"},
        timeout=10,
    )
    assert cancel.status_code == 404
    line = _access(process, "acc-cancel")
    assert (line["route"], line["thread_id"], line["run_id"]) == ("cancel", "thread-cancel-1", None)

    # debug: one line per kernel call (method, outcome, duration), with the run's ids
    calls = [e for e in _entries(process) if e["logger"] == "agui_adapter.kernel" and e["run_id"] == body["runId"]]
    assert any(c["kernel_method"] == "SendStreamingMessage" and c["kernel_result"] == "ok" for c in calls), calls
    assert all(c["level"] == "DEBUG" and c["duration_seconds"] >= 0 for c in calls)
    for secret in ("sk-ACCESS-LOG-SECRET-1", "AKS-ACCESS-LOG-2", "STS-ACCESS-LOG-3", BEARER, "not-the-bearer"):
        assert secret.encode() not in process.log, secret


def test_text_lines_a_ready_503_and_no_access_log(adapter_process: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}/"  # nobody listens: the kernel is down
    process = adapter_process(kernel_url=dead)
    session = _session()
    assert session.get(process.url + "ready", headers={"X-Request-ID": "acc-ready"}, timeout=10).status_code == 503

    def line() -> list[bytes]:
        return [x for x in process.log.splitlines() if b" agui_adapter.access: " in x and b"acc-ready" in x]

    [text] = wait_for(line)
    assert b' INFO agui_adapter.access: 127.0.0.1 "GET /ready HTTP/1.1" 503 ' in text
    assert f'ready "{AGENT}" [request acc-ready]'.encode() in text

    for off in (
        adapter_process("--no-access-log", kernel_url=dead),
        adapter_process(env={"IAC_CODE_AGUI_ACCESS_LOG": "false"}, kernel_url=dead),
    ):
        _no_access_lines(off)


def _no_access_lines(process: Any) -> None:
    """Requests answered on one kept-alive connection: the server closes a response before it
    reads the next request, so once the last request's own line is there, any access line of
    the ones before it would be too."""
    session = _session()
    assert session.get(process.url + "health", timeout=10).status_code == 200
    assert session.get(process.url + "ready", timeout=10).status_code == 503
    refused = session.post(process.url, json={"threadId": "t"}, headers={"Accept": "text/event-stream"}, timeout=10)
    assert refused.status_code == 400
    wait_for(lambda: b"POST / refused: INVALID_INPUT" in process.log)
    assert b"agui_adapter.access" not in process.log


def test_an_answer_on_the_io_thread_is_the_app_s_own_list_its_line_written_before_it_returns(
    adapter: Any, workspace: Path, caplog: Any
) -> None:
    """A refusal answered on the server's I/O thread (``answer_inline``) is sent as the list the
    app returned: no body wrapper to iterate and close, its access line already written, with
    the bytes, status, code and ids the wrapper would have logged."""
    body = run_body(cwd=str(workspace))  # valid, so its ids are known: refused for its routing header
    payload = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(payload)),
        "HTTP_ACCEPT": "text/event-stream",
        "HTTP_X_REQUEST_ID": "acc-inline",
        "HTTP_X_AGUI_THREAD_ID": "another-thread",
        "wsgi.input": io.BytesIO(payload),
        "wsgi.input_terminated": True,
    }
    started: list[tuple[str, list[tuple[str, str]]]] = []
    caplog.handler.addFilter(logs.RunContext())  # the ids in context, as the adapter's own handler reads them
    with caplog.at_level(logging.INFO, logger="agui_adapter.access"):
        answer = adapter.app.answer_inline(environ, lambda status, headers, *_: started.append((status, headers)))
        lines = [r for r in caplog.records if r.name == "agui_adapter.access"]
    assert type(answer) is list and started[0][0].startswith("400")
    [line] = lines
    assert (line.status, line.route, line.error_code, line.request_id) == (400, "run", "INVALID_INPUT", "acc-inline")
    assert line.bytes_sent == len(b"".join(answer)) > 0
    assert line.thread_id == body["threadId"] and line.run_id == body["runId"]
