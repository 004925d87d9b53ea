"""Is this really an image? One check for every place screenshots enter the warehouse.

Screenshots arrive from Chromium (collection), from other tools' folders (Online-Mind2Web
import) and leave for training sets (dataset export). A file named ``.png`` may be a git-lfs
pointer, an HTML error page, a zero-byte placeholder or a truncated download; stored as an
image blob it would reach judges and trainers as a broken image. :func:`validate_image` says
why bytes are not a usable image, or ``None`` when they are.

The default check is structural and cheap (~0.2 ms for a 1280x720 PNG): the format from the
magic bytes (PNG, JPEG, WebP), Pillow's header parse and size, PNG chunk CRCs
(``Image.verify``) and the format's end marker (PNG ``IEND``, JPEG ``EOI``, the WebP RIFF
length). ``decode=True`` also decodes every pixel (~20 ms), for places where that cost is fine.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
MAX_PIXELS = 64_000_000  # far above any screenshot (8K is 33 M); guards against pixel bombs
MAX_BYTES = 64 * 1024 * 1024

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"
_LFS = b"version https://git-lfs"


def image_format(data: bytes) -> str | None:
    """``"PNG"``, ``"JPEG"`` or ``"WEBP"`` from the magic bytes, else ``None``."""
    if data.startswith(_PNG_MAGIC):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def media_type(data: bytes) -> str | None:
    """The MIME type of an image's bytes (``image/png`` …), ``None`` if not a known image."""
    fmt = image_format(data)
    return MEDIA_TYPES.get(fmt) if fmt else None


def validate_image(data: bytes, *, decode: bool = False) -> str | None:
    """``None`` if ``data`` is a whole PNG, JPEG or WebP image; otherwise the reason it is not."""
    if not data:
        return "empty file (0 bytes)"
    if data.startswith(_LFS):
        return "a git-lfs pointer, not the image (fetch it with git lfs pull)"
    if len(data) > MAX_BYTES:
        return f"larger than {MAX_BYTES // (1024 * 1024)} MiB"
    fmt = image_format(data)
    if fmt is None:
        return f"not a PNG, JPEG or WebP image (starts with {data[:8]!r})"
    end = _end_marker_problem(fmt, data)
    if end:
        return end
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[fmt]) as im:
                width, height = im.size
                if width <= 0 or height <= 0:
                    return f"{fmt} image of size {width}x{height}"
                if width * height > MAX_PIXELS:
                    return f"{fmt} image too large ({width}x{height} pixels)"
                im.verify()
            if decode:
                with Image.open(io.BytesIO(data), formats=[fmt]) as im:
                    im.load()
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning):
        return f"not a readable {fmt} image"
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        return f"broken {fmt} image ({exc})"
    return None


def _end_marker_problem(fmt: str, data: bytes) -> str | None:
    if fmt == "PNG" and not data.endswith(_PNG_END):
        return "truncated PNG image (no IEND chunk at the end)"
    if fmt == "JPEG" and not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        return "truncated JPEG image (no end-of-image marker)"
    if fmt == "WEBP" and int.from_bytes(data[4:8], "little") + 8 > len(data):
        return "truncated WebP image (shorter than its RIFF header says)"
    return None
