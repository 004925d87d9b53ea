"""Is this really an image? One check for every place screenshots enter the warehouse.

Screenshots arrive from Chromium (collection), from other tools' folders (Online-Mind2Web
import) and leave for training sets (dataset export). A file named ``.png`` may be a git-lfs
pointer, an HTML error page, a zero-byte placeholder, a truncated download, a file whose pixel
data is corrupt behind valid headers, or a decompression bomb (a small file that would decode to
hundreds of MB in a judge, a trainer or the dashboard). Stored as an image blob it would reach
judges and trainers as a broken image, or exhaust their memory. :func:`validate_image` says why
bytes are not a usable image, or ``None`` when they are.

The check decodes every pixel under a budget (:data:`MAX_PIXELS`, checked from the header
before anything is decoded), so corrupt pixel data is rejected with a reason and no image that
passes can decode to more than 64 MiB:

- PNG (what Chromium writes): the header, the chunk CRCs (``Image.verify``), the ``IEND``
  marker, then the pixel stream itself, inflated in 1 MiB pieces (memory stays ~1 MiB whatever
  the image): it must be one whole zlib stream (its Adler-32 checksum holds), exactly as long as
  the header's size needs (not shorter: truncated; not longer: an ``IDAT`` that inflates to more
  than the image holds is refused as soon as it passes the expected size), every row with a
  known filter type. That covers what Pillow's PNG decoder can fail on (unfiltering cannot), at
  half its cost and without allocating the image: ~3 ms for a 1280x720 screenshot, ~6 ms for
  1920x1080 (a full Pillow decode: ~6 ms and ~12 ms).
- JPEG: decoded by libjpeg at 1/8 scale (all entropy-coded data is read; memory is 1/64 of the
  full image): ~1 ms. Broken markers, tables and headers fail.
- WebP: a full decode by libwebp (at most 64 MiB under the pixel budget): ~6-11 ms at 1280x720.

libjpeg and libwebp conceal damaged entropy-coded data (a warning, grey blocks), so for JPEG
and WebP a decode cannot tell such damage from a real image; only PNG checksums its pixels.

Pillow's ``ImageFile.LOAD_TRUNCATED_IMAGES`` must stay ``False`` (the default): with it on,
Pillow pads a truncated JPEG or WebP instead of failing.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from collections.abc import Iterator

from PIL import Image, UnidentifiedImageError

MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
MAX_PIXELS = 1 << 24  # 16.8 M: 4K is 8.3 M, a 1280x13000 full page fits; ≤ 64 MiB decoded (RGBA)
MAX_BYTES = 64 * 1024 * 1024

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"
_LFS = b"version https://git-lfs"
_PIECE = 1 << 20  # bytes inflated at a time: the PNG check's memory, whatever the image
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
_FILTERS = bytes(range(5))  # None, Sub, Up, Average, Paeth


class _Broken(Exception):
    """The pixel data is not what the header promises; the message says how."""


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


def validate_image(data: bytes, *, decode: bool = True) -> str | None:
    """``None`` if ``data`` is a whole PNG, JPEG or WebP image; otherwise the reason it is not.

    Decodes the pixels under the :data:`MAX_PIXELS` budget (see the module docstring).
    ``decode=False`` stops after the headers, chunk CRCs and end marker: only for a caller that
    decodes the image itself right after, under its own budget.
    """
    problem = _container_problem(data)
    if problem:
        return problem
    fmt = image_format(data)
    assert fmt is not None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            problem = _header_problem(fmt, data)
            if problem or not decode:
                return problem
            _decode(fmt, data)
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning):
        return f"not a readable {fmt} image"
    except (_Broken, OSError, SyntaxError, ValueError, EOFError, zlib.error, struct.error) as exc:
        return f"broken {fmt} image ({exc})"
    except Exception as exc:  # Pillow on hostile input (IndexError: a PNG without IDAT …)
        return f"not a readable {fmt} image ({type(exc).__name__}: {exc})"
    return None


def _container_problem(data: bytes) -> str | None:
    """Why ``data`` is not even shaped like an image file (empty, a pointer, no magic, cut)."""
    if not data:
        return "empty file (0 bytes)"
    if data.startswith(_LFS):
        return "a git-lfs pointer, not the image (fetch it with git lfs pull)"
    if len(data) > MAX_BYTES:
        return f"larger than {MAX_BYTES // (1024 * 1024)} MiB"
    fmt = image_format(data)
    if fmt is None:
        return f"not a PNG, JPEG or WebP image (starts with {data[:8]!r})"
    return _end_marker_problem(fmt, data)


def _header_problem(fmt: str, data: bytes) -> str | None:
    """Pillow's header parse, the size budget and ``verify`` (PNG chunk CRCs): nothing decoded."""
    with Image.open(io.BytesIO(data), formats=[fmt]) as im:
        width, height = im.size
        if width <= 0 or height <= 0:
            return f"{fmt} image of size {width}x{height}"
        if width * height > MAX_PIXELS:
            return f"{fmt} image too large ({width}x{height} pixels, more than {MAX_PIXELS:,})"
        im.verify()
    return None


