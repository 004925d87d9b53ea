"""The hf engine's per-request caps (issue 49): images decoded under the warehouse's pixel
budget, at most ``MAX_IMAGES`` images and ``MAX_PROMPT_CHARS`` characters a request, a body no
larger than ``MAX_BODY_BYTES``; each refusal says which cap, and the server keeps serving."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image

from rollouts.hf import decode_image
from serving.server import MAX_BODY_BYTES, MAX_IMAGES, MAX_PROMPT_CHARS
from tests.serving.test_protocol import WITH_IMAGE, png_url


def url_of(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def post(server, body: dict | bytes, path: str = "/chat/completions") -> httpx.Response:
    kw = {"json": body} if isinstance(body, dict) else {"content": body}
    headers = {"content-type": "application/json"}
    return httpx.post(server.base_url + path, headers=headers, timeout=120, **kw)


def ask(content: list | str) -> dict:
    return {
        "model": "tiny-idefics",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
    }


def test_a_decompression_bomb_is_refused_before_it_is_allocated():
    bomb = url_of(Image.new("1", (6000, 6000)))  # 36 M pixels in a few KiB of PNG
    with pytest.raises(ValueError, match="too large"):
        decode_image(bomb)
    with pytest.raises(ValueError, match="base64"):
        decode_image("data:image/png;base64,@@not base64@@")
    assert decode_image(png_url((1, 2, 3))).size == (80, 50)


def test_requests_past_a_cap_are_refused_naming_it_and_the_server_keeps_serving(hf_server):
    image = {"type": "image_url", "image_url": {"url": png_url((9, 9, 9))}}
    bomb = {"type": "image_url", "image_url": {"url": url_of(Image.new("1", (6000, 6000)))}}
    too_many = post(hf_server, ask([image] * (MAX_IMAGES + 1) + [{"type": "text", "text": "x"}]))
    assert too_many.status_code == 400 and f"at most {MAX_IMAGES}" in too_many.text
    too_long = post(hf_server, ask("a" * (MAX_PROMPT_CHARS + 1)))
    assert too_long.status_code == 400 and "characters" in too_long.text
    prompt = {"model": "tiny-idefics", "prompt": "b" * (MAX_PROMPT_CHARS + 1), "max_tokens": 2}
    assert post(hf_server, prompt, "/completions").status_code == 400
    bombed = post(hf_server, ask([bomb, {"type": "text", "text": "x"}]))
    assert bombed.status_code == 400 and "too large" in bombed.text
    huge = post(hf_server, b'{"pad": "' + b"z" * (MAX_BODY_BYTES + 1) + b'"}')
    assert huge.status_code == 413 and "MiB" in huge.text
    fine = post(hf_server, {**ask(WITH_IMAGE[0]["content"])})
    assert fine.status_code == 200 and fine.json()["choices"][0]["message"]["content"] is not None
