"""The HTTP edge over real sockets: endpoints, every pre-stream error code, languages."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import requests

from tests.support.agui_client import Client, run_body
from tests.support.flow import wait_for


def test_health_is_cheap_and_describes_the_protocol(adapter: Any) -> None:
    response = requests.get(adapter.url + "health", timeout=5)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["protocol"] == "ag-ui"
    assert body["executionKernel"] == "a2a-1.0" and body["protocolVersion"] == "1.0"
    assert body["serverVersion"]


def test_ready_reflects_the_kernel(make_adapter: Any, scripted_kernel: Any) -> None:
    adapter = make_adapter()
    assert requests.get(adapter.url + "ready", timeout=5).status_code == 200
    from agui_adapter.kernel_client.launch import KernelProcess, free_port
    from tests.support.servers import InProcessAdapter

    dead = InProcessAdapter(adapter.settings, KernelProcess(f"http://127.0.0.1:{free_port()}/", "x", "dead"))
    try:
        response = requests.get(dead.url + "ready", timeout=5)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "A2A_UNAVAILABLE"
        # /health never contacts the kernel
        assert requests.get(dead.url + "health", timeout=5).status_code == 200
    finally:
        dead.stop()


def test_unknown_path_and_wrong_method_are_json(adapter: Any) -> None:
    response = requests.get(adapter.url + "nope", timeout=5)
    assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"
    response = requests.get(adapter.url, timeout=5)
    assert response.status_code == 405 and response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "POST" in response.headers["Allow"]


def test_bearer_auth(make_adapter: Any, workspace: Path) -> None:
    adapter = make_adapter(auth_token="s3cret-token")
    body = run_body(cwd=str(workspace))
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic s3cret-token"},
        {"Authorization": "Bearers3cret-token"},
    ):
        result = Client(adapter.url).run(body, headers=headers)
        assert result.status == 401, headers
        assert result.error["code"] == "UNAUTHORIZED"
        assert "s3cret" not in json.dumps(result.error)
    assert requests.get(adapter.url + "health", timeout=5).status_code == 200
    ok = Client(adapter.url, "s3cret-token").run(body)
    assert ok.status == 200 and ok.terminal["type"] == "RUN_FINISHED"


def test_content_type(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    result = client.run(body, headers={"Content-Type": "text/plain"})
    assert result.status == 415 and result.error["code"] == "UNSUPPORTED_MEDIA_TYPE"
    result = client.run(body, headers={"Content-Type": "application/merge-patch+json"})
    assert result.status == 415
    result = client.run(body, headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert result.status == 200


def test_accept_must_allow_event_stream(client: Client, workspace: Path) -> None:
    result = client.run(run_body(cwd=str(workspace)), headers={"Accept": "application/json"})
    assert result.status == 406 and result.error["code"] == "NOT_ACCEPTABLE"
    for accept in ("*/*", "text/event-stream, application/json;q=0.5", "text/*"):
        assert client.run(run_body(cwd=str(workspace)), headers={"Accept": accept}).status == 200


def test_body_limit_from_content_length(adapter: Any) -> None:
    response = requests.post(
        adapter.url,
        data=b"{" + b" " * (12 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "REQUEST_TOO_LARGE"


def _chunked_post(url: str, chunks: list[bytes]) -> tuple[int, bytes]:
    host, port = url.split("//")[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        try:
            for chunk in chunks:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server may stop reading once the limit is passed
        data = b""
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
            head, sep, rest = data.partition(b"\r\n\r\n")
            length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
            if sep and length and len(rest) >= length[0]:
                break  # a complete JSON answer; SSE answers end when the server closes
    status = int(data.split(b" ", 2)[1])
    return status, data


def test_body_limit_for_chunked_bodies(adapter: Any, workspace: Path) -> None:
    status, data = _chunked_post(adapter.url, [b"{" + b" " * (1024 * 1024)] * 13)
    assert status == 413 and b"REQUEST_TOO_LARGE" in data
    small = json.dumps(run_body(cwd=str(workspace))).encode()
    status, data = _chunked_post(adapter.url, [small[:10], small[10:]])
    assert status == 200 and b"RUN_FINISHED" in data


def test_invalid_json_and_not_an_object(client: Client) -> None:
    result = client.run(b"{not json")
    assert result.status == 400 and result.error["code"] == "INVALID_JSON"
    result = client.run(b"[1, 2]")
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"


def test_invalid_input_names_the_field_without_echoing_secrets(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace), llmApiKey="sk-very-secret", thinking={"budget": 1.5})
    result = client.run(body)
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"
    assert "forwardedProps.iacCode.thinking.budget" in result.error["message"]
    assert "sk-very-secret" not in json.dumps(result.error)
    body = run_body(cwd=str(workspace))
    body["forwardedProps"]["iacCode"]["surprise"] = True
    result = client.run(body)
    assert result.status == 400 and "surprise" in result.error["message"]
    body = run_body(cwd=str(workspace))
    body["threadId"] = ""
    result = client.run(body)
    assert result.status == 400 and "threadId" in result.error["message"]
    body = run_body(cwd=str(workspace))
    body["tools"] = [{"name": "x", "description": "y", "parameters": {}}]
    result = client.run(body)
    assert result.status == 400 and "tools" in result.error["message"]


def test_content_errors_come_before_the_stream(client: Client, workspace: Path) -> None:
    body = run_body(cwd=str(workspace))
    body["messages"] = [
        {
            "id": "m1",
            "role": "user",
            "content": [{"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}],
        }
    ]
    result = client.run(body)
    assert result.status == 400 and result.error["code"] == "INVALID_INPUT"
    assert "URL" in result.error["message"]
    body["messages"] = [{"id": "m1", "role": "assistant", "content": "hi"}]
    result = client.run(body)
    assert result.status == 400 and "user message" in result.error["message"]


def test_cwd_rules(client: Client, tmp_path: Path, workspace: Path) -> None:
    result = client.run(run_body(cwd="relative/path"))
    assert result.status == 400 and "absolute" in result.error["message"]
    result = client.run(run_body(cwd="/etc"))
    assert result.status == 400 and "allowed roots" in result.error["message"]
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    result = client.run(run_body(cwd=str(a_file)))
    assert result.status == 400 and "not a directory" in result.error["message"]


def test_cwd_is_created_only_for_admitted_requests(client: Client, tmp_path: Path, workspace: Path) -> None:
    thread = "thread-cwd-create"
    assert client.run(run_body(cwd=str(workspace), thread_id=thread)).status == 200
    other = tmp_path / "never-created"
    result = client.run(run_body(cwd=str(other), thread_id=thread))
    assert result.status == 409 and result.error["code"] == "THREAD_BINDING_CONFLICT"
    assert not other.exists()
    fresh = tmp_path / "created" / "deep"
    assert client.run(run_body(cwd=str(fresh))).status == 200
    assert fresh.is_dir()


def test_language_negotiation(client: Client, workspace: Path) -> None:
    bad = b"{oops"
    result = client.run(bad, headers={"Accept-Language": "fr-CA;q=0.5, de;q=0.9"})
    assert result.error["message"] == client_translate("de", "The request body is not valid JSON.")
    body = run_body(cwd="relative", preferredLanguage="ja-JP")
    result = client.run(body, headers={"Accept-Language": "de"})
    expected = client_translate("ja", "The iac-code workspace ({field}) must be an absolute path.")
    assert result.error["message"] == expected.format(field="forwardedProps.iacCode.cwd")
    result = client.run(b"{oops", headers={"Accept-Language": "xx, *;q=0.1"})
    assert result.error["message"] == "The request body is not valid JSON."


def client_translate(language: str, text: str) -> str:
    from agui_adapter.protocol.i18n import translate

    translated = translate(language, text)
    assert language == "en" or translated != text, f"no {language} translation for {text!r}"
    return translated


def test_default_language_setting(make_adapter: Any) -> None:
    adapter = make_adapter(default_language="zh")
    result = adapter.client().run(b"{oops")
    assert result.error["message"] == client_translate("zh", "The request body is not valid JSON.")


def test_secrets_stay_out_of_debug_logs(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process("--log-level", "debug", "--auth-token", "bearer-SECRET-42")
    client = Client(process.url, "bearer-SECRET-42")
    secrets = {
        "llmApiKey": "sk-DEBUG-SECRET-1",
        "alibabaCloud": {"accessKeySecret": "AKS-DEBUG-2", "securityToken": "STS-DEBUG-3"},
    }
    assert client.run(run_body("[ECHO] hi", cwd=str(workspace), **secrets)).status == 200
    bad = client.run(run_body(cwd=str(workspace), thinking={"budget": "x"}, **secrets))
    assert bad.status == 400
    wrong = Client(process.url, "not-the-token").run(run_body(cwd=str(workspace)))
    assert wrong.status == 401
    wait_for(lambda: b" 401 " in process.log, 10)  # the last request's access line: the log is complete
    for secret in ("sk-DEBUG-SECRET-1", "AKS-DEBUG-2", "STS-DEBUG-3", "bearer-SECRET-42", "not-the-token"):
        assert secret.encode() not in process.log, secret
    assert b"run " in process.log  # the log is really there


def test_cancel_endpoint_edge_errors(make_adapter: Any) -> None:
    adapter = make_adapter(auth_token="tok-cancel")
    url = adapter.url + "extensions/iac-code/v1/executions/e-1/cancel"
    auth = {"Authorization": "Bearer tok-cancel"}
    response = requests.post(url, json={"threadId": "t", "rosInvocationId": "r"}, timeout=5)
    assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHORIZED"
    response = requests.post(url, data="x", headers={**auth, "Content-Type": "text/plain"}, timeout=5)
    assert response.status_code == 415
    response = requests.post(
        url, data=b"{" + b" " * 70000 + b"}", headers={**auth, "Content-Type": "application/json"}, timeout=5
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "REQUEST_TOO_LARGE"
    response = requests.post(url, data=b"{no", headers={**auth, "Content-Type": "application/json"}, timeout=5)
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_JSON"
    response = requests.post(url, json=[1], headers=auth, timeout=5)
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_INPUT"
    response = requests.post(url, json={"threadId": "t", "rosInvocationId": ""}, headers=auth, timeout=5)
    assert response.status_code == 400 and "rosInvocationId" in response.json()["error"]["message"]
    response = requests.post(url, json={"threadId": "t", "rosInvocationId": "r"}, headers=auth, timeout=5)
    assert response.status_code == 404 and response.json()["error"]["code"] == "EXECUTION_NOT_FOUND"


def test_run_errors_are_in_the_request_language(client: Client, workspace: Path) -> None:
    result = client.run(run_body("[FAIL]", cwd=str(workspace), preferredLanguage="zh-CN"))
    error = result.terminal
    assert error["type"] == "RUN_ERROR" and error["code"] == "A2A_EXECUTION_FAILED"
    expected = client_translate("zh", "The A2A execution failed: {detail}").split("{detail}")[0]
    assert error["message"].startswith(expected)
    result = client.run(run_body("[FAIL]", cwd=str(workspace)), headers={"Accept-Language": "fr-FR, en;q=0.5"})
    expected = client_translate("fr", "The A2A execution failed: {detail}").split("{detail}")[0]
    assert result.terminal["message"].startswith(expected)
