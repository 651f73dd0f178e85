"""User content → A2A parts: what is accepted, what the kernel receives, and every refusal."""

from __future__ import annotations

import base64
import io
import os
import sys
from typing import Any

import pytest

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol import content
from agui_adapter.protocol.content import (
    KERNEL_MAX_IMAGE_BYTES,
    MAX_IMAGE_BYTES,
    MAX_TOTAL_IMAGE_BYTES,
    build_user_parts,
    image_resizing_available,
    latest_user_message,
)
from agui_adapter.protocol.errors import AguiError
from tests.support.images import png_bytes

MiB = 1024 * 1024


# 1x1 images as written by common encoders.
GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00"  # header, 2-colour palette
    b"!\xf9\x04\x01\x00\x00\x00\x00"  # graphic control extension
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"  # image descriptor, data, trailer
)
WEBP = base64.b64decode("UklGRjwAAABXRUJQVlA4IDAAAADQAQCdASoBAAEAAUAmJaACdLoB+AADsAD+8ut//NgVzXPv9//S4P0uD9Lg/9KQAAA=")
JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0"
    "Hyc5PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIy"
    "MjL/wAARCAABAAEDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQID"
    "AAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlq"
    "c3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3"
    "+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEI"
    "FEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImK"
    "kpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwDi"
    "6KKK+ZP3E//Z"
)
PNG = png_bytes()
IMAGES = {"image/png": PNG, "image/jpeg": JPEG, "image/gif": GIF, "image/webp": WEBP}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image_part(data: bytes | str, mime: str = "image/png", **extra: Any) -> dict[str, Any]:
    value = data if isinstance(data, str) else b64(data)
    return {"type": "image", "source": {"type": "data", "value": value, "mimeType": mime}, **extra}


def padded(magic: bytes, size: int) -> bytes:
    """``size`` bytes that start like an image (enough for the size rules)."""
    return magic + b"\x00" * (size - len(magic))


def user(content_: object, id_: str = "m-user") -> list[dict[str, Any]]:
    return [{"id": id_, "role": "user", "content": content_}]


def refusal(msgs: list[dict[str, Any]]) -> AguiError:
    with pytest.raises(AguiError) as caught:
        build_user_parts(msgs)
    assert caught.value.code == "INVALID_INPUT"
    return caught.value


def assert_refused(msgs: list[dict[str, Any]], template: str, **params: Any) -> AguiError:
    error = refusal(msgs)
    assert error.message == template
    assert error.params == params
    error.message.format(**error.params)
    return error


# --- picking the message ---------------------------------------------------------------


def test_latest_user_message_scans_from_the_end() -> None:
    history = [
        {"id": "1", "role": "user", "content": "first"},
        {"id": "2", "role": "assistant", "content": "reply"},
        {"id": "3", "role": "user", "content": "second"},
        {"id": "4", "role": "assistant", "content": "reply again"},
    ]
    assert latest_user_message(history) == history[2]
    assert build_user_parts(history) == ("3", [{"text": "second"}])


def test_no_user_message() -> None:
    assert latest_user_message([]) is None
    assert_refused([], messages.USER_MESSAGE_REQUIRED)
    assert_refused([{"id": "a", "role": "assistant", "content": "x"}], messages.USER_MESSAGE_REQUIRED)


def test_message_id_is_optional() -> None:
    assert build_user_parts([{"role": "user", "content": "hi"}]) == (None, [{"text": "hi"}])


# --- text ------------------------------------------------------------------------------


def test_string_content_is_one_text_part() -> None:
    assert build_user_parts(user("Create a VPC template")) == ("m-user", [{"text": "Create a VPC template"}])


def test_empty_string_is_allowed() -> None:
    assert build_user_parts(user("")) == ("m-user", [{"text": ""}])


def test_text_parts_in_order() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert build_user_parts(user(parts)) == ("m-user", [{"text": "a"}, {"text": "b"}])


@pytest.mark.parametrize(
    "content_",
    [
        None,
        5,
        {"type": "text", "text": "x"},
        [],
        ["plain string part"],
        [{"text": "no type"}],
        [{"type": "text"}],
        [{"type": "text", "text": 3}],
        [{"type": "hologram"}],
        [{"type": 1}],
    ],
)
def test_malformed_content(content_: object) -> None:
    assert_refused(user(content_), messages.CONTENT_INVALID)


