"""The nginx recipes of ``deploy/`` agree with the adapter's defaults (read without nginx).

Their behaviour is proven with the real nginx by ``tests/compat/test_deploy_nginx.py``
(marker ``nginx``); these checks keep their numbers tied to the adapter's: nginx must wait
longer than a heartbeat, drop idle upstream connections before the adapter does, and accept
every body the adapter accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agui_adapter.config import Settings
from agui_adapter.web.app import MAX_RUN_BODY

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RECIPES = ("nginx-tls.conf", "nginx-sticky-threads.conf")
_UNITS = {"": 1, "s": 1, "m": 60, "k": 1024}


def _directive(text: str, name: str) -> list[str]:
    return re.findall(rf"^\s*{name}\s+([^;{{}}\n]+);", text, flags=re.MULTILINE)


def _seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([sm]?)", value).groups()  # type: ignore[union-attr]
    return int(number) * _UNITS[unit]


@pytest.mark.parametrize("recipe", RECIPES)
def test_streams_are_neither_buffered_nor_compressed(recipe: str) -> None:
    text = (DEPLOY / recipe).read_text()
    assert _directive(text, "proxy_buffering") == ["off"]
    assert _directive(text, "gzip") == ["off"]
    assert _directive(text, "proxy_http_version") == ["1.1"]
    assert _directive(text, "proxy_set_header Connection") == ['""']


@pytest.mark.parametrize("recipe", RECIPES)
def test_nginx_waits_longer_than_a_heartbeat(recipe: str) -> None:
    [read_timeout] = _directive((DEPLOY / recipe).read_text(), "proxy_read_timeout")
    assert _seconds(read_timeout) >= 4 * Settings().heartbeat_seconds


@pytest.mark.parametrize("recipe", RECIPES)
def test_idle_upstream_connections_end_on_the_nginx_side_first(recipe: str) -> None:
    [keepalive] = _directive((DEPLOY / recipe).read_text(), "keepalive_timeout")
    assert _seconds(keepalive) < Settings().keepalive_timeout_seconds


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_body_the_adapter_accepts_gets_through(recipe: str) -> None:
    [size] = _directive((DEPLOY / recipe).read_text(), "client_max_body_size")
    number, unit = re.fullmatch(r"(\d+)([km])", size).groups()  # type: ignore[union-attr]
    assert int(number) * {"k": 1024, "m": 1024 * 1024}[unit] > MAX_RUN_BODY


def test_threads_are_hashed_by_their_header_and_never_moved() -> None:
    text = (DEPLOY / "nginx-sticky-threads.conf").read_text()
    assert _directive(text, "hash") == ["$http_x_agui_thread_id consistent"]
    assert _directive(text, "proxy_next_upstream") == ["off"]
    servers = _directive(text, "server")
    assert len(servers) >= 2 and all("max_fails=0" in s.split() for s in servers)


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_request_id_is_passed_on(recipe: str) -> None:
    text = (DEPLOY / recipe).read_text()
    [header] = _directive(text, "proxy_set_header X-Request-ID")
    variable = header.strip()
    assert re.search(rf"map \$http_x_request_id {re.escape(variable)} \{{", text), variable


def test_the_routes_of_a_thread_need_its_header() -> None:
    """Every thread-bound route of the adapter is in the recipe's map; the rest is not."""
    text = (DEPLOY / "nginx-sticky-threads.conf").read_text()
    block = text[text.index('map "$request_method $uri" $agui_thread_bound {') :]
    block = block[: block.index("}")]
    patterns = [p.strip('"') for p in re.findall(r'^\s*("[^"]+")\s+1;', block, flags=re.MULTILINE)]

    def bound(method: str, path: str) -> bool:
        line = f"{method} {path}"
        return any(re.search(p[1:], line) if p.startswith("~") else p == line for p in patterns)

    assert bound("POST", "/")
    assert bound("POST", "/extensions/iac-code/v1/executions/ex-1/cancel")
    for method, path in (("GET", "/threads/t1"), ("GET", "/threads/t1/messages"), ("GET", "/threads/t/runs/r/events")):
        assert bound(method, path), path
    for method, path in (
        ("GET", "/"),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", "/metrics"),
        ("GET", "/agui-adapter-client.mjs"),
        ("OPTIONS", "/"),
        ("OPTIONS", "/threads/t1"),
    ):
        assert not bound(method, path), (method, path)
    assert re.search(r'map "\$agui_thread_bound:\$http_x_agui_thread_id" \$agui_thread_header_missing', text)
    assert "if ($agui_thread_header_missing)" in text and 'return 400 \'{"error":{"code":"INVALID_INPUT"' in text
