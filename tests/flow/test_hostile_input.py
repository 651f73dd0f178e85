"""What a hostile or careless client sends, over a real socket: always a 400 (or 405/406)
before the stream, never a 500, never a traceback in the log, never a failure after the
stream started; and what one request can make the adapter store or decode is bounded."""

from __future__ import annotations

import base64
import json
import logging
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.state.store import ThreadStore
from tests.support.agui_client import Client, run_body

P = "forwardedProps.iacCode"


@pytest.fixture(autouse=True)
def no_traceback_in_the_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.INFO)
    yield
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


def refused(client: Client, body: dict[str, Any] | bytes, code: str = "INVALID_INPUT", **kw: Any) -> str:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()  # lone surrogates as \\ud800
    result = client.run(data, **kw)
    assert result.status == 400, (result.status, result.error, result.raw[:300])
    assert result.error["code"] == code
    return str(result.error["message"])


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


# --- deep nesting -------------------------------------------------------------------------


def test_deep_nesting_is_a_400_naming_the_field(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    body["state"] = nested(500)
    assert refused(client, body).startswith("state")
    body = run_body(cwd=str(workspace))
    body["messages"][0]["content"] = [{"type": "text", "text": "x", "extra": nested(500)}]
    assert refused(client, body).startswith("messages[0]")
    body = run_body(cwd=str(workspace))
    body["forwardedProps"]["other"] = nested(500)
    assert refused(client, body).startswith("forwardedProps")


def test_nesting_deeper_than_the_parser_goes_is_invalid_json(client: Client) -> None:
    refused(client, b"[" * 100_000 + b"]" * 100_000, code="INVALID_JSON")
    refused(client, b'{"state":' * 50_000 + b"1" + b"}" * 50_000, code="INVALID_JSON")


def test_reasonable_nesting_still_runs(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    body["state"] = nested(60)
    result = client.run(body)
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"


# --- lone surrogates ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("threadId",), "threadId"),
        (("runId",), "runId"),
        (("forwardedProps", "iacCode", "userId"), f"{P}.userId"),
        (("forwardedProps", "iacCode", "cwd"), f"{P}.cwd"),
        (("forwardedProps", "iacCode", "model"), f"{P}.model"),
        (("messages", 0, "content"), "messages[0].content"),
        (("messages", 0, "id"), "messages[0].id"),
    ],
)
def test_a_lone_surrogate_is_a_400_before_the_stream(
    client: Client, workspace: Path, path: tuple[Any, ...], field: str
) -> None:
    body = run_body(cwd=str(workspace))
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = (str(workspace) + "/" if field.endswith("cwd") else "x") + "\ud800y"
    message = refused(client, body)
    assert message.startswith(field), message


def test_a_surrogate_encoded_as_raw_bytes_is_invalid_json(client: Client, workspace: Path) -> None:
    # b"\xed\xa0\x80" is U+D800 encoded as if it were a character: not UTF-8 (found by the soak)
    data = json.dumps(run_body(thread_id="thread-x", cwd=str(workspace))).encode()
    result = client.run(data.replace(b"thread-x", b"\xed\xa0\x80thread-x"))
    assert result.status == 400 and result.error is not None and result.error["code"] == "INVALID_JSON"


def test_paired_surrogates_are_ordinary_text(client: Client, workspace: Path) -> None:
    result = client.run(json.dumps(run_body("smile \U0001f600", cwd=str(workspace))).encode())
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"


