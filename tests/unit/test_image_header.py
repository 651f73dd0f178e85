"""Image dimensions read from the header alone agree with Pillow, for every accepted format."""

from __future__ import annotations

import io

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.content import MAX_IMAGE_PIXELS, build_user_parts, image_dimensions
from agui_adapter.protocol.errors import AguiError

Image = pytest.importorskip("PIL.Image")


def encoded(fmt: str, size: tuple[int, int], mode: str = "RGB", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode", "options"),
    [
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("GIF", "P", {}),
        ("JPEG", "RGB", {}),
        ("JPEG", "RGB", {"progressive": True}),
        ("JPEG", "L", {"quality": 20}),
        ("WEBP", "RGB", {}),
        ("WEBP", "RGB", {"lossless": True}),
        ("WEBP", "RGBA", {}),
    ],
)
@pytest.mark.parametrize("size", [(1, 1), (37, 5), (640, 481)])
def test_header_dimensions_agree_with_pillow(fmt: str, mode: str, options: dict, size: tuple[int, int]) -> None:
    data = encoded(fmt, size, mode, **options)
    with Image.open(io.BytesIO(data)) as image:
        assert image_dimensions(data) == image.size == size


def test_truncated_or_unknown_headers_say_nothing() -> None:
    for data in (b"", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\xff", b"\xff\xd8\xff\xda\x00\x02", b"RIFF\x00\x00"):
        assert image_dimensions(data) is None


def image_message(data: bytes, mime: str) -> list[dict]:
    import base64

    value = base64.b64encode(data).decode()
    return [
        {"role": "user", "content": [{"type": "image", "source": {"type": "data", "mimeType": mime, "value": value}}]}
    ]


def test_an_image_over_the_pixel_budget_is_refused_from_its_header() -> None:
    # A GIF header claiming 65535 x 65535 pixels, with no pixel data at all: refused unread.
    data = b"GIF89a" + (65535).to_bytes(2, "little") * 2 + b"\x00" * 20
    with pytest.raises(AguiError) as caught:
        build_user_parts(image_message(data, "image/gif"))
    assert caught.value.message == messages.IMAGE_TOO_MANY_PIXELS
    assert caught.value.params == {"limit": MAX_IMAGE_PIXELS // 1_000_000}
