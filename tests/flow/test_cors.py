"""CORS over a real socket: preflights without the bearer token, actual responses (streams and
every JSON error) for allowed origins, nothing for the others, nothing at all when off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from agui_adapter.kernel_client.launch import KernelProcess, free_port
from tests.support.agui_client import Client, run_body
from tests.support.servers import InProcessAdapter

ALLOWED = "https://app.example"
CANCEL = "extensions/iac-code/v1/executions/e-1/cancel"
REQUIRED_HEADERS = {"authorization", "content-type", "accept", "accept-language", "last-event-id", "x-request-id"}


def preflight(url: str, origin: str, method: str = "POST") -> requests.Response:
    return requests.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": "authorization, content-type, x-request-id",
        },
        timeout=10,
    )


def allow_headers(response: requests.Response) -> set[str]:
    return {h.strip().lower() for h in response.headers.get("Access-Control-Allow-Headers", "").split(",")}


def cors_headers(response: requests.Response | dict[str, str]) -> set[str]:
    headers = response.headers if isinstance(response, requests.Response) else response
    return {name.lower() for name in headers if name.lower().startswith("access-control-allow-")}


def assert_actual(headers: dict[str, str] | Any, origin: str = ALLOWED) -> None:
    assert headers["Access-Control-Allow-Origin"] == origin
    assert "Origin" in headers["Vary"]
    exposed = {h.strip().lower() for h in headers["Access-Control-Expose-Headers"].split(",")}
    assert {"x-request-id", "retry-after"} <= exposed


@pytest.fixture
def cors_adapter(make_adapter: Any) -> Any:
    return make_adapter(cors_origins=f"{ALLOWED}, https://other.example", auth_token="cors-secret-token")


@pytest.mark.parametrize("path", ["", CANCEL])
def test_preflight_for_an_allowed_origin_needs_no_token(cors_adapter: Any, path: str) -> None:
    response = preflight(cors_adapter.url + path, ALLOWED)
    assert response.status_code == 204 and response.content == b""
    assert response.headers["Access-Control-Allow-Origin"] == ALLOWED
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    assert REQUIRED_HEADERS <= allow_headers(response)
    assert int(response.headers["Access-Control-Max-Age"]) > 0
    assert "Origin" in response.headers["Vary"]


def test_actual_responses_to_an_allowed_origin(cors_adapter: Any, workspace: Path) -> None:
    origin = {"Origin": ALLOWED}
    stream = Client(cors_adapter.url, "cors-secret-token").run(run_body(cwd=str(workspace)), headers=origin)
    assert stream.status == 200 and stream.terminal["type"] == "RUN_FINISHED"
    assert_actual(stream.headers)
    unauthorized = Client(cors_adapter.url).run(run_body(cwd=str(workspace)), headers=origin)
    assert unauthorized.status == 401
    assert_actual(unauthorized.headers)
    invalid = Client(cors_adapter.url, "cors-secret-token").run(b"{nope", headers=origin)
    assert invalid.status == 400
    assert_actual(invalid.headers)
    health = requests.get(cors_adapter.url + "health", headers=origin, timeout=10)
    assert_actual(health.headers)


def test_a_503_to_an_allowed_origin_carries_cors(cors_adapter: Any) -> None:
    dead = InProcessAdapter(cors_adapter.settings, KernelProcess(f"http://127.0.0.1:{free_port()}/", "x", "dead"))
    try:
        response = requests.get(dead.url + "ready", headers={"Origin": ALLOWED}, timeout=10)
        assert response.status_code == 503
        assert_actual(response.headers)
    finally:
        dead.stop()


def test_an_origin_not_allowed_gets_no_cors_headers(cors_adapter: Any, workspace: Path) -> None:
    evil = "https://evil.example"
    response = preflight(cors_adapter.url, evil)
    assert response.status_code == 204 and not cors_headers(response)
    result = Client(cors_adapter.url, "cors-secret-token").run(run_body(cwd=str(workspace)), headers={"Origin": evil})
    assert result.status == 200 and not cors_headers(result.headers)
    refused = Client(cors_adapter.url).run(run_body(cwd=str(workspace)), headers={"Origin": evil})
    assert refused.status == 401 and not cors_headers(refused.headers)
    # a prefix or a different scheme of an allowed origin is another origin
    for other in (ALLOWED + ".evil", "http://app.example", ALLOWED + ":8443"):
        assert not cors_headers(preflight(cors_adapter.url, other))


def test_any_origin(make_adapter: Any) -> None:
    adapter = make_adapter(cors_origins="*")
    response = preflight(adapter.url, "https://anything.example")
    assert response.status_code == 204
    assert response.headers["Access-Control-Allow-Origin"] == "https://anything.example"


def test_without_cors_origins_there_is_no_cors(adapter: Any, client: Client, workspace: Path) -> None:
    response = preflight(adapter.url, ALLOWED)
    assert response.status_code == 405 and not cors_headers(response)
    result = client.run(run_body(cwd=str(workspace)), headers={"Origin": ALLOWED})
    assert result.status == 200 and not cors_headers(result.headers)
    assert "Access-Control-Expose-Headers" not in result.headers
