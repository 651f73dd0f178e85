"""The HTTP edge's shortcuts answer what the general code would.

``web.FIXED_ROUTES`` skips binding the Werkzeug ``Map`` for the fixed routes,
``request_checks.STREAM_ACCEPTED`` skips parsing the most common ``Accept`` values,
``rules.error_body`` writes a refusal's body without a JSON encoder (both ways: the
application's, and the server's own, which escapes what is not ASCII), the request parser
remembers the ``Host`` values it found valid, and a metric's labels are looked up as given
before they are made strings: each must give the answer of the code it shortcuts, or the
shortcut changes behaviour.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from agui_adapter.http import rules
from agui_adapter.ops.metrics import Metrics
from agui_adapter.protocol.errors import Code
from agui_adapter.web import app as web
from agui_adapter.web import request_checks as checks


@pytest.mark.parametrize(("route", "endpoint"), sorted(web.FIXED_ROUTES.items()))
def test_fixed_routes_are_the_map_s_answer(route: tuple[str, str], endpoint: str) -> None:
    path, method = route
    environ = {
        "PATH_INFO": path,
        "REQUEST_METHOD": method,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "HTTP_HOST": "odd.example:1",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "x=1",
        "wsgi.url_scheme": "http",
    }
    assert web.URLS.bind_to_environ(environ).match() == (endpoint, {})


@pytest.mark.parametrize("accept", sorted(checks.STREAM_ACCEPTED))
def test_accept_shortcuts_are_what_parsing_says(accept: str) -> None:
    assert parse_accept_header(accept, MIMEAccept).best_match(("text/event-stream",)) == "text/event-stream"


def test_request_ids_are_fresh_hex() -> None:
    ids = {web.request_id_for({}) for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


@given(st.sampled_from([v for k, v in vars(Code).items() if k.isupper()]) | st.text(), st.text())
def test_an_error_body_is_what_the_json_encoder_writes(code: str, message: str) -> None:
    try:
        expected: bytes | type[Exception] = web._JSON.encode({"error": {"code": code, "message": message}}).encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: neither can write it
        expected = type(exc)
    if isinstance(expected, bytes):
        assert rules.error_body(code, message, ensure_ascii=False) == expected
    else:
        with pytest.raises(expected):
            rules.error_body(code, message, ensure_ascii=False)


@given(st.sampled_from([v for k, v in vars(Code).items() if k.isupper()]) | st.text(), st.text())
def test_the_server_s_error_body_is_what_json_dumps_writes(code: str, message: str) -> None:
    expected = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    assert rules.error_body(code, message) == expected


def _head(host: str) -> bytes:
    return f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode("latin-1")


@pytest.mark.parametrize("host", ["a b", "x/y", "[::1", "h@st", "q?", 'a"b'])
def test_an_invalid_host_is_refused_every_time_and_never_remembered(host: str) -> None:
    for _ in range(2):
        with pytest.raises(rules.ProtocolError, match="Host"):
            rules.parse_request_head(_head(host), 100)
    assert host not in rules._HOSTS_SEEN


def test_valid_hosts_are_remembered_up_to_a_bound() -> None:
    rules.parse_request_head(_head("seen.example:8000"), 100)
    assert "seen.example:8000" in rules._HOSTS_SEEN
    rules.parse_request_head(_head("seen.example:8000"), 100)  # found, not matched again
    for n in range(300):
        rules.parse_request_head(_head(f"h{n}.example"), 100)
    assert len(rules._HOSTS_SEEN) <= 256
    with pytest.raises(rules.ProtocolError, match="Host"):  # still checked beyond the bound
        rules.parse_request_head(_head("not valid"), 100)


def test_labels_given_as_other_types_are_the_same_series() -> None:
    metrics = Metrics()
    metrics.http_request("run", "400")
    metrics.http_request("run", 400)  # type: ignore[arg-type]
    assert b'agui_http_requests_total{route="run",status="400"} 2.0' in metrics.render()
