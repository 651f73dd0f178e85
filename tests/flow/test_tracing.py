"""OpenTelemetry over real sockets: spans recorded by the SDK's in-memory exporter, and the
trace context and request id the scripted kernel received (it records those headers).

The in-process adapter gets a tracer provider of its own (never the global one, so other
tests are not traced). One test runs ``python run.py`` configured only by ``OTEL_*``
variables (the console exporter) to check the set-up from the environment, and one checks
that without them nothing of OpenTelemetry (or prometheus_client) is imported.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.cli import build_app, server_limits
from agui_adapter.http.server import WSGIServer
from agui_adapter.kernel_client.launch import KernelProcess
from agui_adapter.ops import logs, tracing
from tests.support.agui_client import Client, resume, run_body
from tests.support.flow import KERNEL_TOKEN, interrupted, kernel_calls, wait_for
from tests.support.secrets import STATE_DIRS
from tests.support.servers import ROOT

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the test extra has opentelemetry-sdk")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Traced:
    """An in-process adapter whose spans land in ``exporter``."""

    def __init__(self, settings: Any, kernel: KernelProcess) -> None:
        self.exporter = InMemorySpanExporter()
        provider = sdk_trace.TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.app = build_app(settings, kernel, tracing=tracing.OtelTracing(provider))
        self.server = WSGIServer("127.0.0.1", 0, self.app, server_limits(settings))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def traced(tmp_path: Path, scripted_kernel: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    from agui_adapter.config import Settings

    monkeypatch.setattr(logs, "trace_ids", None)  # OtelTracing sets it for its log lines; put it back after
    settings = Settings(state_dir=str(tmp_path / "state"), allowed_cwds=str(tmp_path))
    STATE_DIRS.append(Path(settings.state_dir))
    adapter = Traced(settings, KernelProcess(scripted_kernel.url, KERNEL_TOKEN, "scripted"))
    yield adapter
    adapter.stop()


def _hex(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def _run_spans(adapter: Traced, run_id: str) -> tuple[Any, list[Any]]:
    """The run's span (once it ended) and every span of its trace."""

    def ended() -> Any:
        runs = [s for s in adapter.spans() if s.name == "agui.run" and s.attributes.get("agui.run_id") == run_id]
        return runs[0] if runs else None

    run = wait_for(ended)
    request = wait_for(lambda: [s for s in adapter.spans() if s.context.span_id == run.parent.span_id])
    assert request
    return run, [s for s in adapter.spans() if s.context.trace_id == run.context.trace_id]


def test_a_run_continues_the_client_trace_and_passes_it_to_the_kernel(
    traced: Traced, workspace: Path, scripted_kernel: Any
) -> None:
    body = run_body("[TOOL] hello", cwd=str(workspace))
    headers = {
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "tracestate": "vendor=opaque",
        "X-Request-ID": "req-traced-1",
    }
    result = Client(traced.url).run(body, headers=headers)
    assert result.terminal["type"] == "RUN_FINISHED"
    run, spans = _run_spans(traced, body["runId"])
    assert _hex(run.context.trace_id, 32) == CLIENT_TRACE  # continued, not a new trace

    [request] = [s for s in spans if s.kind == SpanKind.SERVER]
    assert request.name == "POST /"
    assert _hex(request.parent.span_id, 16) == CLIENT_SPAN and request.parent.is_remote
    assert request.attributes["http.response.status_code"] == 200
    assert run.parent.span_id == request.context.span_id
    assert run.attributes["agui.thread_id"] == body["threadId"]
    assert run.attributes["agui.mode"] == "turn" and run.attributes["agui.outcome"] == "success"
    assert run.attributes["agui.events_sent"] == len(result.events)

    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == run.context.span_id}
    for name in ("agui.admission", "agui.first_event", "A2A SendStreamingMessage"):
        assert name in children, sorted(children)
    call = children["A2A SendStreamingMessage"]
    assert call.kind == SpanKind.CLIENT and call.attributes["rpc.method"] == "SendStreamingMessage"
    writes = [s for s in spans if s.name == "agui.state_write"]
    assert writes, "no state write span"
    ancestors = {run.context.span_id, children["agui.admission"].context.span_id}
    assert all(w.parent.span_id in ancestors for w in writes)  # the admission's write, and the run's own
    assert run.start_time <= children["agui.first_event"].end_time <= run.end_time

    # the kernel got the call's own span as parent, the client's tracestate, and the request id
    [sent] = [c for c in kernel_calls(scripted_kernel, "SendStreamingMessage") if _of(c, body)]
    got = sent["headers"]
    assert got["traceparent"] == f"00-{CLIENT_TRACE}-{_hex(call.context.span_id, 16)}-01"
    assert got["tracestate"] == "vendor=opaque"
    assert got["x-request-id"] == "req-traced-1" == result.headers["X-Request-ID"]