def test_missing_content_is_invalid() -> None:
    assert_refused([{"id": "u", "role": "user"}], messages.CONTENT_INVALID)


@pytest.mark.parametrize("kind", ["audio", "video", "document", "binary"])
def test_unsupported_part_types_name_the_type(kind: str) -> None:
    part = {"type": kind, "source": {"type": "data", "value": "AAAA", "mimeType": "audio/wav"}}
    assert_refused(user([{"type": "text", "text": "x"}, part]), messages.PART_TYPE_UNSUPPORTED, part=kind)


# --- images: accepted ---------------------------------------------------------------------


@pytest.mark.parametrize("mime", sorted(IMAGES))
def test_small_images_pass_through_untouched(mime: str) -> None:
    value = b64(IMAGES[mime])
    message_id, parts = build_user_parts(user([image_part(value, mime)]))
    assert message_id == "m-user"
    assert parts == [{"data": {"filename": "agui-image-1", "bytes": value}, "mediaType": mime}]


def test_mime_type_is_compared_case_insensitively() -> None:
    _, parts = build_user_parts(user([image_part(PNG, "IMAGE/PNG")]))
    assert parts[0]["mediaType"] == "image/png"


def test_small_images_need_no_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content, "image_resizing_available", lambda: False)
    build_user_parts(user([image_part(PNG)]))


def test_text_and_images_mixed() -> None:
    parts_in = [
        {"type": "text", "text": "look"},
        image_part(PNG),
        image_part(GIF, "image/gif", metadata={"filename": "cat.gif"}),
        {"type": "text", "text": "and"},
        image_part(WEBP, "image/webp"),
    ]
    _, parts = build_user_parts(user(parts_in))
    assert [p.get("text") or p["data"]["filename"] for p in parts] == [
        "look",
        "agui-image-2",  # n counts the parts built so far, text included
        "cat.gif",
        "and",
        "agui-image-5",
    ]
    assert [p.get("mediaType") for p in parts] == [None, "image/png", "image/gif", None, "image/webp"]


# --- images: filenames ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["diagram.png", "架构图.png", "a b.jpeg", ".hidden", "x" * 251 + ".png"])
def test_safe_filenames_are_kept(name: str) -> None:
    _, parts = build_user_parts(user([image_part(PNG, metadata={"filename": name})]))
    assert parts[0]["data"]["filename"] == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "../etc/passwd",
        "dir/file.png",
        "dir\\file.png",
        "C:evil.png",
        "a<b.png",
        "a>b.png",
        'a"b.png',
        "a|b.png",
        "a?b.png",
        "a*b.png",
        "tab\there.png",
        "nl\n.png",
        "del\x7f.png",
        "trailing.",
        "trailing ",
        "CON",
        "con.png",
        "Lpt1.txt",
        "COM9",
        "nul .txt",
        "x" * 256,
        "图" * 86,  # 258 UTF-8 bytes
        "\ud800.png",
        5,
        None,
    ],
)
def test_unsafe_filenames_fall_back(name: object) -> None:
    _, parts = build_user_parts(user([image_part(PNG, metadata={"filename": name})]))
    assert parts[0]["data"]["filename"] == "agui-image-1"


def test_metadata_that_is_not_an_object_falls_back() -> None:
    _, parts = build_user_parts(user([image_part(PNG, metadata="name.png")]))
    assert parts[0]["data"]["filename"] == "agui-image-1"


# --- images: refused -------------------------------------------------------------------------


def test_remote_urls_are_refused() -> None:
    part = {"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}
    assert_refused(user([part]), messages.REMOTE_MEDIA_UNSUPPORTED)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image"},
        {"type": "image", "source": "data"},
        {"type": "image", "source": {"type": "file", "value": "/etc/passwd", "mimeType": "image/png"}},
        {"type": "image", "source": {"type": "data", "mimeType": "image/png"}},
        {"type": "image", "source": {"type": "data", "value": "AAAA"}},
        {"type": "image", "source": {"type": "data", "value": 5, "mimeType": "image/png"}},
    ],
)
def test_malformed_image_parts(part: dict[str, Any]) -> None:
    assert_refused(user([part]), messages.CONTENT_INVALID)


