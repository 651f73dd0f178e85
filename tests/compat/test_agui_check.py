"""The official-client checker (``tests/support/agui_check``) against known-good and known-bad captures.

The checker must accept valid AG-UI 1.0 streams (including an interrupt followed by its
resume run, and a run that ends in RUN_ERROR) and reject each broken capture for the right
reason, otherwise a green official-client run over the adapter's streams proves nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agui_check.official import check_files, check_streams, require_official_client

pytestmark = pytest.mark.official_client

DATA = Path(__file__).resolve().parents[1] / "data" / "agui"


@pytest.fixture(autouse=True)
def _official_client() -> None:
    require_official_client()


@pytest.mark.parametrize(
    "runs",
    [
        ["valid-success.sse"],
        ["valid-interrupt.sse", "valid-resume.sse"],
        ["valid-run-error.sse"],
        ["valid-success.sse", "valid-run-error.sse", "valid-success.sse"],
    ],
    ids=["success", "interrupt-resume", "run-error", "three-runs"],
)
def test_valid_captures_pass(runs: list[str]) -> None:
    result = check_files([DATA / name for name in runs])
    assert result.ok, result.output
    assert result.output.splitlines()[-1] == "PASS"
    assert sum(line.startswith("run ") for line in result.output.splitlines()) == len(runs)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("invalid-unbalanced-text.sse", "text messages are still active"),
        ("invalid-unfinished-tool-call.sse", "tool calls are still active"),
        ("invalid-event-after-finished.sse", "already finished"),
        (
            "invalid-first-event-not-run-started.sse",
            "First event must be 'RUN_STARTED'",
        ),
        ("invalid-no-terminal-event.sse", "without RUN_FINISHED or RUN_ERROR"),
        ("invalid-float-timestamp.sse", "expected int"),
        ("invalid-empty-interrupts.sse", "too_small"),
        ("invalid-null-optional-field.sse", "received null"),
        ("invalid-missing-required-field.sse", "toolCallName"),
        ("invalid-crlf-line-endings.sse", "CR (\\r)"),
        ("invalid-unknown-field.sse", "Removed unrecognised material"),
        ("invalid-unknown-event-type.sse", "Dropping unrecognised event"),
        ("invalid-legacy-thinking.sse", "[ag-ui][compat]"),
    ],
)
def test_invalid_captures_fail(name: str, reason: str) -> None:
    result = check_files([DATA / name])
    assert not result.ok, result.output
    assert result.returncode == 1
    assert reason in result.output, result.output


def test_one_byte_chunks_still_pass() -> None:
    result = check_files([DATA / "valid-success.sse"], chunk=1)
    assert result.ok, result.output


def test_check_streams_with_bytes_and_json_report() -> None:
    success = (DATA / "valid-success.sse").read_bytes()
    result = check_streams([success, success.replace(b"\n", b"\r\n")], json_report=True)
    assert not result.ok
    assert result.report is not None
    first, second = result.report["runs"]
    assert first["ok"] and first["terminal"] == "RUN_FINISHED"
    assert not second["ok"]
    assert any("CR (\\r)" in error for error in second["errors"])


def test_interrupt_is_resumed_by_the_next_run() -> None:
    result = check_files([DATA / "valid-interrupt.sse", DATA / "valid-resume.sse"], json_report=True)
    assert result.ok, result.output
    assert result.report is not None
    first = result.report["runs"][0]
    assert first["outcome"] == "interrupt"
    assert first["resumeSent"] == [{"interruptId": "int-1", "status": "resolved", "payload": {"approved": True}}]
    assert result.report["requests"][1]["resume"] == first["resumeSent"]


def test_runs_after_a_failed_run_are_reported_not_replayed() -> None:
    result = check_files([DATA / "invalid-unbalanced-text.sse", DATA / "valid-success.sse"])
    assert not result.ok
    assert "not replayed" in result.output
