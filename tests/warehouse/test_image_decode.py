"""validate_image decodes the pixels under a budget: corrupt pixel data behind valid headers and
CRCs is rejected with a reason, a decompression bomb is rejected without being inflated, and a
real screenshot still passes in a few milliseconds.

The PNGs here are written by hand (chunks, CRCs, zlib stream) so that each one is broken in one
known way while everything the old structural check looked at (magic, header, chunk CRCs,
``IEND``) stays valid.
"""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
import zlib

import pytest
from PIL import Image, ImageDraw, ImageFile

from warehouse.images import MAX_PIXELS, validate_image

_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, idat: bytes | list[bytes], *, interlace: int = 0) -> bytes:
    """An 8-bit RGB PNG with the given (already compressed) IDAT payload(s); all CRCs valid."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, interlace)
    parts = [idat] if isinstance(idat, bytes) else idat
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + b"".join(chunk(b"IDAT", p) for p in parts)
        + chunk(b"IEND", b"")
    )


def pixels(width: int, height: int) -> list[list[tuple[int, int, int]]]:
    return [
        [((x * 7) % 256, (y * 13) % 256, (x ^ y) % 256) for x in range(width)]
        for y in range(height)
    ]


def raw_rows(rows: list[list[tuple[int, int, int]]], filt: int = 0) -> bytes:
    """The filtered scanlines (filter type ``filt`` written, pixels left as they are)."""
    return b"".join(bytes([filt]) + bytes(c for px in row for c in px) for row in rows)


def adam7_raw(rows: list[list[tuple[int, int, int]]]) -> bytes:
    """The scanlines of an Adam7-interlaced image: each pass's sub-image, filter type 0."""
    out = b""
    for x0, y0, dx, dy in _ADAM7:
        sub = [row[x0::dx] for row in rows[y0::dy]]
        if sub and sub[0]:
            out += raw_rows(sub)
    return out


