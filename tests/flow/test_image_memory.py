"""What images cost the adapter process, measured from /proc (marker ``soak``: heavy).

One worst-case image (38 MP RGBA PNG of about 6 MiB, just under the pixel limit and over the
kernel's 5 MiB limit, so it is decoded whole and shrunk), then six at once, each against a
real ``python run.py``: peak RSS (VmHWM, reset through ``/proc/<pid>/clear_refs``, and VmRSS
sampled) above idle must stay under the bounds the README documents, every request is
answered 200 or 503 ``SERVER_BUSY`` with ``Retry-After``, and RSS comes back near idle.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.flow import wait_for
from tests.support.images import tiny_png, worst_case_png

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc"),
]
pytest.importorskip("PIL.Image")

MiB = 1024 * 1024
#: Documented: shrinking one image at the pixel limit costs at most about 210 MiB.
ONE_IMAGE_BOUND = 230 * MiB
#: Documented: six at once with the default budget (one worst-case decode at a time, the
#: others' bodies waiting) stay under 400 MiB above idle.
SIX_IMAGES_BOUND = 400 * MiB
#: Afterwards RSS comes back to within this of idle.
SETTLED = 64 * MiB


class Memory:
    """VmRSS / VmHWM of a process, with VmRSS also sampled every 10 ms while it watches."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def field(self, name: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(name)

    def rss(self) -> int:
        return self.field("VmRSS")

    def watch(self) -> None:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            pass
        self.sampled = self.rss()
        self._stop.clear()

        def sample() -> None:
            while not self._stop.wait(0.01):
                try:
                    self.sampled = max(self.sampled, self.rss())
                except (OSError, AssertionError):
                    return

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def peak(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return max(self.sampled, self.field("VmHWM"))


def image_body(cwd: Path, png: bytes) -> bytes:
    value = base64.b64encode(png).decode()
    body = {
        "threadId": f"t-{uuid.uuid4().hex[:12]}",
        "runId": f"r-{uuid.uuid4().hex[:12]}",
        "state": {},
        "tools": [],
        "context": [],
        "messages": [
            {
                "id": "m1",
                "role": "user",
                "content": [
                    {"type": "text", "text": "[IMAGES] look"},
                    {"type": "image", "source": {"type": "data", "mimeType": "image/png", "value": value}},
                ],
            }
        ],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv", "cwd": str(cwd)}},
    }
    return json.dumps(body).encode()


def post(url: str, data: bytes) -> requests.Response:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    return requests.post(url, data=data, headers=headers, timeout=300)


def test_six_worst_case_images_at_once_stay_within_the_documented_bounds(adapter_process: Any, workspace: Path) -> None:
    adapter = adapter_process()
    memory = Memory(adapter.proc.pid)
    png = worst_case_png()
    assert 5 * MiB < len(png) < 8 * MiB
    assert post(adapter.url, image_body(workspace, tiny_png())).status_code == 200  # warm up
    idle = memory.rss()

    memory.watch()
    response = post(adapter.url, image_body(workspace, png))
    one = memory.peak() - idle
    assert response.status_code == 200 and b"RUN_FINISHED" in response.content
    assert one <= ONE_IMAGE_BOUND, f"one image: +{one / MiB:.0f} MiB"
    wait_for(lambda: memory.rss() <= idle + SETTLED, timeout=20)

    bodies = [image_body(workspace, png) for _ in range(6)]
    memory.watch()
    responses: list[requests.Response] = []
    senders = [threading.Thread(target=lambda data=data: responses.append(post(adapter.url, data))) for data in bodies]
    started = time.monotonic()
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(300)
    six = memory.peak() - idle
    assert len(responses) == 6
    for answer in responses:
        if answer.status_code == 503:
            assert answer.json()["error"]["code"] == "SERVER_BUSY" and answer.headers["Retry-After"]
        else:
            assert answer.status_code == 200 and b"RUN_FINISHED" in answer.content
    assert any(answer.status_code == 200 for answer in responses)
    assert six <= SIX_IMAGES_BOUND, f"six images: +{six / MiB:.0f} MiB"
    wait_for(lambda: memory.rss() <= idle + SETTLED, timeout=20)
    print(
        f"idle {idle / MiB:.0f} MiB; one image +{one / MiB:.0f} MiB; six at once +{six / MiB:.0f} MiB "
        f"({sum(a.status_code == 200 for a in responses)} ran, the rest 503) in {time.monotonic() - started:.0f}s; "
        f"after {memory.rss() / MiB:.0f} MiB"
    )
