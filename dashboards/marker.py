"""The action drawn on a step's screenshot, server-side with PIL (no page content reaches HTML).

:func:`draw_action` returns the annotated PNG and a one-line description of what it drew
(shown as the image caption, and what tests read back).
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageDraw

MARKER = (230, 20, 60)  # the marker colour (RGB); tests look for it in the image
RADIUS = 14


def draw_action(
    png: bytes,
    action: dict[str, Any] | None,
    *,
    box: tuple[float, ...] | None = None,
    norm1000: bool = False,
) -> tuple[bytes, str]:
    """Draw ``action`` (a stored ``steps.action`` dict) on the screenshot ``png``.

    * a click/type/select at coordinates: a circle with a cross at (x, y) (``norm1000``:
      coordinates are 0-1000 of the image size);
    * an action on an element whose ``box`` (x, y, width, height in screenshot pixels) is
      known: the box outlined;
    * typed text: written beside the marker (or at the top);
    * scroll: an arrow from the centre in the scroll direction.

    Returns (PNG bytes, description). Raises ValueError when ``png`` is not an image.
    """
    try:
        img = Image.open(io.BytesIO(png)).convert("RGB")
    except Exception as exc:  # PIL raises several types for bad bytes
        raise ValueError(f"the screenshot cannot be decoded: {exc}") from None
    draw = ImageDraw.Draw(img)
    what = _draw(draw, img.size, action or {}, box, norm1000)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue(), what


def _draw(
    draw: ImageDraw.ImageDraw,
    size: tuple[int, int],
    action: dict[str, Any],
    box: tuple[float, ...] | None,
    norm1000: bool,
) -> str:
    kind = str(action.get("type") or "")
    if not kind:
        return "no action (the model output did not parse)"
    target = action.get("target") if isinstance(action.get("target"), dict) else {}
    point = _point(target, size, norm1000)
    parts = [kind]
    anchor: tuple[float, float] | None = None
    if point is not None:
        x, y = point
        draw.ellipse((x - RADIUS, y - RADIUS, x + RADIUS, y + RADIUS), outline=MARKER, width=4)
        draw.line((x - RADIUS, y, x + RADIUS, y), fill=MARKER, width=2)
        draw.line((x, y - RADIUS, x, y + RADIUS), fill=MARKER, width=2)
        parts.append(f"at ({x:.0f}, {y:.0f})")
        anchor = (x + RADIUS + 4, y - RADIUS)
    elif box is not None and len(box) == 4:
        bx, by, bw, bh = box
        draw.rectangle((bx, by, bx + bw, by + bh), outline=MARKER, width=4)
        parts.append(
            f"on {target.get('ref') or 'element'} box ({bx:.0f}, {by:.0f}, {bw:.0f}x{bh:.0f})"
        )
        anchor = (bx, by + bh + 4)
    elif target:
        label = target.get("ref") or target.get("selector") or target.get("mark")
        parts.append(f"on {label} (no box recorded)")
    if kind == "scroll":
        dx, dy = float(action.get("dx") or 0), float(action.get("dy") or 0)
        parts.append(_arrow(draw, size, dx, dy))
    if kind == "type" and action.get("text") is not None:
        text = str(action["text"])
        draw.text(anchor or (8, 8), f"type: {text[:60]}", fill=MARKER)
        parts.append(f"text {text[:60]!r}")
    return " ".join(parts)


def _point(
    target: dict[str, Any], size: tuple[int, int], norm1000: bool
) -> tuple[float, float] | None:
    if target.get("x") is None or target.get("y") is None:
        return None
    x, y = float(target["x"]), float(target["y"])
    if norm1000:
        x, y = x * size[0] / 1000, y * size[1] / 1000
    return x, y


def _arrow(draw: ImageDraw.ImageDraw, size: tuple[int, int], dx: float, dy: float) -> str:
    if not dx and not dy:
        return "(no direction)"
    cx, cy = size[0] / 2, size[1] / 2
    length = min(size) / 3
    norm = (dx * dx + dy * dy) ** 0.5
    ex, ey = cx + dx / norm * length, cy + dy / norm * length
    draw.line((cx, cy, ex, ey), fill=MARKER, width=5)
    draw.ellipse((ex - 6, ey - 6, ex + 6, ey + 6), fill=MARKER)
    vertical = "down" if dy > 0 else "up" if dy < 0 else ""
    horizontal = "right" if dx > 0 else "left" if dx < 0 else ""
    return " ".join(w for w in (vertical, horizontal) if w)
