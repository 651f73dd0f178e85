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

from agui_adapter import logs
from agui_adapter.config import ConfigError, load_settings
from agui_adapter.metrics import BuiltinRegistry, KernelUpProbe, Metrics

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
        "from agui_adapter.metrics import Metrics\n"
        "m = Metrics.for_environment()\n"
        "assert m.multiprocess\n"
        "m.events_sent(5); m.run_finished('success', None, 1.0); m.run_opened()\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for closes in (True, False):
        code = script + ("m.run_closed()\n" if closes else "")
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)
    render = "from agui_adapter.metrics import Metrics\nprint(Metrics.for_environment().render().decode())\n"
    text = subprocess.run(
        [sys.executable, "-c", render], env=env, check=True, cwd=ROOT, capture_output=True, text=True
    ).stdout
    families = _families(text)
    values = {(s.name, tuple(s.labels.items())): s.value for f in families.values() for s in f.samples}  # type: ignore[attr-defined]
    assert values[("agui_events_sent_total", ())] == 10.0
    assert values[("agui_runs_total", (("outcome", "success"),))] == 2.0
    assert values[("agui_run_duration_seconds_count", (("mode", "turn"), ("outcome", "success")))] == 2.0
    # summed over the processes' files (gunicorn's child_exit hook removes a dead worker's)
    assert values[("agui_runs_active", ())] == 1.0


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
