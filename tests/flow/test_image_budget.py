"""The image decoding budget over a real socket: a request whose image does not fit waits
for room, then gets 503 SERVER_BUSY with Retry-After (localized), having stored nothing;
with room it runs. Six worst-case images at once, measured from /proc: test_image_memory.py (soak)."""

from __future__ import annotations

import base64
import random
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agui_adapter.protocol import decode_budget
from agui_adapter.protocol.content import KERNEL_MAX_IMAGE_BYTES
from agui_adapter.protocol.decode_budget import DECODES
from tests.support.agui_client import Client, run_body
from tests.support.flow import wait_for

pytest.importorskip("PIL.Image")


def noisy_png(width: int = 1500, height: int = 1300) -> bytes:
    """An RGB PNG of random pixels: over the kernel's 5 MiB limit, so the adapter decodes it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    noise = random.Random(7).randbytes(width * height * 3)
    raw = b"".join(b"\x00" + noise[y * width * 3 : (y + 1) * width * 3] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")
    assert len(png) > KERNEL_MAX_IMAGE_BYTES
    return png


@pytest.fixture
def budget(make_adapter: Any) -> Iterator[Client]:
    adapter = make_adapter(image_decode_budget_pixels=5_000_000)
    DECODES.configure(5_000_000, wait_seconds=0.5)
    yield adapter.client()
    DECODES.configure(decode_budget.DEFAULT_BUDGET_PIXELS, wait_seconds=decode_budget.WAIT_SECONDS)


def image_run(workspace: Path, **kw: Any) -> dict[str, Any]:
    body = run_body(None, cwd=str(workspace), **kw)
    value = base64.b64encode(noisy_png()).decode()
    body["messages"] = [
        {
            "id": "m1",
            "role": "user",
            "content": [
                {"type": "text", "text": "[IMAGES] look"},
                {"type": "image", "source": {"type": "data", "mimeType": "image/png", "value": value}},
            ],
        }
    ]
    return body


def test_no_room_is_a_localized_503_with_retry_after_and_nothing_stored(
    budget: Client, workspace: Path, adapter: Any
) -> None:
    body = image_run(workspace)
    with DECODES.reserve(DECODES.capacity):  # another decode holds the whole budget
        result = budget.run(body, headers={"Accept-Language": "de"})
    assert result.status == 503, result.raw[:300]
    assert result.error["code"] == "SERVER_BUSY"
    assert result.headers["Retry-After"] == str(decode_budget.RETRY_AFTER_SECONDS)
    assert "Bilder" in result.error["message"]
    # nothing was admitted: the same run id runs once there is room
    result = budget.run(body)
    assert result.status == 200 and result.terminal["type"] == "RUN_FINISHED"
    assert "1 image" in result.text()
    assert DECODES.in_use == 0


def test_a_request_waits_for_room(budget: Client, workspace: Path) -> None:
    DECODES.configure(5_000_000, wait_seconds=30.0)
    results: list[Any] = []
    with DECODES.reserve(DECODES.capacity):
        sender = threading.Thread(target=lambda: results.append(budget.run(image_run(workspace))))
        sender.start()
        wait_for(lambda: DECODES.waiting == 1, timeout=30)  # waiting for the room the test holds
        assert sender.is_alive() and not results
    sender.join(60)
    assert results and results[0].status == 200 and results[0].terminal["type"] == "RUN_FINISHED"
