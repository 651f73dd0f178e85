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