def _of(call: dict[str, Any], body: dict[str, Any]) -> bool:
    message = call["params"].get("message", {})
    return body["threadId"] in json.dumps(message.get("metadata", {})) or any(
        body["messages"][0]["content"] == part.get("text") for part in message.get("parts", [])
    )


def test_without_a_traceparent_a_trace_starts_and_every_kernel_call_carries_it(
    traced: Traced, workspace: Path, scripted_kernel: Any
) -> None:
    client = Client(traced.url)
    body, first = interrupted(client, workspace)
    run, spans = _run_spans(traced, body["runId"])
    [request] = [s for s in spans if s.kind == SpanKind.SERVER]
    assert request.parent is None  # a new trace
    assert run.attributes["agui.outcome"] == "interrupt"
    trace_id = _hex(run.context.trace_id, 32)
    calls = [c for c in scripted_kernel.requests if trace_id in (c["headers"].get("traceparent") or "")]
    assert calls and all(c["headers"]["x-request-id"] == first.headers["X-Request-ID"] for c in calls)

    # the resume is a run of its own, in its own trace, a resume by mode
    [interrupt] = first.terminal["outcome"]["interrupts"]
    answer = resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "deny"}}])
    answered = client.run(answer)
    assert answered.terminal["type"] == "RUN_FINISHED", answered.terminal
    resumed, _ = _run_spans(traced, answer["runId"])
    assert resumed.attributes["agui.mode"] == "resume"
    assert resumed.context.trace_id != run.context.trace_id


def test_a_refusal_ends_the_run_span_in_error_but_not_the_request_span(traced: Traced, workspace: Path) -> None:
    client = Client(traced.url)
    body, _ = interrupted(client, workspace)
    again = client.run(run_body("next", thread_id=body["threadId"], cwd=str(workspace)))
    assert again.status == 409 and again.error["code"] == "RESUME_REQUIRED"
    run = wait_for(
        lambda: [s for s in traced.spans() if s.name == "agui.run" and s.status.description == "RESUME_REQUIRED"]
    )
    assert run[0].status.status_code.name == "ERROR"
    [request] = wait_for(lambda: [s for s in traced.spans() if s.context.span_id == run[0].parent.span_id])
    assert request.attributes["http.response.status_code"] == 409
    assert request.status.status_code.name == "UNSET"  # a 4xx is the client's, not the server's error


def test_json_log_lines_carry_the_trace_and_span_ids(traced: Traced, workspace: Path) -> None:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.addFilter(logs.RunContext())
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger("agui_adapter")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        body = run_body("hello", cwd=str(workspace))
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        assert Client(traced.url).run(body, headers=headers).status == 200
        run, _ = _run_spans(traced, body["runId"])
        entries = wait_for(lambda: [json.loads(r) for r in records if '"route": "run"' in r])
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(r) for r in records]
    summary = [e for e in lines if e.get("run_id") == body["runId"] and "outcome" in e]
    assert summary and summary[0]["trace_id"] == CLIENT_TRACE
    assert summary[0]["span_id"] == _hex(run.context.span_id, 16)  # written while the run's span is current
    [access] = entries
    assert access["trace_id"] == CLIENT_TRACE and access["status"] == 200 and access["run_id"] == body["runId"]


def test_tracing_is_off_and_imports_nothing_without_otel_variables() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_SERVICE_NAME": "adapter"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "adapter", "OTEL_SDK_DISABLED": "true"})
    check = (
        "import sys\n"
        "from agui_adapter.config import Settings\n"
        "from agui_adapter.kernel_client.launch import KernelProcess\n"
        "from agui_adapter.cli import build_app\n"
        "app = build_app(Settings(state_dir=sys.argv[1]), KernelProcess('http://127.0.0.1:9/', 't', 'configured'))\n"
        "app.engine.metrics.http_request('health', '200')\n"
        "assert not app.tracing.enabled\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'prometheus_client'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["PYTHONPATH"] = str(ROOT)
    with_state = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"agui-otel-off-{os.getpid()}")
    subprocess.run([sys.executable, "-c", check, with_state], env=env, check=True, cwd=ROOT, timeout=60)


def test_the_sdk_is_set_up_from_otel_variables(adapter_process: Any, workspace: Path) -> None:
    process = adapter_process(
        "--log-format",
        "json",
        env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "agui-test", "OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    body = run_body("hello", cwd=str(workspace))
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    assert Client(process.url).run(body, headers=headers).status == 200
    wait_for(lambda: b'"name": "agui.run"' in process.log and b'"name": "A2A SendStreamingMessage"' in process.log)
    assert f'"trace_id": "0x{CLIENT_TRACE}"'.encode() in process.log  # the console exporter's spans
    assert b'"service.name": "agui-test"' in process.log
    access = [
        json.loads(line)
        for line in process.log.splitlines()
        if line.startswith(b'{"time"') and b'"route": "run"' in line
    ]
    assert access and access[0]["trace_id"] == CLIENT_TRACE
