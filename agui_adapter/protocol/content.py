"""The latest AG-UI user message, turned into the A2A parts the iac-code kernel accepts.

Why this module exists: upstream builds the parts inside the stream, so a bad image costs
the client a consumed run id and a rotated execution (upstream spec §2.3, §8.15). Here the
content is checked and converted *before* the stream starts, as a pure function, so every
content error is a plain 400 ``INVALID_INPUT`` with a specific message.

Rules (the contract's "user content" section): string content or a list of ``text`` parts
and inline ``image`` parts (``source.type == "data"``, base64). Images must be PNG, JPEG,
GIF or WebP, strictly base64, at most 8 MiB each and 10 MiB in total (decoded), and their
bytes must really be of the declared type. What one image may cost to decode is bounded
before anything decodes it: the dimensions are read from the header (PNG IHDR, GIF screen
descriptor, WebP VP8/VP8L/VP8X, JPEG SOF) and an image above :data:`MAX_IMAGE_PIXELS` is
refused. Images above the kernel's 5 MiB limit are shrunk
with Pillow (the optional ``images`` extra) like upstream does; without Pillow they are
refused with a message that says how to fix it. Smaller images pass through untouched.
Shrinking is bounded in memory per image (resized strip by strip, :func:`_fit`) and for the
whole process (``decode_budget``: a request may wait for its turn, or get 503).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import unicodedata
from typing import Any

from agui_adapter.protocol import catalog as messages
from agui_adapter.protocol.decode_budget import DECODES
from agui_adapter.protocol.errors import AguiError, Code

__all__ = [
    "KERNEL_MAX_IMAGE_BYTES",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "MAX_TOTAL_IMAGE_BYTES",
    "build_user_parts",
    "image_dimensions",
    "image_resizing_available",
    "latest_user_message",
]

MiB = 1024 * 1024
MAX_IMAGE_BYTES = 8 * MiB
MAX_TOTAL_IMAGE_BYTES = 10 * MiB
KERNEL_MAX_IMAGE_BYTES = 5 * MiB

SUPPORTED_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
UNSUPPORTED_PART_TYPES = frozenset({"audio", "video", "document", "binary"})

_MAX_SIDE = 2000
_LAST_RESORT_SIDE = 1000
_JPEG_QUALITIES = (80, 60, 40, 20)
_MAX_SHOWN_MIME = 64
#: The pixel budget of one image, checked on its header before any decoding: 40 Mpx (a large
#: photo). Shrinking one costs at most its decoded pixels (4 bytes each: 153 MiB at the
#: limit; a JPEG is decoded at a reduced scale) plus about 50 MiB (strips, the shrunk image,
#: the encoder), so at most about 210 MiB: measured +201 MiB peak RSS for a 38 MP RGBA PNG
#: of 6 MiB. How many are decoded at once is bounded by ``decode_budget``.
MAX_IMAGE_PIXELS = 40_000_000

_WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL"} | {f"COM{i}" for i in range(1, 10)} | {f"LPT{i}" for i in range(1, 10)}
)
_FORBIDDEN_FILENAME_CHARS = frozenset('/\\<>:"|?*')


def _invalid(template: str, **params: Any) -> AguiError:
    return AguiError(Code.INVALID_INPUT, template, params)


def latest_user_message(messages_: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last message whose role is ``user``, or None."""
    for message in reversed(messages_):
        if isinstance(message, dict) and message.get("role") == "user":
            return message
    return None


