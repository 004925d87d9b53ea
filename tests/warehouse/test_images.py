"""validate_image: real images pass, everything that only looks like one says why it is not."""

from __future__ import annotations

import io
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from warehouse.images import media_type, validate_image


def encode(fmt: str, size: tuple[int, int] = (64, 40)) -> bytes:
    im = Image.new("RGB", size, (10, 120, 200))
    for x in range(0, size[0], 3):  # some detail, so that encoders write several blocks
        im.putpixel((x, x % size[1]), (255, 0, x % 255))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_real_images_pass(fmt: str):
    data = encode(fmt)
    assert validate_image(data) is None
    assert validate_image(data, decode=True) is None
    assert media_type(data) == {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 123\n"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file"),
        (LFS, "git-lfs pointer"),
        (b"<html><body>404 Not Found</body></html>", "not a PNG, JPEG or WebP"),
        (b"GIF89a" + b"\x00" * 40, "not a PNG, JPEG or WebP"),
        (encode("PNG")[:-12], "truncated PNG"),
        (encode("PNG")[:40], "truncated PNG"),
        (encode("JPEG")[: len(encode("JPEG")) // 2], "truncated JPEG"),
        (encode("WEBP")[:-10], "truncated WebP"),
    ],
)
def test_non_images_are_rejected_with_a_reason(data: bytes, reason: str):
    got = validate_image(data)
    assert got is not None and reason in got
    assert media_type(data) is None or "truncated" in reason


def test_a_png_with_a_corrupted_chunk_is_rejected():
    data = bytearray(encode("PNG"))
    data[60] ^= 0xFF  # inside the IDAT payload: the chunk CRC no longer matches
    got = validate_image(bytes(data))
    assert got is not None and "PNG" in got


def test_a_pixel_bomb_header_is_rejected():
    data = bytearray(encode("PNG"))  # claim 20000 x 4000 pixels in IHDR, with a valid CRC
    data[16:24] = (20_000).to_bytes(4, "big") + (4_000).to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    data = bytes(data)
    got = validate_image(data)
    assert got is not None and "too large" in got


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise_and_rarely_pass(data: bytes):
    got = validate_image(data)
    assert got is not None or media_type(data) is not None  # passing implies a known format
