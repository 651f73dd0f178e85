"""The metrics module and the log formats without sockets: the built-in registry's text
format (checked by prometheus_client's parser), its thread safety, the kernel probe's
cache, the backend choice, the JSON formatter and the ``log_format`` setting."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agui_adapter.config import ConfigError, load_settings
from agui_adapter.ops import logs
from agui_adapter.ops.metrics import BuiltinRegistry, KernelUpProbe, Metrics

ROOT = Path(__file__).resolve().parents[2]


def _families(text: str) -> dict[str, object]:
    parser = pytest.importorskip("prometheus_client.parser")
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def test_the_builtin_text_format_parses_and_escapes_labels() -> None:
    metrics = Metrics(kernel_health=lambda: True)
    metrics.http_request('we"ird\\route\n', "200")
    metrics.run_finished("error", "A2A_UNAVAILABLE", 0.5)
    metrics.first_event(0.1)  # exactly on a bucket bound: counted in it (le)
    text = metrics.render().decode()
    assert text.endswith("\n")
    families = _families(text)
    [sample] = families["agui_http_requests"].samples  # type: ignore[attr-defined]
    assert sample.labels == {"route": 'we"ird\\route\n', "status": "200"}
    buckets = {s.labels["le"]: s.value for s in families["agui_run_first_event_seconds"].samples if "le" in s.labels}  # type: ignore[attr-defined]
    assert buckets["0.05"] == 0 and buckets["0.1"] == 1 and buckets["+Inf"] == 1
    assert 'agui_runs_total{outcome="error"} 1.0' in text
    assert 'agui_run_errors_total{code="A2A_UNAVAILABLE"} 1.0' in text
    assert "agui_kernel_up 1.0" in text


def test_no_kernel_probe_means_no_kernel_up_series() -> None:
    assert b"agui_kernel_up" not in Metrics().render()


def test_counters_are_exact_under_concurrent_writers() -> None:
    metrics = Metrics()
    threads = [
        threading.Thread(
            target=lambda: [(metrics.events_sent(3), metrics.http_request("run", "200")) for _ in range(2000)]
        )
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = metrics.render().decode()
    assert "agui_events_sent_total 48000.0" in text
    assert 'agui_http_requests_total{route="run",status="200"} 16000.0' in text


def test_the_kernel_probe_is_cached_and_a_failing_probe_means_down() -> None:
    calls: list[int] = []

    def health() -> bool:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("boom")
        return True

    probe = KernelUpProbe(health, ttl=60.0)
    assert probe.value() == 1.0 and probe.value() == 1.0
    assert len(calls) == 1
    expired = KernelUpProbe(health, ttl=0.0)
    assert expired.value() == 0.0  # second call raises


def test_the_backend_is_builtin_unless_a_multiprocess_directory_is_given(tmp_path: Path) -> None:
    assert isinstance(Metrics.for_environment(env={}).registry, BuiltinRegistry)
    missing = Metrics.for_environment(env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "nope")})
    assert isinstance(missing.registry, BuiltinRegistry)


def test_the_multiprocess_backend_adds_up_processes(tmp_path: Path) -> None:
    """Each child is a process of its own (prometheus_client picks its mode at import)."""
    pytest.importorskip("prometheus_client")
    script = (
        "from agui_adapter.ops.metrics import Metrics\n"
        "m = Metrics.for_environment()\n"
        "assert m.multiprocess\n"
        "m.events_sent(5); m.run_finished('success', None, 1.0); m.run_opened()\n"
        "m.describe('9.9', 'external', 4); m.run_detached(); m.kernel_call('GetTask', 0.01, 'rejected')\n"
        "m.state_written(0.001, True)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for closes in (True, False):
        code = script + ("m.run_closed()\n" if closes else "")
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)
    render = "from agui_adapter.ops.metrics import Metrics\nprint(Metrics.for_environment().render().decode())\n"
    text = subprocess.run(
        [sys.executable, "-c", render], env=env, check=True, cwd=ROOT, capture_output=True, text=True
    ).stdout
    families = _families(text)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}  # type: ignore[attr-defined]
    assert values[("agui_events_sent_total", ())] == 10.0
    assert values[("agui_runs_total", (("outcome", "success"),))] == 2.0
    assert values[("agui_run_duration_seconds_count", (("mode", "turn"), ("outcome", "success")))] == 2.0
    # summed over the processes' files (gunicorn's child_exit hook removes a dead worker's)
    assert values[("agui_runs_active", ())] == 1.0
    assert values[("agui_runs_max", ())] == 8.0 and values[("agui_runs_detached", ())] == 2.0
    assert values[("agui_kernel_call_errors_total", (("kind", "rejected"), ("method", "GetTask")))] == 2.0
    assert values[("agui_state_write_seconds_count", (("durable", "true"),))] == 2.0
    assert not [k for k in values if k[0].startswith("process_")]  # per-process collectors do not apply


def _exercise(metrics: Metrics) -> None:
    metrics.describe("9.9", "scripted", 5)
    metrics.watch_connections(lambda: 3, 10)
    metrics.watch_state(lambda: 2, lambda: 4096)
    metrics.run_opened()
    metrics.run_detached()
    metrics.run_finished("interrupt", None, 1.5, "pipeline", 0.2)
    metrics.run_finished("error", "A2A_UNAVAILABLE", 0.5, "resume", None)
    metrics.kernel_call("GetTask", 0.01, "rejected")
    metrics.kernel_call("SendStreamingMessage", 0.02)
    metrics.state_written(0.002, True)
    metrics.http_request("events", "200")


def _samples(text: str) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], dict[str, str]]:
    families = _families(text)
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value  # type: ignore[attr-defined]
        for f in families.values()
        for s in f.samples  # type: ignore[attr-defined]
    }
    return values, {name: f.type for name, f in families.items()}  # type: ignore[attr-defined]


def test_the_same_series_whether_prometheus_client_renders_them_or_not() -> None:
    pytest.importorskip("prometheus_client")
    rendered = {}
    for use_client in (False, True):
        metrics = Metrics(BuiltinRegistry(use_client=use_client), kernel_health=lambda: True)
        _exercise(metrics)
        rendered[use_client] = _samples(metrics.render().decode())
    (own, own_types), (client, client_types) = rendered[False], rendered[True]

    def ours(values: dict) -> dict:
        return {k: v for k, v in values.items() if k[0].startswith("agui_") and k[0] != "agui_process_threads"}

    assert ours(own) == ours(client)
    assert {n: t for n, t in own_types.items() if n.startswith("agui_")} == {
        n: t for n, t in client_types.items() if n.startswith("agui_")
    }
    for name in (
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_cpu_seconds_total",
        "process_start_time_seconds",
    ):
        assert own[(name, ())] > 0 and client[(name, ())] > 0, name
    assert [k for k in own if k[0] == "python_info"] == [k for k in client if k[0] == "python_info"] != []
    assert [k for k in client if k[0].startswith("python_gc_")]  # prometheus_client's GC collector too

    def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(pairs.items()))

    assert own[("agui_run_duration_seconds_count", labels(mode="pipeline", outcome="interrupt"))] == 1.0
    assert own[("agui_run_first_event_seconds_count", labels(mode="pipeline", outcome="interrupt"))] == 1.0
    assert own[("agui_run_duration_seconds_count", labels(mode="resume", outcome="error"))] == 1.0
    assert ("agui_run_first_event_seconds_count", labels(mode="resume", outcome="error")) not in own
    assert own[("agui_kernel_call_errors_total", labels(method="GetTask", kind="rejected"))] == 1.0
    assert own[("agui_kernel_call_seconds_count", labels(method="SendStreamingMessage"))] == 1.0
    assert own[("agui_state_write_seconds_count", labels(durable="true"))] == 1.0
    assert own[("agui_connections_open", ())] == 3.0 and own[("agui_connections_max", ())] == 10.0
    assert own[("agui_interrupts_pending", ())] == 2.0 and own[("agui_journal_bytes", ())] == 4096.0
    assert own[("agui_build_info", labels(version="9.9", kernel="scripted"))] == 1.0
    assert own[("agui_runs_max", ())] == 5.0 and own[("agui_runs_detached", ())] == 1.0


def test_state_readings_count_live_interrupts_and_journal_files(tmp_path: Path) -> None:
    from agui_adapter.ops import state_gauges

    threads = tmp_path / "threads"
    threads.mkdir()

    def record(name: str, terminal: bool, *expiries: str) -> None:
        pending = {f"i{n}": {"interrupt": {"id": f"i{n}", "expiresAt": e}} for n, e in enumerate(expiries)}
        (threads / f"{name}.json").write_text(json.dumps({"execution": {"terminal": terminal, "pending": pending}}))

    record("a", False, "2999-01-01T00:00:00Z", "2000-01-01T00:00:00Z")  # one live, one expired
    record("b", True, "2999-01-01T00:00:00Z")  # retired: nobody can answer it
    record("c", False, "2999-01-01T00:00:00Z")
    (threads / "d.json").write_text("{not json")
    assert state_gauges.pending_interrupts(threads, 1e9) == 2
    assert state_gauges.pending_interrupts(tmp_path / "none", 1e9) == 0
    run = tmp_path / "journal" / "t" / "r"
    run.mkdir(parents=True)
    (run / "seg-1").write_bytes(b"x" * 100)
    (run / "attach").write_bytes(b"y" * 10)
    assert state_gauges.journal_bytes(tmp_path / "journal") == 110
    assert state_gauges.journal_bytes(tmp_path / "missing") == 0


def test_the_access_log_setting(tmp_path: Path) -> None:
    assert load_settings(env={}).access_log is True
    assert load_settings(env={"IAC_CODE_AGUI_ACCESS_LOG": "false"}).access_log is False
    assert load_settings({"access_log": True}, env={"IAC_CODE_AGUI_ACCESS_LOG": "off"}).access_log is True
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\naccess_log = no\n")
    assert load_settings(env={}, config_path=str(conf)).access_log is False
    with pytest.raises(ConfigError, match="access_log"):
        load_settings(env={"IAC_CODE_AGUI_ACCESS_LOG": "sometimes"})


def test_extra_fields_reach_json_lines_and_known_ids_win() -> None:
    formatter = logs.JsonFormatter()
    line = json.loads(formatter.format(_record("x", route="run", status=200, kernel_method="GetTask")))
    assert (line["route"], line["status"], line["kernel_method"]) == ("run", 200, "GetTask")
    assert line["trace_id"] is None and line["span_id"] is None
    record = _record("y")
    token = logs.RUN_IDS.set(("thread-9", None))  # a cancel: the thread only
    try:
        logs.RunContext().filter(record)
    finally:
        logs.RUN_IDS.reset(token)
    assert (record.thread_id, record.run_id) == ("thread-9", None)  # type: ignore[attr-defined]


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("agui_adapter.run", logging.INFO, __file__, 1, message, None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_the_json_formatter_writes_one_object_with_fixed_keys() -> None:
    formatter = logs.JsonFormatter()
    plain = json.loads(formatter.format(_record("hello")))
    assert plain["message"] == "hello" and plain["level"] == "INFO" and plain["logger"] == "agui_adapter.run"
    assert plain["request_id"] is None and plain["thread_id"] is None and plain["run_id"] is None
    assert "outcome" not in plain
    tagged = json.loads(formatter.format(_record("done [request r-1]", request_id="r-1", outcome="success")))
    assert tagged["message"] == "done" and tagged["request_id"] == "r-1" and tagged["outcome"] == "success"


def test_the_run_context_filter_reads_the_driver_ids() -> None:
    record = _record("x")
    token = logs.RUN_IDS.set(("thread-1", "run-1"))
    try:
        logs.RunContext().filter(record)
    finally:
        logs.RUN_IDS.reset(token)
    assert (record.thread_id, record.run_id) == ("thread-1", "run-1")  # type: ignore[attr-defined]
    outside = _record("y")
    logs.RunContext().filter(outside)
    assert outside.run_id is None  # type: ignore[attr-defined]


def test_the_log_format_setting(tmp_path: Path) -> None:
    assert load_settings(env={}).log_format == "text"
    assert load_settings(env={"IAC_CODE_AGUI_LOG_FORMAT": "JSON"}).log_format == "json"
    assert load_settings({"log_format": "text"}, env={"IAC_CODE_AGUI_LOG_FORMAT": "json"}).log_format == "text"
    conf = tmp_path / "a.conf"
    conf.write_text("[agui-adapter]\nlog_format = json\n")
    assert load_settings(env={}, config_path=str(conf)).log_format == "json"
    with pytest.raises(ConfigError, match="log_format"):
        load_settings(env={"IAC_CODE_AGUI_LOG_FORMAT": "xml"})
