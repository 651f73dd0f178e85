"""The client module in headless Chromium: imported cross-origin from the adapter, it follows a run.

A page of another origin (a small server here) imports ``/agui-adapter-client.mjs`` from the
adapter (allowed by ``--cors-origins``), as a web app would, and follows a live run with
``followRun`` through ``CuttingProxy``, which cuts the stream twice: the browser's ``fetch``
resumes it with ``Last-Event-ID`` (after a CORS preflight), and every event arrives once, in order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.scripted_kernel import ScriptedKernel
from tests.support.agui_client import Client, LiveStream, run_body
from tests.support.browser import console_errors, require_selenium
from tests.support.cutting_proxy import CuttingProxy
from tests.support.flow import KERNEL_TOKEN

require_selenium()  # without it: skipped, or failed under CI=true

pytestmark = pytest.mark.browser

PAGE = b"""<!doctype html><meta charset="utf-8"><title>an app of another origin</title><p>app</p>"""

FOLLOW = """
const [base, threadId, runId, lastEventId, done] = arguments;
import(base + "agui-adapter-client.mjs").then((m) => {
  const seen = { exports: Object.keys(m).sort(), ids: [], types: [] };
  m.followRun(base, {
    threadId, runId, lastEventId,
    reconnect: { initialDelayMs: 50, maxDelayMs: 400 },
    onEvent: (event, id) => { seen.ids.push(id); seen.types.push(event.type); },
  }).then((terminal) => done({ ...seen, terminal: terminal && terminal.type }),
          (error) => done({ ...seen, error: String(error) }));
}, (error) => done({ error: "import failed: " + String(error) }));
"""


@pytest.fixture(scope="module")
def scripted_kernel() -> Iterator[ScriptedKernel]:
    """Faster than the console's: ``[SLOW]`` is ten deltas 0.2 s apart."""
    kernel = ScriptedKernel(KERNEL_TOKEN, delay_scale=0.2)
    kernel.start()
    yield kernel
    kernel.stop()


@pytest.fixture
def app_origin() -> Iterator[str]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_page_of_another_origin_imports_the_module_and_follows_a_run_across_cuts(
    browser: Any, make_adapter: Any, app_origin: str, workspace: Path
) -> None:
    adapter = make_adapter(cors_origins=app_origin, disconnect_grace_seconds=10.0)
    body = run_body("[SLOW] go", cwd=str(workspace))
    other = LiveStream(Client(adapter.url), body)  # the run, started by another client
    seen = other.read_events(2)
    port = int(adapter.url.rstrip("/").rsplit(":", 1)[1])
    proxy = CuttingProxy(("127.0.0.1", port), [500, 400])
    browser.get(app_origin + "/")
    browser.set_script_timeout(60)
    report = browser.execute_async_script(FOLLOW, proxy.url, body["threadId"], body["runId"], seen[-1][0])
    assert "error" not in report, report
    for name in ("withAdapter", "getThread", "followRun", "cancelExecution", "SSEParser"):
        assert name in report["exports"]
    whole = [event for _, event in Client(adapter.url).events(body["threadId"], body["runId"]).rest()]
    assert report["ids"] == list(range(seen[-1][0] + 1, len(whole) + 1))
    assert report["types"] == [e["type"] for e in whole[seen[-1][0] :]]
    assert report["terminal"] == "RUN_FINISHED"
    assert proxy.cut_count == 2
    gets = [r for r in proxy.requests if r.method == "GET" and r.path.endswith("/events")]
    assert len(gets) == 3 and all(r.last_event_id and int(r.last_event_id) >= seen[-1][0] for r in gets)
    assert any(r.method == "OPTIONS" for r in proxy.requests)  # Last-Event-ID needs a preflight
    # the browser logs each cut as a failed load; nothing else may be in the console
    errors = console_errors(browser)
    cut = [e for e in errors if "/events - Failed to load resource: net::ERR_INCOMPLETE_CHUNKED_ENCODING" in e]
    assert len(cut) == 2 and errors == cut, errors
    other.close()
