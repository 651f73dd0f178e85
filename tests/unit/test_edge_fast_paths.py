"""The HTTP edge's shortcuts answer what the general code would.

``web.FIXED_ROUTES`` skips binding the Werkzeug ``Map`` for the fixed routes and
``request_checks.STREAM_ACCEPTED`` skips parsing the most common ``Accept`` values: both must give the
answer of the code they shortcut, or the shortcut changes behaviour.
"""

from __future__ import annotations

import pytest
from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

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
