"""The checks a request's head and body go through before a route uses them (``web.app``).

Moved out of ``AguiApp`` so the app keeps to routing and its endpoints: the bearer token
(compared in constant time), the JSON content type, an ``Accept`` that takes the event stream,
a body read within its limit (the declared ``Content-Length`` refused at once when over it, a
body cut short or badly chunked answered as invalid JSON), and strict UTF-8 JSON. Each failure
is an ``AguiError`` with its catalog message; the app answers it in the request's language.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

from werkzeug.datastructures import MIMEAccept
from werkzeug.exceptions import HTTPException
from werkzeug.http import parse_accept_header
from werkzeug.wsgi import get_input_stream

from agui_adapter.ops import speedups
from agui_adapter.protocol import catalog as msg
from agui_adapter.protocol.errors import AguiError, Code

log = logging.getLogger("agui_adapter.web.app")

_READ_CHUNK = 64 * 1024
#: ``Accept`` values that obviously take the stream (parsing them would say the same).
STREAM_ACCEPTED = frozenset(("text/event-stream", "*/*", "text/event-stream, */*"))


def check_auth(environ: dict[str, Any], auth_token: bytes) -> None:
    """The request's bearer token, when the app has one (``auth_token``, empty: none)."""
    if not auth_token:
        return
    header = environ.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.encode("utf-8"), auth_token)
    if not ok:
        raise AguiError(Code.UNAUTHORIZED, msg.UNAUTHORIZED)


def check_content_type(environ: dict[str, Any]) -> None:
    content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise AguiError(Code.UNSUPPORTED_MEDIA_TYPE, msg.UNSUPPORTED_MEDIA_TYPE)


def check_accept(environ: dict[str, Any]) -> None:
    accept = environ.get("HTTP_ACCEPT", "").strip()
    if not accept or accept in STREAM_ACCEPTED:
        return
    # Werkzeug drops items whose q is not a number in [0, 1] (inf, nan, 2) and lets the
    # most specific range decide: "text/event-stream;q=0, */*" refuses the stream.
    ranges = parse_accept_header(accept, MIMEAccept)
    if ranges.best_match(("text/event-stream",)) is not None:
        return
    # Werkzeug matches media type parameters exactly: "text/event-stream; charset=utf-8"
    # names the stream too.
    for item, q in ranges:
        if q > 0 and item.partition(";")[0].strip().lower() == "text/event-stream":
            return
    raise AguiError(Code.NOT_ACCEPTABLE, msg.NOT_ACCEPTABLE)


def read_body(environ: dict[str, Any], limit: int, too_large: str) -> bytes:
    length = environ.get("CONTENT_LENGTH", "")
    if length:
        try:
            declared = int(length)
        except ValueError:
            declared = -1
        if declared > limit:
            raise AguiError(Code.REQUEST_TOO_LARGE, too_large, {"limit": limit})
    if environ.get("wsgi.input_terminated"):  # what get_input_stream would answer, cheaper
        stream = environ["wsgi.input"]
    else:
        stream = get_input_stream(environ, safe_fallback=False, max_content_length=None)
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = stream.read(_READ_CHUNK)
        except (HTTPException, OSError, ValueError):
            # The client went away mid-body, or sent a bad chunk header: whatever
            # arrived is not a whole JSON document.
            log.info("request body incomplete or malformed")
            raise AguiError(Code.INVALID_JSON, msg.INVALID_JSON) from None
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise AguiError(Code.REQUEST_TOO_LARGE, too_large, {"limit": limit})
        chunks.append(chunk)
    return b"".join(chunks)


#: The bodies orjson parses first; a larger one is mostly the strings of its images, which
#: orjson parses no faster than the standard library (measured: 5.2 against 4.9 ms a MiB).
FAST_JSON_BYTES = 64 * 1024
#: Each digit "0", any other byte a space: a run of 19 zeros is a number of 19 digits or more,
#: which orjson turns into a float when it is an integer beyond 64 bits (the standard library
#: keeps it exact).
_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_NUMBER = b"0" * 19


def parse_json(body: bytes, invalid: str) -> Any:
    """The JSON document ``body`` (strict UTF-8), else ``AguiError(INVALID_JSON, invalid)``.

    With the "speedups" extra, orjson parses a small body first (about a quarter of the
    standard library's time; a refusal costs some 3% less); what it refuses (NaN, a number
    beyond a float, a lone surrogate escape, nesting deeper than 1,024) or would turn into
    something else (an integer beyond 64 bits, which it makes a float) goes to the standard
    library, which decides as it always did: the answer is the standard library's for every
    body (``tests/unit/test_request_json.py``), only sooner.
    """
    fast = speedups.orjson_loads()
    if fast is not None and len(body) <= FAST_JSON_BYTES and _LONG_NUMBER not in body.translate(_DIGITS):
        try:
            return fast(body)
        except ValueError:  # orjson.JSONDecodeError
            pass
    try:
        # strict UTF-8 first: json.loads(bytes) would let encoded surrogates through
        payload = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise AguiError(Code.INVALID_JSON, invalid) from None
    return payload