@pytest.mark.parametrize("mime", ["image/bmp", "image/svg+xml", "image/jpg", "text/plain", "image/png; q=1"])
def test_unsupported_media_types(mime: str) -> None:
    assert_refused(user([image_part(PNG, mime)]), messages.IMAGE_TYPE_UNSUPPORTED, mimeType=mime)


def test_unsupported_media_type_param_is_sanitized() -> None:
    error = refusal(user([image_part(PNG, "image/" + "x" * 500 + "\n")]))
    assert error.message == messages.IMAGE_TYPE_UNSUPPORTED
    assert "\n" not in error.params["mimeType"]
    assert len(error.params["mimeType"]) <= 65


@pytest.mark.parametrize(
    "value",
    [
        "data:image/png;base64," + b64(PNG),
        b64(PNG)[:-2],  # truncated
        b64(GIF).rstrip("="),  # padding dropped
        b64(GIF) + "=",  # too much padding
        b64(PNG)[:8] + "\n" + b64(PNG)[8:],
        " " + b64(PNG)[1:],
        b64(PNG) + "AB-_",  # URL-safe alphabet
        "AAA*",
        "é" * 4,
        "====",
    ],
)
def test_strict_base64(value: str) -> None:
    assert_refused(user([image_part(value, "image/gif")]), messages.IMAGE_NOT_BASE64)


@pytest.mark.parametrize("mime", sorted(IMAGES))
def test_declared_type_must_match_the_bytes(mime: str) -> None:
    other = "image/gif" if mime == "image/png" else "image/png"
    assert_refused(user([image_part(IMAGES[mime], other)]), messages.IMAGE_TYPE_MISMATCH, mimeType=other)


@pytest.mark.parametrize(
    "data",
    [b"", b"BM\x00\x00\x00\x00", b"hello world!", b"RIFF\x00\x00\x00\x00WAVE", b"\x89PNG"],
)
def test_empty_or_unknown_bytes_are_invalid(data: bytes) -> None:
    assert_refused(user([image_part(data)]), messages.IMAGE_INVALID)


def test_image_above_8_mib_is_refused() -> None:
    big = padded(PNG, MAX_IMAGE_BYTES + 1)
    assert_refused(user([image_part(big)]), messages.IMAGE_TOO_LARGE, limit=8)


def test_total_above_10_mib_is_refused() -> None:
    four = padded(PNG, 4 * MiB)
    parts = [image_part(four), image_part(four), image_part(padded(PNG, 2 * MiB + 1))]
    assert 4 * MiB * 2 + 2 * MiB + 1 > MAX_TOTAL_IMAGE_BYTES
    assert_refused(user(parts), messages.IMAGES_TOO_LARGE, limit=10)


def test_total_over_two_images() -> None:
    first = padded(PNG, 4 * MiB + MiB // 2)  # under the kernel limit: passes untouched
    second = padded(PNG, 6 * MiB)
    assert_refused(user([image_part(first), image_part(second)]), messages.IMAGES_TOO_LARGE, limit=10)


def test_exactly_at_the_limits_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content, "KERNEL_MAX_IMAGE_BYTES", MAX_TOTAL_IMAGE_BYTES)  # no resizing here
    five = padded(PNG, 5 * MiB)
    _, parts = build_user_parts(user([image_part(five), image_part(five)]))
    assert len(parts) == 2


def test_image_above_kernel_limit_without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content, "image_resizing_available", lambda: False)
    six = padded(PNG, 6 * MiB)
    assert_refused(user([image_part(six)]), messages.IMAGE_NEEDS_RESIZE, limit=5)


def test_image_at_kernel_limit_without_pillow_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content, "image_resizing_available", lambda: False)
    five = padded(PNG, KERNEL_MAX_IMAGE_BYTES)
    _, parts = build_user_parts(user([image_part(five)]))
    assert parts[0]["data"]["bytes"] == b64(five)


def test_image_resizing_available_reflects_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.delitem(sys.modules, "PIL.Image", raising=False)
    assert image_resizing_available() is False


