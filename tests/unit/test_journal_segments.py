"""How ``JournalWriter.append`` cuts a run's events into segments (``journal``).

The rule, per frame: a frame goes into the current segment while that segment holds less
than its limit (a quarter of the replay buffer), else it starts a new segment named by its
id; the oldest segments go while the run's segments hold more than the buffer. ``append``
applies it with ``find`` cuts on whole chunks (a bulk wake-up carries thousands of frames);
here it must give byte for byte the segments the per-frame rule gives, for chunks from one
frame to several segments long, and a reader must get every retained event once, in order.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agui_adapter.protocol import events as ev
from agui_adapter.state.journal import JournalReader, JournalStore

BUFFER = 64 * 1024  # segments of 16 KiB


def frames_of(count: int, first_id: int, rng: random.Random) -> list[bytes]:
    events = [ev.text_content(1, "m-1", "x" * rng.randrange(1, 3000)) for _ in range(count)]
    chunk = ev.encode_many(events, first_id)
    return [frame + b"\n\n" for frame in chunk.split(b"\n\n")[:-1]]


def exact_frames(count: int, first_id: int, size: int) -> list[bytes]:
    """Frames of exactly ``size`` bytes: segments fill up to their limit to the byte."""
    frames = []
    for frame_id in range(first_id, first_id + count):
        bare = len(ev.encode_many([ev.text_content(1, "m-1", "")], frame_id))
        frames.append(ev.encode_many([ev.text_content(1, "m-1", "y" * (size - bare))], frame_id))
        assert len(frames[-1]) == size
    return frames


def per_frame_model(chunks: list[list[bytes]], first_ids: list[int]) -> dict[str, bytes]:
    """The segments the per-frame rule makes (name -> content), oldest dropped as the writer does."""
    limit = BUFFER // 4
    segments: list[tuple[int, bytearray]] = [(1, bytearray())]
    for frames, first_id in zip(chunks, first_ids, strict=True):
        for offset, frame in enumerate(frames):
            if len(segments[-1][1]) >= limit:
                while sum(len(s) for _, s in segments) > BUFFER and len(segments) > 1:
                    segments.pop(0)
                segments.append((first_id + offset, bytearray()))
            segments[-1][1].extend(frame)
    return {f"{start:012d}.sse": bytes(data) for start, data in segments}


@pytest.mark.parametrize("sizes", ["random", "exact"])
def test_append_cuts_chunks_into_the_segments_of_the_per_frame_rule(tmp_path: Path, sizes: str) -> None:
    rng = random.Random(13)
    store = JournalStore(tmp_path, retention_seconds=60, buffer_bytes=BUFFER)
    writer = store.open_writer("thread", "run")
    chunks, first_ids, next_id = [], [], 1
    for _ in range(120):
        count = rng.choice([1, 1, 2, 5, 12, 40, 90])  # up to about eight segments in one chunk
        # "exact": 1 KiB frames, a segment reaches its limit exactly at a frame's end
        frames = frames_of(count, next_id, rng) if sizes == "random" else exact_frames(count, next_id, 1024)
        chunks.append(frames)
        first_ids.append(next_id)
        next_id += count
        writer.append(b"".join(frames), next_id)
    directory = store.run_dir("thread", "run")
    on_disk = {p.name: p.read_bytes() for p in directory.glob("*.sse")}
    assert on_disk == per_frame_model(chunks, first_ids)
    assert sum(len(d) for d in on_disk.values()) <= BUFFER + BUFFER // 4 + 3000
    writer.end()
    oldest = min(int(name[:-4]) for name in on_disk)
    reader = store.open_reader("thread", "run", oldest - 1)
    assert isinstance(reader, JournalReader)
    data = reader.read()
    ids = [int(frame.split(b"\n", 1)[0][4:]) for frame in data.split(b"\n\n")[:-1]]
    assert ids == list(range(oldest, next_id)) and reader.ended
    everything = b"".join(frame for frames in chunks for frame in frames)
    assert everything.endswith(data)
