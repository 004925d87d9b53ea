"""Grounding a scripted plan in a model's action space.

Reference solutions name elements by CSS selector (``click(css="#add-to-cart")``); a model never
emits those. :func:`ground` turns one planned action into the action a model would emit on the
current page, in one of the action spaces:

* ``ref``: the element's ref in the accessibility snapshot (``click(e12)``), the ref the model's
  observation shows (``aria_snapshot(mode="ai")`` keeps an element's ref while its role and name
  stay the same, so the element's own snapshot names the ref of the page snapshot).
* ``coords``: a point inside the element's box that hits the element (``click(640, 212)``),
  in pixels or ``norm1000`` like the environment. An element outside the viewport first gets a
  ``scroll(0, dy)`` that brings it to the middle: a preparatory step (``done=False``); the
  planned action comes at the next step, grounded again on the page as it then is.
* ``marks``: the element's set-of-marks id (``click([7])``) from the marks the observation put
  on the page; an unmarked element is scrolled to, or else grounded as coordinates.
* ``css``: the plan as it is (tests, humans).

Nothing here changes the page: the grounded action is executed by the caller, through the
shared executor (:func:`rollouts.browser.execute`), like any model's action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from rollouts.actions import Action, Click, Scroll, Select, Target, Type

SPACES = ("ref", "coords", "marks", "css")
_FIRST_REF = re.compile(r"\A\s*-[^\n]*?\[ref=((?:f\d+)?e\d+)\]")

# A point of the element's box whose topmost element is the element (or inside it, or a label
# of it); None when no probe point inside the viewport hits it.
_HIT_JS = """
(el) => {
  const r = el.getBoundingClientRect();
  const fr = [[0.5, 0.5], [0.3, 0.5], [0.7, 0.5], [0.5, 0.3], [0.5, 0.7], [0.15, 0.5],
              [0.85, 0.5], [0.3, 0.3], [0.7, 0.7], [0.3, 0.7], [0.7, 0.3]];
  for (const [fx, fy] of fr) {
    const x = Math.round(r.left + r.width * fx), y = Math.round(r.top + r.height * fy);
    if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
    const hit = document.elementFromPoint(x, y);
    if (hit && (hit === el || el.contains(hit) || hit.control === el)) return [x, y];
  }
  return null;
}
"""


class GroundingError(RuntimeError):
    """The planned action's element could not be found on the page."""


@dataclass(frozen=True)
class Grounded:
    """The model-facing action; ``done`` is False for a preparatory action (a scroll that brings
    the planned element into view), after which the plan's action is still to come."""

    action: Action
    done: bool = True
    how: str = ""


def _target_of(action: Action) -> Target | None:
    t = getattr(action, "target", None)
    return t if isinstance(t, Target) else None


async def ground(
    page: Any,
    action: Action,
    space: str,
    *,
    coords: str = "pixels",
    timeout_ms: float = 10_000,
) -> Grounded:
    """``action`` with its CSS target replaced by the ``space`` equivalent on ``page`` now.
    Actions without a CSS target come back unchanged."""
    if space not in SPACES:
        raise ValueError(f"unknown action space {space!r}; one of {SPACES}")
    t = _target_of(action)
    if space == "css" or t is None or t.selector is None:
        return Grounded(action, how="as planned")
    loc = page.locator(t.selector).first
    try:
        await loc.wait_for(state="visible", timeout=timeout_ms)
    except Exception as exc:
        raise GroundingError(f"{t.selector!r} is not visible: {str(exc)[:200]}") from exc
    if space == "ref":
        ref = await element_ref(loc)
        if ref is not None:
            return Grounded(_retarget(action, Target(ref=ref)), how="ref")
        space = "coords"  # an element without a ref (no accessible role): point at it
    if space == "marks":
        mark = await loc.get_attribute("data-webloop-mark")
        if mark and mark.isdigit():
            return Grounded(_retarget(action, Target(mark=int(mark))), how="mark")
    return await _ground_point(page, loc, action, coords)


async def element_ref(loc: Any) -> str | None:
    """The element's ref in the page's accessibility snapshot (its own snapshot's first node)."""
    snap = await loc.aria_snapshot(mode="ai")
    m = _FIRST_REF.match(snap or "")
    return m.group(1) if m else None


async def _ground_point(page: Any, loc: Any, action: Action, coords: str) -> Grounded:
    vp = page.viewport_size or {"width": 1280, "height": 800}
    vw, vh = vp["width"], vp["height"]
    point = await loc.evaluate(_HIT_JS)
    if point is None:
        box = await loc.bounding_box()
        if box is None:
            raise GroundingError("the element has no box")
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        if 0 <= cx < vw and 0 <= cy < vh:  # in view but covered: point at it anyway
            point = [round(cx), round(cy)]
        else:
            dx = 0 if 0 <= cx < vw else round(cx - vw / 2)
            dy = 0 if 0 <= cy < vh else round(cy - vh / 2)
            return Grounded(Scroll(dx, dy), done=False, how="scroll into view")
    x, y = float(point[0]), float(point[1])
    if coords == "norm1000":
        x, y = float(round(x / vw * 1000)), float(round(y / vh * 1000))
        x, y = min(x, 999.0), min(y, 999.0)
    return Grounded(_retarget(action, Target(x=x, y=y)), how="coords")


def _retarget(action: Action, target: Target) -> Action:
    if isinstance(action, Click | Type | Select | Scroll):
        return replace(action, target=target)
    raise TypeError(f"no target to ground in {action!r}")


async def ref_point(page: Any, ref: str, coords: str = "pixels") -> Target | None:
    """The coordinates of a ref's element (for noise injected in the coordinate space), or None
    when it is not hit-testable in the viewport."""
    loc = page.locator(f"aria-ref={ref}")
    try:
        point = await loc.evaluate(_HIT_JS, timeout=1000)
    except Exception:
        return None
    if point is None:
        return None
    g = await _ground_point(page, loc, Click(Target(ref=ref)), coords)
    return g.action.target if g.done else None  # type: ignore[union-attr]
