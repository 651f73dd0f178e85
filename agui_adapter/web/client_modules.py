"""The client modules for web developers, served beside the console.

Why a module: ``console/agui-adapter-client.mjs`` (no dependency: reconnect with
``Last-Event-ID``, ``connect()`` reattach, cancel on abort, over any ``HttpAgent`` class) and
``console/agui-adapter-agent.mjs`` (the same agent built on ``@ag-ui/client``'s ``HttpAgent``) are
package data a browser imports from the adapter itself, so which paths exist, what headers they
carry and how a revalidation is answered is one small rule of its own. Like the console page they
need no bearer token (they hold no data); an ``ETag`` lets browsers revalidate them cheaply.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

#: URL path -> file name in ``agui_adapter/web/console``.
MODULES = {
    "/agui-adapter-client.mjs": "agui-adapter-client.mjs",
    "/agui-adapter-agent.mjs": "agui-adapter-agent.mjs",
}

CONTENT_TYPE = "text/javascript; charset=utf-8"


@lru_cache(maxsize=len(MODULES))
def module(path: str) -> tuple[bytes, str]:
    """The module served at ``path`` as shipped in the package, and its (strong) ETag."""
    from importlib import resources  # on first use: most starts never serve a module

    body = resources.files("agui_adapter.web").joinpath("console", MODULES[path]).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def not_modified(if_none_match: str, etag: str) -> bool:
    """True when ``If-None-Match`` names ``etag`` (weak comparison, as RFC 9110 asks for GET) or is ``*``."""
    tags = [tag.strip() for tag in if_none_match.split(",") if tag.strip()]
    return any(tag == "*" or tag.removeprefix("W/") == etag for tag in tags)


def headers(etag: str, *, modified: bool = True) -> list[tuple[str, str]]:
    """A 200's headers (``modified``) or a 304's: revalidated on each use, never sniffed."""
    kept = [("Cache-Control", "no-cache"), ("ETag", etag)]
    return [("Content-Type", CONTENT_TYPE), *kept, ("X-Content-Type-Options", "nosniff")] if modified else kept
