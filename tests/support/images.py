"""Real, minimal PNG images for the tests of image content (no imaging library needed)."""

from __future__ import annotations

import struct
import zlib

BLACK = b"\x00\x00\x00"
RED = b"\xff\x00\x00"


def png_bytes(width: int = 1, height: int = 1, pixel: bytes = BLACK) -> bytes:
    """An RGB PNG of ``width`` x ``height`` pixels, all of colour ``pixel``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + pixel * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def tiny_png() -> bytes:
    """A 2 x 2 red PNG."""
    return png_bytes(2, 2, RED)


def worst_case_png(width: int = 7800, height: int = 4870, noisy_rows: int = 190, seed: int = 0) -> bytes:
    """An RGBA PNG just under the 40 MP limit (38 MP) and over the kernel's 5 MiB limit, so the
    adapter must decode it whole to shrink it: mostly transparent rows, with ``noisy_rows``
    rows of random bytes spread out so that deflate cannot share them (about 6 MiB)."""
    import random

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = width * 4
    noise = random.Random(seed).randbytes(row)
    blank = bytes(row)
    every = max(1, height // noisy_rows)
    packer = zlib.compressobj(6)
    body = [packer.compress(b"\x00" + (noise if y % every == 0 else blank)) for y in range(height)]
    body.append(packer.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(body)) + chunk(b"IEND", b"")
