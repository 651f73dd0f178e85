"""Adoption under gunicorn (issue 22): a worker that dies mid-run does not cost the run.

gunicorn ``-w 2`` on one state directory, the scripted kernel outliving the workers. The
worker running a run (the process holding its journal's lock, ``/proc/locks``) is killed with
``kill -9`` (its stream is cut), or recycled by ``--max-requests 1`` (a gthread worker lets its
open streams end before it exits: observed, the run then simply ends there). A cut client
reattaches with ``Last-Event-ID`` and whichever worker serves it (the other one, or the one
gunicorn started in place of the dead one) has adopted the run (``agui_adapter/adoption.py``)
and follows it to its end: the pieces joined on their ids are one valid run with the kernel's
whole text.

Run with ``pytest -m wsgi_servers tests/compat/test_wsgi_adoption.py``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from agui_adapter.kernel.scripts import SLOW_PIECES
from agui_adapter.store import thread_key
from tests.support.agui_client import Client, LiveStream, joined, run_body

from .test_wsgi_servers import _lock_holder, _serve

pytestmark = pytest.mark.wsgi_servers


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def _come_back(url: str, body: dict[str, Any], after: int, timeout: float = 30.0) -> list[tuple[int, dict[str, Any]]]:
    """Reattach until the run ends: a stream cut by a dying worker is reattached again."""
    pieces: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stream = Client(url).events(body["threadId"], body["runId"], after)
        if stream.status == 204:
            return pieces
        assert stream.status == 200, stream.response.text
        try:
            got = stream.rest()
        except Exception:  # noqa: BLE001 - the worker died under the stream: come back again
            got = []
        pieces += got
        if pieces and pieces[-1][1]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
            return pieces
        after = pieces[-1][0] if pieces else after
        time.sleep(0.2)
    raise AssertionError("the run did not end")


@pytest.mark.parametrize("how", ["kill-9", "max-requests-1"])
def test_a_worker_that_dies_mid_run_is_replaced_by_an_adopter(
    tmp_path_factory: Any, scripted_kernel: Any, how: str
) -> None:
    extra = ("--max-requests", "1") if how == "max-requests-1" else ()
    server = _serve("gunicorn", tmp_path_factory, scripted_kernel, 2, {"IAC_CODE_AGUI_LOG_FORMAT": "json"}, extra)
    try:
        body = run_body("[SILENT 200] [SLOW] go", cwd=str(server.workspace))  # 10 s of silence, then text
        own = LiveStream(Client(server.url), body)
        own.session()
        seen = own.read_events(2)
        state = server.log_path.parent / "state"
        directory = state / "journal" / thread_key(body["threadId"]) / thread_key(body["runId"])
        writer = _lock_holder(directory)
        if how == "kill-9":
            os.kill(writer, signal.SIGKILL)
        # max-requests 1: the worker stops by itself after its graceful timeout (5 s)
        try:
            seen += own.rest()  # cut: no terminal event
        except Exception:  # noqa: BLE001 - the connection may be reset
            pass
        cut = seen[-1][1]["type"] not in ("RUN_FINISHED", "RUN_ERROR")
        # kill -9 cuts the stream; a recycled gthread worker lets its open streams end first
        assert cut or how == "max-requests-1"
        rest = _come_back(server.url, body, seen[-1][0], timeout=60) if cut else []
        events = joined(seen, rest)
        assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}, server.log()
        assert _text(events) == "".join(SLOW_PIECES)
        assert not cut or "adopted after event" in server.log_path.read_text(errors="replace")
        # either way the thread is free and the next turn runs, on whichever worker
        nxt = Client(server.url).run(run_body("next", thread_id=body["threadId"], cwd=str(server.workspace)))
        assert nxt.terminal["type"] == "RUN_FINISHED"
    finally:
        server.stop()
