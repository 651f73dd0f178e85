"""The console page at ``GET /``: served to browsers, self-contained, shipped as package data.

Any other ``GET /`` (no ``text/html`` in ``Accept``), ``HEAD /`` and ``POST /`` keep the answers
they had before the page existed. What the page does in a browser is tested in tests/browser/.
"""

from __future__ import annotations

import configparser
import fnmatch
import re
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def test_a_browser_gets_the_console_page(adapter: Any) -> None:
    response = requests.get(adapter.url, headers={"Accept": BROWSER_ACCEPT}, timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    page = response.text
    assert page.startswith("<!doctype html>") and "agui-adapter console" in page
    assert int(response.headers["Content-Length"]) == len(response.content)
    # self-contained: no URL of another origin, no external script, style sheet or image
    assert re.search(r"(?i)\b(?:https?:|wss?:|ftp:)//", page) is None
    assert re.search(r"(?i)<script[^>]*\bsrc\s*=", page) is None
    for ref in re.findall(r"""(?i)\b(?:href|src|action)\s*=\s*["']([^"']*)["']""", page):
        assert ref.startswith("data:") or ref.startswith("/") and not ref.startswith("//"), ref
    assert re.search(r"(?i)@import|url\(\s*['\"]?(?!data:)", page) is None
    # and the browser is told so: the page may talk to its own origin only
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    # its one import is the client module, from its own origin (script-src 'self' allows no more)
    assert re.findall(r"""\bfrom\s+["']([^"']+)["']|\bimport\s*\(""", page) == ["/agui-adapter-client.mjs"]
    assert "script-src 'self' 'unsafe-inline';" in policy
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_text_html_must_be_acceptable(adapter: Any) -> None:
    refused = requests.get(adapter.url, headers={"Accept": "text/html;q=0, application/json"}, timeout=5)
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_other_requests_to_the_root_are_unchanged(adapter: Any) -> None:
    for accept in (None, "*/*", "application/json", "text/event-stream", "text/*"):
        headers = {"Accept": accept} if accept else {}
        if accept is None:
            headers["Accept"] = ""  # requests sends */* unless told otherwise
        response = requests.get(adapter.url, headers=headers, timeout=5)
        assert response.status_code == 405, accept
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
        assert response.headers["Allow"] == "POST"
    head = requests.head(adapter.url, headers={"Accept": "text/html"}, timeout=5)
    assert head.status_code == 405 and head.headers["Allow"] == "POST"
    # POST / still negotiates the stream: text/html alone is not acceptable for it
    post = requests.post(adapter.url, json={}, headers={"Accept": "text/html"}, timeout=5)
    assert post.status_code == 406 and post.json()["error"]["code"] == "NOT_ACCEPTABLE"


def test_the_page_is_package_data() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = config["options.package_data"]["agui_adapter"].split()
    package = ROOT / "agui_adapter"
    shipped = [p.relative_to(package).as_posix() for p in (package / "web" / "console").rglob("*") if p.is_file()]
    assert "index.html" in [Path(p).name for p in shipped]
    for path in shipped:
        assert any(fnmatch.fnmatch(path, pattern) for pattern in patterns), path