def test_a_lone_surrogate_in_a_key_or_the_cancel_body(adapter: Any, client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    body["state"] = {"k\udc00": 1}
    assert refused(client, body).startswith("state")
    response = requests.post(
        adapter.url + "extensions/iac-code/v1/executions/e-1/cancel",
        data=json.dumps({"threadId": "t\ud800", "rosInvocationId": "inv-1"}),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_INPUT"
    assert response.json()["error"]["message"].startswith("threadId")


# --- thinking.budget ------------------------------------------------------------------------


def test_thinking_budget_has_an_upper_bound(client: Client, workspace: Path) -> None:
    for budget in (10**4000, 2**53):
        body = run_body(cwd=str(workspace), thinking={"budget": budget})
        message = refused(client, body)
        assert message.startswith(f"{P}.thinking.budget"), message
    ok = client.run(run_body(cwd=str(workspace), thinking={"budget": 2**53 - 1}))
    assert ok.status == 200


# --- Accept ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accept",
    [
        "text/event-stream;q=inf",
        "text/event-stream;q=nan",
        "text/event-stream;q=2",
        "text/event-stream;q=1.5, application/json",
        "text/event-stream;q=0, */*",
        "*/*, text/event-stream;q=0",
        "text/*;q=0.5, text/event-stream;q=0",
    ],
)
def test_accept_values_that_do_not_accept_the_stream(client: Client, workspace: Path, accept: str) -> None:
    result = client.run(run_body(cwd=str(workspace)), headers={"Accept": accept})
    assert result.status == 406 and result.error["code"] == "NOT_ACCEPTABLE"


@pytest.mark.parametrize(
    "accept", ["text/event-stream; charset=utf-8", "application/json;q=0.9, text/*;q=0.1", "*/*;q=0.001"]
)
def test_accept_values_that_accept_the_stream(client: Client, workspace: Path, accept: str) -> None:
    assert client.run(run_body(cwd=str(workspace)), headers={"Accept": accept}).status == 200


# --- images ---------------------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def zero_png(side: int, pad_to: int) -> bytes:
    """A grey ``side`` x ``side`` PNG of zeros, padded with a private chunk to ``pad_to`` bytes."""
    compressor = zlib.compressobj(9)
    row = b"\x00" * (side + 1)
    idat = b"".join(compressor.compress(row * 500) for _ in range(side // 500)) + compressor.flush()
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
    body = head + _chunk(b"IDAT", idat)
    padding = max(0, pad_to - len(body) - 24)
    return body + _chunk(b"prVt", b"\x00" * padding) + _chunk(b"IEND", b"")


def test_a_pixel_bomb_is_refused_before_decoding(client: Client, workspace: Path) -> None:
    data = zero_png(8000, 5 * 1024 * 1024 + 4096)
    assert len(data) > 5 * 1024 * 1024
    image = {
        "type": "image",
        "source": {"type": "data", "mimeType": "image/png", "value": base64.b64encode(data).decode()},
    }
    body = run_body(cwd=str(workspace))
    body["messages"][0]["content"] = [{"type": "text", "text": "look"}, image]
    message = refused(client, body)
    assert "megapixels" in message


# --- run ids in the thread record --------------------------------------------------------------


def test_run_ids_are_bounded_and_stored_as_digests(adapter: Any, client: Client, workspace: Path) -> None:
    thread = "thread-runid-bound"
    long_run = "r" * 256
    body = run_body(cwd=str(workspace), thread_id=thread, run_id=long_run)
    assert client.run(body).status == 200
    store = ThreadStore(adapter.settings.resolved_state_dir())
    state = json.loads(store.path_for(thread).read_text())
    assert long_run not in json.dumps(state["runDigests"])  # the 1,000 remembered run ids: digests
    assert [run["runId"] for run in state["runs"]] == [long_run]  # the last 50 runs, shown by GET /threads
    # the same request again, and a different one with the same run id
    assert client.run(body).error["code"] == "DUPLICATE_RUN_ID"
    other = run_body("something else", cwd=str(workspace), thread_id=thread, run_id=long_run)
    assert client.run(other).error["code"] == "RUN_ID_CONFLICT"
    too_long = run_body(cwd=str(workspace), thread_id=thread, run_id="r" * 257)
    assert refused(client, too_long).startswith("runId")
    assert refused(client, run_body(cwd=str(workspace), thread_id="t" * 257)).startswith("threadId")


def test_raw_run_ids_of_old_state_files_are_still_known(adapter: Any, client: Client, workspace: Path) -> None:
    thread = "thread-runid-legacy"
    body = run_body(cwd=str(workspace), thread_id=thread, run_id="legacy-run-1")
    assert client.run(body).status == 200
    path = ThreadStore(adapter.settings.resolved_state_dir()).path_for(thread)
    state = json.loads(path.read_text())
    [(key, digest)] = state["runDigests"].items()
    assert key != "legacy-run-1" and len(key) == 64
    state["runDigests"] = {"legacy-run-1": digest}  # as a state file written before
    path.write_text(json.dumps(state))
    assert client.run(body).error["code"] == "DUPLICATE_RUN_ID"
    other = run_body("changed", cwd=str(workspace), thread_id=thread, run_id="legacy-run-1")
    assert client.run(other).error["code"] == "RUN_ID_CONFLICT"


# --- HEAD -----------------------------------------------------------------------------------


def raw_exchange(url: str, request: bytes) -> bytes:
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(("path", "status"), [("/health", 200), ("/ready", 200), ("/", 405), ("/nope", 404)])
def test_head_gets_no_body(adapter: Any, path: str, status: int) -> None:
    answer = raw_exchange(adapter.url, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), head
    assert rest == b""
    get = requests.get(adapter.url + path.lstrip("/"), timeout=10)
    assert get.status_code == (405 if path == "/" else status) and get.content