def image_resizing_available() -> bool:
    """Whether Pillow (the ``images`` extra) can be imported."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def build_user_parts(messages_: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Convert the latest user message into A2A parts.

    Returns ``(message id or None, parts)``. Raises ``AguiError(Code.INVALID_INPUT, …)`` with the
    specific content message on the first problem, in part order.
    """
    message = latest_user_message(messages_)
    if message is None:
        raise _invalid(messages.USER_MESSAGE_REQUIRED)
    message_id = message.get("id")
    message_id = message_id if isinstance(message_id, str) else None
    content = message.get("content")
    if isinstance(content, str):
        return message_id, [{"text": content}]
    if not isinstance(content, list) or not content:
        # An empty list would give the kernel zero parts, which it cannot use.
        raise _invalid(messages.CONTENT_INVALID)

    parts: list[dict[str, Any]] = []
    total_image_bytes = 0
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _invalid(messages.CONTENT_INVALID)
        kind = part["type"]
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _invalid(messages.CONTENT_INVALID)
            parts.append({"text": text})
        elif kind == "image":
            data, media_type, raw_b64 = _image(part, total_image_bytes)
            total_image_bytes += len(data)
            if len(data) > KERNEL_MAX_IMAGE_BYTES:
                if not image_resizing_available():
                    raise _invalid(messages.IMAGE_NEEDS_RESIZE, limit=KERNEL_MAX_IMAGE_BYTES // MiB)
                data, media_type = _shrink(data, media_type)
                raw_b64 = base64.b64encode(data).decode("ascii")
            parts.append(
                {
                    "data": {"filename": _filename(part, len(parts) + 1), "bytes": raw_b64},
                    "mediaType": media_type,
                }
            )
        elif kind in UNSUPPORTED_PART_TYPES:
            raise _invalid(messages.PART_TYPE_UNSUPPORTED, part=kind)
        else:
            raise _invalid(messages.CONTENT_INVALID)
    return message_id, parts


# --- images -------------------------------------------------------------------------


def _shown_mime(value: str) -> str:
    cleaned = "".join(ch for ch in value if unicodedata.category(ch)[0] != "C")
    return cleaned if len(cleaned) <= _MAX_SHOWN_MIME else cleaned[:_MAX_SHOWN_MIME] + "…"


def _image(part: dict[str, Any], total_so_far: int) -> tuple[bytes, str, str]:
    """Check one inline image part; return (decoded bytes, media type, base64 text)."""
    source = part.get("source")
    if not isinstance(source, dict):
        raise _invalid(messages.CONTENT_INVALID)
    if source.get("type") == "url":
        raise _invalid(messages.REMOTE_MEDIA_UNSUPPORTED)
    if source.get("type") != "data":
        raise _invalid(messages.CONTENT_INVALID)
    mime, value = source.get("mimeType"), source.get("value")
    if not isinstance(mime, str) or not isinstance(value, str):
        raise _invalid(messages.CONTENT_INVALID)
    mime = mime.lower()
    if mime not in SUPPORTED_IMAGE_TYPES:
        raise _invalid(messages.IMAGE_TYPE_UNSUPPORTED, mimeType=_shown_mime(mime))
    data = _strict_b64decode(value)
    if len(data) > MAX_IMAGE_BYTES:
        raise _invalid(messages.IMAGE_TOO_LARGE, limit=MAX_IMAGE_BYTES // MiB)
    if total_so_far + len(data) > MAX_TOTAL_IMAGE_BYTES:
        raise _invalid(messages.IMAGES_TOO_LARGE, limit=MAX_TOTAL_IMAGE_BYTES // MiB)
    actual = sniff_image_type(data)
    if actual is None:
        raise _invalid(messages.IMAGE_INVALID)
    if actual != mime:
        raise _invalid(messages.IMAGE_TYPE_MISMATCH, mimeType=mime)
    size = image_dimensions(data)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise _invalid(messages.IMAGE_TOO_MANY_PIXELS, limit=MAX_IMAGE_PIXELS // 1_000_000)
    return data, mime, value


_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xDA)})


def image_dimensions(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` read from the header of a PNG, GIF, WebP or JPEG, without decoding
    any pixel; None when the header does not say (truncated or unknown)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if len(data) >= 30 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
        if chunk == b"VP8L" and data[20] == 0x2F:
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
        return None
    if data.startswith(b"\xff\xd8"):
        return _jpeg_dimensions(data)
    return None


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    offset = 2
    end = len(data)
    while offset + 4 <= end:
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in _JPEG_NO_LENGTH:
            offset += 2
            continue
        if marker == 0xDA:  # start of scan: no frame header before the pixels
            return None
        length = int.from_bytes(data[offset + 2 : offset + 4], "big")
        if marker in _JPEG_SOF:
            if offset + 9 > end:
                return None
            height = int.from_bytes(data[offset + 5 : offset + 7], "big")
            width = int.from_bytes(data[offset + 7 : offset + 9], "big")
            return width, height
        if length < 2:
            return None
        offset += 2 + length
    return None


def _strict_b64decode(value: str) -> bytes:
    """Standard base64, ASCII, no whitespace, correct padding (so data: URLs fail)."""
    if not value.isascii() or len(value) % 4 != 0:
        raise _invalid(messages.IMAGE_NOT_BASE64)
    try:  # validate=True rejects anything outside the alphabet, whitespace included
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(messages.IMAGE_NOT_BASE64) from None


def sniff_image_type(data: bytes) -> str | None:
    """The image media type told by the magic bytes, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _shrink(data: bytes, media_type: str) -> tuple[bytes, str]:
    """Shrink an image below the kernel limit like upstream: fit 2000x2000 (LANCZOS), a PNG
    retried as PNG, then JPEG at quality 80/60/40/20, then 1000 px at q=20.

    What it costs is bounded (see :data:`MAX_IMAGE_PIXELS`): a JPEG is decoded at a reduced
    scale (``draft``); any other image is decoded once at full size and then resized strip by
    strip (:func:`_fit`), never copied whole; the full-size pixels are freed before the
    smaller image is encoded. The pixels decoded are first reserved in the process-wide
    budget (``decode_budget.DECODES``), which may make the request wait or refuse it.
    """
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - see below
        raise _invalid(messages.IMAGE_INVALID) from None
    try:
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:  # the header check's twin, for odd headers
            raise _invalid(messages.IMAGE_TOO_MANY_PIXELS, limit=MAX_IMAGE_PIXELS // 1_000_000)
        try:
            if image.format == "JPEG":
                image.draft("RGB", (_MAX_SIDE, _MAX_SIDE))  # decode at a reduced scale
        except Exception:  # noqa: BLE001
            raise _invalid(messages.IMAGE_INVALID) from None
        with DECODES.reserve(image.width * image.height):
            try:
                image.load()  # strict: truncated images raise (LOAD_TRUNCATED_IMAGES is off)
                fitted = _fit(image, _MAX_SIDE)
                if fitted is not image:
                    image.close()  # the full-size pixels go before the encoding
                encoded, shrunk_type = _reencode(fitted, media_type)
                fitted.close()
            # Pillow's decoders raise many kinds on hostile input (OSError, SyntaxError,
            # DecompressionBombError, struct.error, ...): all of them mean "not a usable image".
            except Exception:  # noqa: BLE001
                raise _invalid(messages.IMAGE_INVALID) from None
    finally:
        image.close()
    if len(encoded) > KERNEL_MAX_IMAGE_BYTES:
        raise _invalid(messages.IMAGE_INVALID)
    return encoded, shrunk_type


#: Output rows resized at a time by :func:`_fit`.
_STRIP_ROWS = 64
#: Half the width of the LANCZOS kernel, in source pixels per output pixel (Pillow's value).
_LANCZOS_SUPPORT = 3.0


def _fitted_size(width: int, height: int, side: int) -> tuple[int, int]:
    if width >= height:
        return side, max(1, round(height * side / width))
    return max(1, round(width * side / height)), side


def _fit(image: Any, side: int) -> Any:
    """``image`` made to fit ``side`` x ``side`` with LANCZOS, as ``thumbnail`` would, but
    strip by strip: each band of output rows is resized from a crop of the source rows its
    filter reads (the band's rows plus the kernel's reach on both sides), so the result is
    the whole-image resize while the extra memory is a few strips, not a copy of the image
    (``resize`` converts RGBA to premultiplied alpha, a full-size copy, and keeps a
    full-height intermediate). ``image`` itself when it fits already."""
    from PIL import Image

    width, height = image.size
    if width <= side and height <= side:
        return image
    out_width, out_height = _fitted_size(width, height, side)
    scale = height / out_height
    margin = math.ceil(_LANCZOS_SUPPORT * max(scale, 1.0)) + 2
    mode = image.mode
    if mode in ("P", "PA", "1"):  # palette and bilevel images are resized in colour
        mode = "RGBA" if image.has_transparency_data else "RGB"
    fitted = Image.new(mode, (out_width, out_height))
    for top in range(0, out_height, _STRIP_ROWS):
        bottom = min(out_height, top + _STRIP_ROWS)
        source_top, source_bottom = top * scale, bottom * scale
        first = max(0, math.floor(source_top) - margin)
        last = min(height, math.ceil(source_bottom) + margin)
        strip = image.crop((0, first, width, last))
        if strip.mode != mode:
            strip = strip.convert(mode)
        band = strip.resize(
            (out_width, bottom - top),
            Image.Resampling.LANCZOS,
            box=(0, source_top - first, width, source_bottom - first),
        )
        fitted.paste(band, (0, top))
    fitted.info = dict(image.info)
    return fitted


def _reencode(image: Any, media_type: str) -> tuple[bytes, str]:
    from PIL import Image

    if media_type == "image/png":
        encoded = _encode(image, "PNG", optimize=True)
        if len(encoded) <= KERNEL_MAX_IMAGE_BYTES:
            return encoded, "image/png"
    rgb = _to_rgb(image)
    for quality in _JPEG_QUALITIES:
        encoded = _encode(rgb, "JPEG", quality=quality, optimize=True)
        if len(encoded) <= KERNEL_MAX_IMAGE_BYTES:
            return encoded, "image/jpeg"
    rgb.thumbnail((_LAST_RESORT_SIDE, _LAST_RESORT_SIDE), Image.Resampling.LANCZOS)
    return _encode(rgb, "JPEG", quality=_JPEG_QUALITIES[-1], optimize=True), "image/jpeg"


def _to_rgb(image: Any) -> Any:
    """JPEG has no alpha: flatten transparency onto white."""
    from PIL import Image

    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB")


def _encode(image: Any, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


# --- filenames ------------------------------------------------------------------------


def _filename(part: dict[str, Any], index: int) -> str:
    metadata = part.get("metadata")
    name = metadata.get("filename") if isinstance(metadata, dict) else None
    if isinstance(name, str) and is_safe_filename(name):
        return name
    return f"agui-image-{index}"


def is_safe_filename(name: str) -> bool:
    """A plain file name, safe on POSIX and Windows alike."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if not name or size > 255 or name in (".", ".."):
        return False
    if name[-1] in ". ":
        return False
    if any(ch in _FORBIDDEN_FILENAME_CHARS or unicodedata.category(ch) == "Cc" for ch in name):
        return False
    stem = name.split(".", 1)[0].rstrip(" ").upper()
    return stem not in _WINDOWS_RESERVED
