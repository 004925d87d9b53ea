"""The action marker drawn server-side (dashboards.marker) and the Markdown escaping of
messages (dashboards.ui.md_escape)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from dashboards.marker import MARKER, draw_action
from dashboards.ui import md_escape


def blank(w: int = 200, h: int = 100) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (255, 255, 255)).save(buf, "PNG")
    return buf.getvalue()


def red(png: bytes) -> set[tuple[int, int]]:
    img = Image.open(io.BytesIO(png)).convert("RGB")
    return {
        (x, y)
        for x in range(img.width)
        for y in range(img.height)
        if img.getpixel((x, y)) == MARKER
    }


def test_click_at_coordinates_draws_a_circle_there():
    png, what = draw_action(blank(), {"type": "click", "target": {"x": 50, "y": 40}})
    assert what == "click at (50, 40)"
    pts = red(png)
    assert (50, 40) in pts  # the cross
    assert all(abs(x - 50) <= 16 and abs(y - 40) <= 16 for x, y in pts)


def test_norm1000_coordinates_are_scaled_to_the_image():
    png, what = draw_action(
        blank(), {"type": "click", "target": {"x": 500, "y": 500}}, norm1000=True
    )
    assert what == "click at (100, 50)"
    assert (100, 50) in red(png)


def test_element_box_is_outlined_and_typed_text_named():
    action = {"type": "type", "text": "kettle", "target": {"ref": "e5"}}
    png, what = draw_action(blank(), action, box=(20, 30, 120, 24))
    assert what == "type on e5 box (20, 30, 120x24) text 'kettle'"
    pts = red(png)
    assert (20, 30) in pts and (140, 54) in pts  # two corners of the box
    assert (80, 42) not in pts  # the inside is left alone


def test_scroll_arrow_points_down_and_unknown_box_is_said():
    png, what = draw_action(blank(), {"type": "scroll", "dx": 0, "dy": 600})
    assert what == "scroll down"
    pts = red(png)
    assert min(y for _, y in pts) >= 45 and max(y for _, y in pts) > 70  # from the centre down
    _, what = draw_action(blank(), {"type": "click", "target": {"ref": "e9"}})
    assert what == "click on e9 (no box recorded)"


def test_no_action_and_bad_bytes():
    png, what = draw_action(blank(), None)
    assert what.startswith("no action") and not red(png)
    with pytest.raises(ValueError, match="cannot be decoded"):
        draw_action(b"not an image", {"type": "click", "target": {"x": 1, "y": 1}})


def test_md_escape():
    assert md_escape("![x](http://e) *b* a_b") == r"\!\[x\]\(http://e\) \*b\* a\_b"
