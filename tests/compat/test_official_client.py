"""Every AG-UI stream the adapter produces must pass the official @ag-ui/client 1.0.

Two checks: live scenarios produced here against the scripted kernel, and — when the
suite ran with ``AGUI_STREAM_DIR`` set (as ``.ci/run`` does) — every stream recorded by
every other test, replayed per thread in order (an interrupted run is resumed by the
next). Zero errors is the bar.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.agui_check.official import check_files, check_streams, require_official_client
from tests.support.agui_client import resume, run_body
from tests.support.flow import interrupted

pytestmark = pytest.mark.official_client


def test_live_scenarios_pass_the_official_client(client: Any, workspace: Path) -> None:
    require_official_client()
    singles = ["hello", "[THINK] [PROGRESS] go", "[FAIL]", "[TOOL] [THINK] x"]
    for text in singles:
        result = client.run(run_body(text, cwd=str(workspace)))
        verdict = check_streams([result.raw])
        assert verdict.ok, f"{text}: {verdict.output}"
    body, first = interrupted(client, workspace)
    [interrupt] = first.terminal["outcome"]["interrupts"]
    second = client.run(
        resume(body, [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow_once"}}])
    )
    verdict = check_streams([first.raw, second.raw], resume_payload={"decision": "allow_once"})
    assert verdict.ok, verdict.output


def test_every_recorded_stream_passes_the_official_client() -> None:
    directory = os.environ.get("AGUI_STREAM_DIR")
    if not directory:
        pytest.skip("AGUI_STREAM_DIR is not set: no recorded streams to check")
    require_official_client()
    groups = sorted(p for p in Path(directory).iterdir() if p.is_dir())
    files = [f for g in groups for f in g.glob("*.sse")]
    if os.environ.get("CI", "").lower() == "true":
        assert len(files) >= 50, f"only {len(files)} recorded streams in {directory}"
    paths = [f for g in groups for f in sorted(g.glob("*.sse"))]
    verdict = check_files(paths, timeout=600)
    print(f"official client: {len(files)} streams in {len(groups)} threads checked")
    assert verdict.ok, "\n".join(line for line in verdict.output.splitlines() if "PASS" not in line)
