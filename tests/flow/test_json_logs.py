"""``--log-format json``: ``python run.py`` as a process, every line of its log parsed.

The process is started through ``AdapterProcess`` (the ``adapter_process`` fixture), so
the session-wide secrets check reads its log too; the runs below send secrets.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from tests.support.agui_client import Client, run_body

SECRETS = {
    "llmApiKey": "sk-JSON-LOG-SECRET-1",
    "alibabaCloud": {"accessKeySecret": "AKS-JSON-LOG-2", "securityToken": "STS-JSON-LOG-3"},
}
BEARER = "bearer-JSON-LOG-4"
KEYS = {"time", "level", "logger", "message", "request_id", "thread_id", "run_id", "pid"}


def _lines(process: Any) -> list[dict[str, Any]]:
    entries = []
    for line in process.log.decode("utf-8").splitlines():
        if line.strip():
            entries.append(json.loads(line))  # every line is one JSON object
    return entries


def _summary(entries: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    [line] = [e for e in entries if e.get("run_id") == run_id and "outcome" in e]
    return line


def _wait_for_summaries(process: Any, run_ids: list[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        entries = _lines(process)
        done = {e.get("run_id") for e in entries if "outcome" in e}
        if set(run_ids) <= done or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def test_json_lines_with_ids_and_one_summary_per_run(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process("--log-format", "json", "--log-level", "debug", "--auth-token", BEARER)
    client = Client(process.url, BEARER)
    turn_body = run_body("[THINK] [TOOL] hello", cwd=str(workspace), **SECRETS)
    turn = client.run(turn_body, headers={"X-Request-ID": "req-json-turn-1"})
    assert turn.terminal["type"] == "RUN_FINISHED"
    failed_body = run_body("[FAIL]", cwd=str(workspace), **SECRETS)
    failed = client.run(failed_body)
    assert failed.terminal["type"] == "RUN_ERROR"
    refused = Client(process.url, "not-the-bearer").run(run_body(cwd=str(workspace), **SECRETS))
    assert refused.status == 401

    entries = _wait_for_summaries(process, [turn_body["runId"], failed_body["runId"]])
    for entry in entries:
        assert KEYS <= set(entry), entry
        assert entry["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        assert entry["time"].endswith("Z") and "T" in entry["time"]
        assert isinstance(entry["message"], str) and entry["message"]
        assert "[request " not in entry["message"]  # the id is a field, not text
        assert entry["pid"] == process.proc.pid, entry  # the adapter's own, every line
    assert any("listening on http://" in e["message"] for e in entries)

    summary = _summary(entries, turn_body["runId"])
    assert summary["logger"] == "agui_adapter.run"
    assert summary["thread_id"] == turn_body["threadId"]
    assert summary["request_id"] == "req-json-turn-1" == turn.headers["X-Request-ID"]
    assert summary["outcome"] == "success" and summary["error_code"] is None
    assert summary["events_sent"] == len(turn.events)
    assert summary["bytes_sent"] == len(turn.raw)
    assert 0 < summary["duration_seconds"] < 30

    error = _summary(entries, failed_body["runId"])
    assert error["outcome"] == "error"
    assert error["error_code"] == failed.terminal["code"]
    assert error["events_sent"] == len(failed.events)
    assert error["request_id"] == failed.headers["X-Request-ID"]

    # the run's other lines carry its ids too
    admitted = [e for e in entries if e["run_id"] == turn_body["runId"] and "admitted" in e["message"]]
    assert len(admitted) == 1 and admitted[0]["thread_id"] == turn_body["threadId"]

    for secret in ("sk-JSON-LOG-SECRET-1", "AKS-JSON-LOG-2", "STS-JSON-LOG-3", BEARER, "not-the-bearer"):
        assert secret.encode() not in process.log, secret


def test_the_log_format_comes_from_the_environment_too(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process(env={"IAC_CODE_AGUI_LOG_FORMAT": "json"})
    body = run_body("hello", cwd=str(workspace))
    assert Client(process.url).run(body).status == 200
    entries = _wait_for_summaries(process, [body["runId"]])
    assert _summary(entries, body["runId"])["outcome"] == "success"


def test_text_logs_keep_their_format_and_sum_runs_up(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process()
    body = run_body("hello", cwd=str(workspace), **SECRETS)
    result = Client(process.url).run(body)
    assert result.status == 200
    deadline = time.monotonic() + 10
    line = b""
    while not line and time.monotonic() < deadline:
        found = [x for x in process.log.splitlines() if body["runId"].encode() in x and b" events, " in x]
        line = found[0] if found else b""
        time.sleep(0.05)
    assert b" INFO agui_adapter.run: " in line
    assert f"success, {len(result.events)} events, {len(result.raw)} bytes".encode() in line
    assert not process.log.lstrip().startswith(b"{")


def test_a_disconnected_run_logs_its_ids_on_the_machine_lines_and_its_summary(
    adapter_process: Any, workspace: Path
) -> None:
    process = adapter_process("--log-format", "json", "--heartbeat-seconds", "0.2")
    body = run_body("[SILENT 100] [SLOW]", cwd=str(workspace))  # 5 s of kernel silence
    host, port = process.url.split("//")[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        data = b""
        sock.settimeout(10)
        while b"iac-code.session.v1" not in data:
            data += sock.recv(65536)
    entries = _wait_for_summaries(process, [body["runId"]])
    summary = _summary(entries, body["runId"])
    assert summary["outcome"] == "abandoned" and summary["error_code"] is None
    assert summary["events_sent"] >= 2
    # the machine's line, written while the driver closes the run, carries the run's ids
    cancelling = [e for e in entries if "cancelling the kernel task" in e["message"]]
    assert cancelling, [e["message"] for e in entries]
    assert all(e["run_id"] == body["runId"] and e["thread_id"] == body["threadId"] for e in cancelling)
