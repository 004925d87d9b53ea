"""validate_image: real images pass, everything that only looks like one says why it is not."""

from __future__ import annotations

import io
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.hypothesis_profiles import examples
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


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise_and_pass_only_in_a_known_format(data: bytes):
    got = validate_image(data)
    assert got is not None or media_type(data) is not None  # passing implies a known format


def test_random_bytes_behind_an_image_signature_do_not_pass():
    """2,000 seeded random payloads behind each format's signature: none is taken for an
    image (the check decodes; a signature alone proves nothing)."""
    import random

    rng = random.Random(11)
    heads = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF\x10\x00\x00\x00WEBPVP8 "]
    passed = [
        head
        for head in heads
        for _ in range(2000 // len(heads))
        if validate_image(head + rng.randbytes(rng.randint(0, 600))) is None
    ]
    assert passed == []


# -- where screenshots enter: the blob store and the collector's writer -----------------------


def test_put_image_refuses_non_images_and_stores_nothing(tmp_path):
    from warehouse.blobs import BlobStore, NotAnImageError

    store = BlobStore(tmp_path / "blobs")
    assert store.put_image(encode("PNG")).new
    with pytest.raises(NotAnImageError, match="git-lfs pointer"):
        store.put_image(LFS)
    with pytest.raises(NotAnImageError, match="empty file"):
        store.put_image(b"")
    assert len(list(store)) == 1


def test_the_collector_writer_stores_only_image_screenshots(wh):
    import asyncio

    from rollouts.engine import Finished
    from rollouts.writer import BatchWriter
    from warehouse.blobs import sha256_hex
    from warehouse.records import Blob, Step, Trajectory

    good, bad, tree = encode("PNG"), encode("PNG")[:-20], b"- button 'OK' [ref=e1]"
    blobs = {sha256_hex(x): x for x in (good, bad, tree)}
    g, b, t = (sha256_hex(x) for x in (good, bad, tree))
    traj = Trajectory(
        traj_id="t1",
        run_id="r1",
        task_id="k1",
        policy="p",
        status="success",
        n_steps=2,
        answer="42",
        meta={"final_screenshot": b},
    )
    steps = [
        Step(traj_id="t1", step_idx=0, screenshot_hash=g, a11y_hash=t, action_text="click(e1)"),
        Step(traj_id="t1", step_idx=1, screenshot_hash=b, a11y_hash=t, action_text="stop(42)"),
    ]

    async def run():
        writer = BatchWriter(wh, batch_steps=1, interval_s=0.05).start()
        await writer.put(Finished(traj, steps, blobs))
        return await writer.close()

    stats = asyncio.run(run())
    assert stats.screenshots_rejected == 1 and "truncated PNG" in stats.rejections[0]
    rows = wh.read(Step).sort("step_idx")
    assert rows["screenshot_hash"].to_list() == [g, None]
    assert rows["action_text"].to_list() == ["click(e1)", "stop(42)"]
    stored = wh.records(Trajectory)[0]
    assert stored.answer == "42" and stored.meta["final_screenshot"] is None
    media = {x.hash: x.media_type for x in wh.records(Blob)}
    assert media == {g: "image/png", t: "text/plain; charset=utf-8"}
    assert not wh.blobs.exists(b)
