"""The client modules at ``GET /agui-adapter-client.mjs`` and ``/agui-adapter-agent.mjs``.

What the modules do in Node with ``@ag-ui/client`` is tested in tests/compat/test_client_module.py;
here: they are served as shipped, as JavaScript, without a token, revalidated with an ETag, and
the agent module imports the client module relatively (so a browser's import map resolves it
against the adapter's URL).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["agui-adapter-client.mjs", "agui-adapter-agent.mjs"]


@pytest.mark.parametrize("name", NAMES)
def test_each_module_is_served_as_shipped_without_a_token(make_adapter: Any, name: str) -> None:
    adapter = make_adapter(auth_token="module-test-token")
    response = requests.get(adapter.url + name, timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.content == (ROOT / "agui_adapter" / "web" / "console" / name).read_bytes()
    assert int(response.headers["Content-Length"]) == len(response.content)
    # revalidation: the same ETag is 304 without a body, weak or in a list; another one is 200
    etag = response.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = requests.get(adapter.url + name, headers={"If-None-Match": header}, timeout=5)
        assert again.status_code == 304 and again.content == b"", header
        assert again.headers["ETag"] == etag
    changed = requests.get(adapter.url + name, headers={"If-None-Match": '"other"'}, timeout=5)
    assert changed.status_code == 200 and changed.content == response.content
    head = requests.head(adapter.url + name, timeout=5)
    assert head.status_code == 200 and head.content == b"" and head.headers["ETag"] == etag


def test_the_two_modules_differ_and_other_paths_stay_404(adapter: Any) -> None:
    etags = {requests.get(adapter.url + name, timeout=5).headers["ETag"] for name in NAMES}
    assert len(etags) == 2
    for path in ("agui-adapter-client.js", "console/agui-adapter-client.mjs", "agui-adapter-client.mjs/x"):
        response = requests.get(adapter.url + path, timeout=5)
        assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND", path
    post = requests.post(adapter.url + NAMES[0], data=b"{}", timeout=5)
    assert post.status_code == 405 and "GET" in post.headers["Allow"]


def test_a_page_of_an_allowed_origin_may_import_them(make_adapter: Any) -> None:
    adapter = make_adapter(cors_origins="https://app.example")
    response = requests.get(adapter.url + NAMES[0], headers={"Origin": "https://app.example"}, timeout=5)
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"


def test_the_modules_are_self_contained_es_modules() -> None:
    client = (ROOT / "agui_adapter" / "web" / "console" / NAMES[0]).read_text(encoding="utf-8")
    agent = (ROOT / "agui_adapter" / "web" / "console" / NAMES[1]).read_text(encoding="utf-8")
    # the client module has no dependency: no import at all (nothing for a browser to resolve)
    assert re.search(r"(?m)^\s*import\b|\bimport\s*\(", client) is None
    for name in ("withAdapter", "getThread", "followRun", "cancelExecution", "SSEParser"):
        assert re.search(rf"(?m)^export (?:async )?(?:function\*? |class |const ){name}\b", client), name
    # the agent module: HttpAgent from the package, the rest relative to its own URL
    imports = re.findall(r"""(?m)^import .* from "([^"]+)";$""", agent)
    assert imports == ["@ag-ui/client", "./agui-adapter-client.mjs"]
    assert "export class AdapterHttpAgent extends withAdapter(HttpAgent) {}" in agent