def decoded(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB").tobytes()


# -- what passes ---------------------------------------------------------------------------------


def test_hand_written_pngs_pass_and_decode_to_their_pixels():
    rows = pixels(13, 11)
    flat = b"".join(bytes(c for px in row for c in px) for row in rows)
    plain = png(13, 11, zlib.compress(raw_rows(rows)))
    split = png(13, 11, [zlib.compress(raw_rows(rows))[i : i + 7] for i in range(0, 400, 7)])
    interlaced = png(13, 11, zlib.compress(adam7_raw(rows)), interlace=1)
    for data in (plain, split, interlaced):
        assert decoded(data) == flat  # the helper writes what Pillow reads
        assert validate_image(data) is None


@pytest.mark.parametrize(("width", "height"), [(1, 1), (1, 9), (9, 1), (2, 3), (5, 5)])
def test_tiny_interlaced_pngs_with_empty_passes_pass(width: int, height: int):
    rows = pixels(width, height)
    data = png(width, height, zlib.compress(adam7_raw(rows)), interlace=1)
    assert decoded(data) == b"".join(bytes(c for px in row for c in px) for row in rows)
    assert validate_image(data) is None


def screenshot(width: int, height: int) -> bytes:
    """A screenshot-like PNG: flat panels, rules and text, as Chromium writes them."""
    im = Image.new("RGB", (width, height), (245, 246, 248))
    draw = ImageDraw.Draw(im)
    draw.rectangle((0, 0, width, 58), fill=(30, 45, 60))
    for y in range(80, height - 40, 26):
        draw.text((40, y), f"Item {y}: a line of product text, $ {y * 1.37:.2f}", fill=(20, 20, 20))
        draw.line((40, y + 20, width - 40, y + 20), fill=(220, 220, 225))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_a_screenshot_passes_quickly(size: tuple[int, int]):
    data = screenshot(*size)
    assert validate_image(data) is None
    took = []
    for _ in range(3):
        t = time.perf_counter()
        validate_image(data)
        took.append(time.perf_counter() - t)
    assert sorted(took)[1] < 0.25  # ~3 ms / ~6 ms measured; generous for a loaded machine


# -- corrupt pixel data behind valid headers and CRCs ------------------------------------------


def _corrupted_stream() -> bytes:
    stream = bytearray(zlib.compress(raw_rows(pixels(40, 30))))
    stream[len(stream) // 2] ^= 0xFF  # inside the deflate data: the chunk CRC is recomputed
    return bytes(stream)


@pytest.mark.parametrize(
    ("idat", "reason"),
    [
        (_corrupted_stream(), "broken PNG image"),
        (zlib.compress(raw_rows(pixels(40, 20))), "ends early"),  # 20 of 30 rows
        (zlib.compress(raw_rows(pixels(40, 30)))[:-40], "ends early"),  # stream never closed
        (zlib.compress(raw_rows(pixels(40, 31))), "more pixel data"),  # a row too many
        (zlib.compress(raw_rows(pixels(40, 30), filt=7)), "unknown row filter type 7"),
        (zlib.compress(raw_rows(pixels(40, 30))) + b"junk", "after the end of the pixel"),
        (b"", "ends early"),
    ],
)
def test_corrupt_pixel_data_is_rejected_with_a_reason(idat: bytes, reason: str):
    data = png(40, 30, idat)
    got = validate_image(data)
    assert got is not None and reason in got, got


def test_a_bad_filter_in_a_late_adam7_pass_is_rejected():
    raw = bytearray(adam7_raw(pixels(16, 16)))
    last_pass_row = len(raw) - (1 + 16 * 3) * 8  # pass 7: 8 rows of 16 pixels
    raw[last_pass_row] = 9
    got = validate_image(png(16, 16, zlib.compress(bytes(raw)), interlace=1))
    assert got is not None and "unknown row filter type 9" in got


# -- decompression bombs -------------------------------------------------------------------------


def _zeros_stream(n: int) -> bytes:
    z = zlib.compressobj(9)
    block = bytes(1 << 20)
    out = [z.compress(block) for _ in range(n >> 20)]
    return b"".join(out) + z.compress(bytes(n % (1 << 20))) + z.flush()


def test_an_idat_that_inflates_far_past_the_image_is_stopped_early():
    """A 100x100 image (30 KB of pixels) whose IDAT inflates to 64 MiB: refused once it passes
    the 30 KB, without ever holding more than ~1 MiB of it."""
    data = png(100, 100, _zeros_stream(64 << 20))
    assert len(data) < 300_000
    tracemalloc.start()
    t = time.perf_counter()
    got = validate_image(data)
    took = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got is not None and "more pixel data than a 100x100 image holds" in got
    assert peak < 8 << 20 and took < 1.0, (peak, took)


def test_a_small_file_that_would_decode_to_192_mb_is_rejected_before_decoding():
    """8000 x 8000 RGB (192 MB of pixels, 64 M pixels: within the old 64 M budget) in ~190 KB."""
    width = height = 8000
    data = png(width, height, _zeros_stream(height * (1 + width * 3)))
    assert len(data) < 400_000 and width * height > MAX_PIXELS
    t = time.perf_counter()
    got = validate_image(data)
    assert got is not None and "too large (8000x8000 pixels" in got
    assert time.perf_counter() - t < 0.1  # from the header alone: nothing inflated


def test_the_pixel_budget_bounds_decoded_memory():
    assert MAX_PIXELS * 4 <= 64 << 20  # RGBA, as Pillow stores RGB too
    assert MAX_PIXELS >= 3840 * 2160 and MAX_PIXELS >= 1280 * 12_000  # 4K, a long full page


def test_pillow_does_not_pad_truncated_images():
    """With ``LOAD_TRUNCATED_IMAGES`` on, Pillow pads a truncated JPEG or WebP instead of
    failing, and the decode check would pass it: nothing the warehouse imports turns it on."""
    import curation.examples  # noqa: F401
    import warehouse.blobs
    import warehouse.interop.om2w  # noqa: F401

    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_a_png_without_pixel_chunks_gets_a_reason_not_an_exception():
    """Pillow's ``verify`` raises IndexError on it; the check must answer for hostile input."""
    body = zlib.compress(raw_rows(pixels(8, 8)))
    ihdr = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAx", body) + chunk(b"IEND", b"")
    got = validate_image(data)
    assert got is not None and "PNG" in got


def test_an_unknown_interlace_method_is_rejected():
    ihdr = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 7)
    body = zlib.compress(raw_rows(pixels(8, 8)))
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
    got = validate_image(data)
    assert got is not None and "interlace method" in got