def _decode(fmt: str, data: bytes) -> None:
    """Decode every pixel of an image whose header passed :func:`_header_problem`, in bounded
    memory; raise on the first problem."""
    if fmt == "PNG":
        _check_png_pixels(data)
        return
    with Image.open(io.BytesIO(data), formats=[fmt]) as im:
        if fmt == "JPEG":
            im.draft(None, (1, 1))  # libjpeg's 1/8 scale: all data read, 1/64 of the memory
        im.load()


def _end_marker_problem(fmt: str, data: bytes) -> str | None:
    if fmt == "PNG" and not data.endswith(_PNG_END):
        return "truncated PNG image (no IEND chunk at the end)"
    if fmt == "JPEG" and not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
        return "truncated JPEG image (no end-of-image marker)"
    if fmt == "WEBP" and int.from_bytes(data[4:8], "little") + 8 > len(data):
        return "truncated WebP image (shorter than its RIFF header says)"
    return None


# -- PNG pixel stream ---------------------------------------------------------------------------


def _check_png_pixels(data: bytes) -> None:
    """Inflate the ``IDAT`` stream piece by piece against the size the header promises."""
    header = struct.unpack(">IIBBBBB", data[16:29])
    width, height, depth, colour, compression, filtering, interlace = header
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        raise _Broken(f"unknown colour type {colour}")
    if (compression, filtering) != (0, 0) or interlace not in (0, 1):
        raise _Broken(f"unknown compression, filter or interlace method {header[4:]}")
    rows = list(_row_runs(width, height, channels * depth, interlace == 1))
    expected = sum(n * stride for _, stride, n in rows)
    inflater = zlib.decompressobj()
    done = 0
    for piece in _inflate(inflater, _idat_payloads(data)):
        if done + len(piece) > expected:
            raise _Broken(f"more pixel data than a {width}x{height} image holds")
        _check_filters(piece, done, rows)
        done += len(piece)
    if not inflater.eof:
        raise _Broken(f"pixel data ends early ({done:,} of {expected:,} bytes, stream not closed)")
    if inflater.unused_data:
        raise _Broken("data after the end of the pixel stream")
    if done != expected:
        raise _Broken(f"pixel data ends early ({done:,} of {expected:,} bytes)")


def _row_runs(width: int, height: int, bits: int, adam7: bool) -> Iterator[tuple[int, int, int]]:
    """(offset, stride, rows) of each run of equal rows in the inflated stream: one run, or one
    per non-empty Adam7 pass. A row is a filter-type byte and the row's packed pixels."""
    passes = _ADAM7 if adam7 else ((0, 0, 1, 1),)
    offset = 0
    for x0, y0, dx, dy in passes:
        w, h = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if w <= 0 or h <= 0:
            continue
        stride = 1 + (w * bits + 7) // 8
        yield offset, stride, h
        offset += stride * h


def _idat_payloads(data: bytes) -> Iterator[memoryview]:
    """The data of each ``IDAT`` chunk, in order (views, not copies)."""
    view, pos = memoryview(data), 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        kind = data[pos + 4 : pos + 8]
        if pos + 12 + length > len(data):
            raise _Broken(f"chunk {kind!r} runs past the end of the file")
        if kind == b"IDAT":
            yield view[pos + 8 : pos + 8 + length]
        elif kind == b"IEND":
            return
        pos += 12 + length


def _inflate(inflater: zlib._Decompress, payloads: Iterator[memoryview]) -> Iterator[bytes]:
    """The inflated stream in pieces of at most :data:`_PIECE` bytes."""
    for payload in payloads:
        pending: bytes | memoryview = payload
        while pending:
            piece = inflater.decompress(pending, _PIECE)
            pending = inflater.unconsumed_tail
            if piece:
                yield piece
            if inflater.eof:
                break


def _check_filters(piece: bytes, start: int, rows: list[tuple[int, int, int]]) -> None:
    """Every row that starts inside ``piece`` (at ``start`` in the stream) has a known filter."""
    end = start + len(piece)
    for offset, stride, n in rows:
        last = offset + stride * (n - 1)
        if last < start or offset >= end:
            continue
        first = offset if offset >= start else offset + -(-(start - offset) // stride) * stride
        stop = min(end, last + 1)
        if first >= stop:
            continue
        bad = piece[first - start : stop - start : stride].translate(None, _FILTERS)
        if bad:
            raise _Broken(f"unknown row filter type {bad[0]}")
