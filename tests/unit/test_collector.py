"""The built-in server's collector: a batch of kernel frames no longer triggers a young collection.

What it pays is measured by pairs of adapters (``ops/collector.py``'s docstring), never timed
here: these tests check the counts the speed comes from, and that ``python run.py``'s start-up
applies it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agui_adapter.kernel_client.a2a import FrameReader
from agui_adapter.ops import collector
from agui_adapter.run.intake import FRAMES_PER_STEP

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _kernel_bytes(frames: int) -> bytes:
    """What the kernel sends for ``frames`` text deltas: one SSE event per JSON-RPC frame."""
    out = []
    for seq in range(frames):
        frame = {
            "jsonrpc": "2.0",
            "id": "1",
            "result": {
                "statusUpdate": {
                    "taskId": "task-1",
                    "contextId": "ctx-1",
                    "status": {
                        "state": "TASK_STATE_WORKING",
                        "timestamp": "2026-12-05T05:02:11.611657Z",
                        "message": {
                            "messageId": "task-1-message",
                            "role": "ROLE_AGENT",
                            "parts": [{"text": f"delta {seq} "}],
                            "metadata": {"iac_code": {"iacCodeSessionId": "s-1"}},
                        },
                    },
                    "metadata": {"iac_code": {"iacCodeSessionId": "s-1"}},
                }
            },
        }
        out.append(b"data: " + json.dumps(frame).encode() + b"\r\n\r\n")
    return b"".join(out)


def _young_collections_while_holding_a_batch() -> int:
    data = _kernel_bytes(FRAMES_PER_STEP)
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    frames = FrameReader().feed(data)  # the batch, alive at once as the run's worker holds it
    after = gc.get_stats()[0]["collections"]
    assert len(frames) == FRAMES_PER_STEP
    return after - before


def test_tune_sets_the_young_threshold_and_keeps_the_older_ones(thresholds: None) -> None:
    gc.set_threshold(700, 11, 12)
    assert collector.tune() == (collector.YOUNG_THRESHOLD, 11, 12)
    assert collector.tune(2_000) == gc.get_threshold() == (2_000, 11, 12)


def test_a_batch_of_frames_triggers_young_collections_by_default_and_none_once_tuned(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    assert _young_collections_while_holding_a_batch() >= 2
    collector.tune()
    assert _young_collections_while_holding_a_batch() == 0


def test_the_built_in_server_tunes_its_process_at_start() -> None:
    """``cli.main`` in a fresh interpreter: tuned before the kernel is chosen (here refused, so
    nothing is started)."""
    code = (
        "import gc, sys; from agui_adapter.cli import main; "
        "rc = main(['--a2a-url', 'http://192.0.2.1:1/', '--state-dir', sys.argv[1]]); "
        "print(rc, *gc.get_threshold())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as state:
        done = subprocess.run(
            [sys.executable, "-c", code, state], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.stdout.split() == ["1", str(collector.YOUNG_THRESHOLD), *map(str, gc.get_threshold()[1:])], done.stderr
    assert "loopback" in done.stderr  # the refusal it stopped at


def test_the_gunicorn_recipe_tunes_each_worker() -> None:
    """``deploy/gunicorn.conf.py``'s ``post_worker_init``, run in a fresh interpreter as a
    worker would (its hook installed or not, the collector is tuned)."""
    code = (
        "import gc, runpy, sys, types; conf = runpy.run_path(sys.argv[1]); "
        "log = types.SimpleNamespace(warning=lambda *a: None); "
        "conf['post_worker_init'](types.SimpleNamespace(log=log)); print(*gc.get_threshold())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "deploy" / "gunicorn.conf.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == [str(collector.YOUNG_THRESHOLD), *map(str, gc.get_threshold()[1:])], done.stderr