def test_error_messages_never_contain_image_data() -> None:
    secret_like = b64(padded(b"NOTANIMAGE", 64))
    error = refusal(user([image_part(secret_like)]))
    assert secret_like not in str(error) + repr(error.params)


# --- images: shrinking with Pillow ----------------------------------------------------------


def noise_image(width: int, height: int, fmt: str, mode: str = "RGB") -> bytes:
    Image = pytest.importorskip("PIL.Image")
    channels = len(mode)
    image = Image.frombytes(mode, (width, height), os.urandom(width * height * channels))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def decoded(part: dict[str, Any]) -> bytes:
    return base64.b64decode(part["data"]["bytes"])


def test_pillow_detected_when_installed() -> None:
    pytest.importorskip("PIL.Image")
    assert image_resizing_available() is True


def test_large_png_is_shrunk_to_jpeg() -> None:
    data = noise_image(1400, 1400, "PNG")
    assert KERNEL_MAX_IMAGE_BYTES < len(data) <= MAX_IMAGE_BYTES
    _, parts = build_user_parts(user([image_part(data, metadata={"filename": "big.png"})]))
    out = decoded(parts[0])
    assert len(out) <= KERNEL_MAX_IMAGE_BYTES
    assert parts[0]["mediaType"] == "image/jpeg"
    assert out.startswith(b"\xff\xd8\xff")
    assert parts[0]["data"]["filename"] == "big.png"


def test_oversized_png_stays_png_when_resizing_is_enough() -> None:
    Image = pytest.importorskip("PIL.Image")
    data = noise_image(2600, 1000, "PNG")
    assert KERNEL_MAX_IMAGE_BYTES < len(data) <= MAX_IMAGE_BYTES
    _, parts = build_user_parts(user([image_part(data)]))
    out = decoded(parts[0])
    assert parts[0]["mediaType"] == "image/png"
    assert len(out) <= KERNEL_MAX_IMAGE_BYTES
    with Image.open(io.BytesIO(out)) as image:
        assert max(image.size) == 2000


def test_transparent_png_is_flattened_for_jpeg() -> None:
    data = noise_image(1200, 1200, "PNG", mode="RGBA")
    assert KERNEL_MAX_IMAGE_BYTES < len(data) <= MAX_IMAGE_BYTES
    _, parts = build_user_parts(user([image_part(data)]))
    assert parts[0]["mediaType"] == "image/jpeg"
    assert len(decoded(parts[0])) <= KERNEL_MAX_IMAGE_BYTES


def test_undecodable_large_image_is_invalid() -> None:
    pytest.importorskip("PIL.Image")
    garbage = padded(PNG[:16], 6 * MiB)
    assert_refused(user([image_part(garbage)]), messages.IMAGE_INVALID)


def test_truncated_large_image_is_invalid() -> None:
    data = noise_image(1400, 1400, "PNG")
    assert_refused(user([image_part(data[: 5 * MiB + 100])]), messages.IMAGE_INVALID)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "I;16"])
def test_fitting_strip_by_strip_is_the_whole_image_resize(mode: str) -> None:
    Image = pytest.importorskip("PIL.Image")
    from PIL import ImageChops

    from agui_adapter.protocol.content import _fit

    source = Image.frombytes("RGBA", (2900, 2300), os.urandom(2900 * 2300 * 4))
    source = source.convert("L").convert(mode) if mode == "I;16" else source.convert(mode)
    if mode == "RGBA":  # opaque enough that premultiplied rounding stays small
        source.putalpha(Image.new("L", source.size, 200))
    whole = source.resize((2000, round(2300 * 2000 / 2900)), Image.Resampling.LANCZOS)
    fitted = _fit(source, 2000)
    assert (fitted.mode, fitted.size) == (whole.mode, whole.size)
    as_rgba = (lambda im: im.convert("L").convert("RGBA")) if mode == "I;16" else (lambda im: im.convert("RGBA"))
    extrema = ImageChops.difference(as_rgba(whole), as_rgba(fitted)).getextrema()
    assert max(high for _, high in extrema) <= 2
    small = Image.new("RGB", (30, 20))
    assert _fit(small, 2000) is small
