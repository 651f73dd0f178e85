"""The console page: a browser's ``GET /`` gets a self-contained page that drives the adapter.

Why a module: the page is package data (``console/index.html``, no build step, nothing fetched
from elsewhere; the one file it imports is the client module beside it, from its own origin at
``GET /agui-adapter-client.mjs``), and whether a ``GET /`` wants it is a content-negotiation
rule of its own.
Everything else that reaches ``GET /`` keeps the JSON ``405 METHOD_NOT_ALLOWED`` answer.
"""

from __future__ import annotations

from functools import lru_cache

from agui_adapter.protocol.i18n import weighted_items

# The page talks only to its own origin; the policy makes that a rule the browser enforces.
# script-src 'self': the page's inline module imports the client module from its own origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

PAGE_HEADERS = [
    ("Content-Type", "text/html; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]


def wants_page(accept: str) -> bool:
    """True when ``accept`` names ``text/html`` explicitly with q > 0 (what browsers send)."""
    return any(q > 0 and media.strip().lower() == "text/html" for media, q in weighted_items(accept or ""))


@lru_cache(maxsize=1)
def page() -> bytes:
    """The console page as shipped in the package."""
    from importlib import resources  # on first use: not needed to start

    return resources.files("agui_adapter.web").joinpath("console", "index.html").read_bytes()
