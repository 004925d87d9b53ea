"""webloop's action grammar: typed actions, a parser for model output, and a canonical printer.

One implementation serves rollouts, judging and training (and the reference solutions of the
bundled tasks). Grammar (one call per action; strings in single or double quotes)::

    click(x, y)                 coordinates (pixels, or 0-1000 normalized by config)
    click(e12)  click([12])     an accessibility-snapshot ref / a set-of-marks id
    click(css="#add-to-cart")   a CSS selector (scripted experts, tests)
    type("text")                type into the focused element
    type(e12, "text")           type into a target (also [12], css="…"; replaces its value)
    press("Enter")              a key or chord ("Control+A")
    scroll(down)  scroll(dx, dy)  scroll(css="#list", down)
    select(css="#color", "Red") choose an option of a <select>
    goto("https://…")  back()  wait()  wait(2)
    answer("text")              the final answer; ends the episode

:func:`parse_action` reads free model output (reasoning first, the action last: the last
``Action:`` line, else the last call-shaped line) and returns an action or a :class:`ParseError`
saying what was wrong. :func:`format_action` prints the canonical form, and
``parse_action(format_action(a)) == a``.

Stored forms: :func:`to_dict` is the JSON the warehouse keeps (``steps.action``,
``interventions.proposed_action``), :func:`action_from_dict` reads it back, and
:func:`proposed_action_text` turns any stored action value (JSON text, a dict, a grammar
string) into its canonical text.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

REF = re.compile(r"(?:f\d+)?e\d+")  # aria_snapshot refs: e12, or f1e12 inside frames
DIRECTIONS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}

#: The action grammar and parser's version: bump it when the parser accepts or reads model output
#: differently (it enters every evaluation's protocol, so results read by another parser are
#: not compared silently).
ACTION_GRAMMAR_VERSION = 1


@dataclass(frozen=True)
class Target:
    """Where an action applies: exactly one of coordinates, ref, mark or selector."""

    x: float | None = None
    y: float | None = None
    ref: str | None = None
    mark: int | None = None
    selector: str | None = None

    def __post_init__(self) -> None:
        kinds = [
            self.x is not None,
            self.ref is not None,
            self.mark is not None,
            self.selector is not None,
        ]
        if sum(kinds) != 1 or (self.x is None) != (self.y is None):
            raise ValueError("a target is one of: x and y, ref, mark, selector")

    def render(self) -> str:
        if self.x is not None:
            return f"{_num(self.x)}, {_num(self.y)}"
        if self.ref is not None:
            return self.ref
        if self.mark is not None:
            return f"[{self.mark}]"
        return f"css={_quote(self.selector or '')}"


@dataclass(frozen=True)
class Click:
    target: Target


@dataclass(frozen=True)
class Type:
    text: str
    target: Target | None = None


@dataclass(frozen=True)
class Press:
    key: str


@dataclass(frozen=True)
class Scroll:
    dx: float = 0
    dy: float = 0
    target: Target | None = None


@dataclass(frozen=True)
class Select:
    target: Target
    value: str


@dataclass(frozen=True)
class Goto:
    url: str


@dataclass(frozen=True)
class Back:
    pass


@dataclass(frozen=True)
class Wait:
    seconds: float = 1.0


@dataclass(frozen=True)
class Answer:
    text: str


Action = Click | Type | Press | Scroll | Select | Goto | Back | Wait | Answer
SCROLL_STEP = 600


@dataclass(frozen=True)
class ParseError:
    """Model output that is not a valid action; ``reason`` says why, ``text`` what was seen."""

    reason: str
    text: str


def _quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _num(v: float | None) -> str:
    return str(int(v)) if v is not None and float(v).is_integer() else str(v)


def format_action(a: Action) -> str:
    """The canonical text of an action (what models are trained to emit)."""
    match a:
        case Click(target=t):
            return f"click({t.render()})"
        case Type(text=text, target=None):
            return f"type({_quote(text)})"
        case Type(text=text, target=t):
            return f"type({t.render()}, {_quote(text)})"
        case Press(key=k):
            return f"press({_quote(k)})"
        case Scroll(dx=dx, dy=dy, target=t):
            where = f"{t.render()}, " if t else ""
            for name, (ux, uy) in DIRECTIONS.items():
                if (dx, dy) == (ux * SCROLL_STEP, uy * SCROLL_STEP):
                    return f"scroll({where}{name})"
            return f"scroll({where}{_num(dx)}, {_num(dy)})"
        case Select(target=t, value=v):
            return f"select({t.render()}, {_quote(v)})"
        case Goto(url=u):
            return f"goto({_quote(u)})"
        case Back():
            return "back()"
        case Wait(seconds=s):
            return "wait()" if s == 1.0 else f"wait({_num(s)})"
        case Answer(text=t):
            return f"answer({_quote(t)})"
    raise TypeError(f"not an action: {a!r}")


# -- parsing ------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|“[^”]*”|‘[^’]*’)
      | (?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
      | (?P<mark>\[\s*\d+\s*\])
      | (?P<kw>[A-Za-z_]\w*\s*=)
      | (?P<word>[A-Za-z_][\w+\-]*)
      | (?P<comma>,)
    )""",
    re.VERBOSE,
)
_CALL = re.compile(r"\b(click|type|press|scroll|select|goto|back|wait|answer)\s*\(", re.I)


def parse_action(output: str, bounds: tuple[float, float] | None = None) -> Action | ParseError:
    """Parse the action at the end of free model output.

    Accepts the grammar (after the last ``Action:``, in or out of markdown fences) and
    JSON-style actions (``{"action": "click", "x": 10, "y": 20}``, ``{"name": "type",
    "arguments": {...}}``, ``{"action_type": "click", "coordinate": [x, y]}``). With
    ``bounds=(width, height)``, coordinates outside the screen are a parse error.
    """
    action = _parse(output)
    if bounds is not None and not isinstance(action, ParseError):
        return check_bounds(action, *bounds, text=output)
    return action


def check_bounds(
    action: Action, width: float, height: float, text: str = ""
) -> Action | ParseError:
    """A :class:`ParseError` when the action's coordinates fall outside ``width x height``."""
    t = getattr(action, "target", None)
    if isinstance(t, Target) and t.x is not None and not (0 <= t.x < width and 0 <= t.y < height):
        return ParseError(
            f"coordinates ({_num(t.x)}, {_num(t.y)}) are outside the "
            f"{_num(width)}x{_num(height)} screen",
            text,
        )
    return action


def _parse(output: str) -> Action | ParseError:
    text = output.strip()
    if not text:
        return ParseError("empty output", output)
    region, marked = _action_region(text)
    from_json = _json_action(region)
    if from_json is not None:
        return from_json
    candidate = _call_text(region, first=marked)
    if candidate is None and marked:  # "Action:" inside a JSON string: the JSON is the action
        from_json = _json_action(text)
        if from_json is not None:
            return from_json
    if candidate is None:
        return ParseError("no action found (expected e.g. click(120, 340) after 'Action:')", output)
    try:
        name, args = _split_call(candidate)
        return _build(name.lower(), args)
    except ValueError as exc:
        return ParseError(str(exc), candidate)


_VERB_KEYS = ("action", "type", "action_type", "name", "function", "tool")
_ARG_KEYS = ("arguments", "args", "parameters", "params", "input")


def _json_action(text: str) -> Action | ParseError | None:
    """An action given as the last JSON object of the output, or None if there is none."""
    start = text.rfind("{")
    while start != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.rfind("{", 0, start)
            continue
        try:
            found = _from_json(obj, text) if isinstance(obj, dict) else None
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. "mark": "three"
            return ParseError(f"JSON action: {exc}", text)
        if found is not None:
            return found
        start = text.rfind("{", 0, start)  # an inner object (arguments): look outward
    return None


def _finite(v: Any) -> float:
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"not a finite number: {v!r}")
    return f


def _from_json(obj: dict[str, Any], text: str) -> Action | ParseError | None:
    verb = next((obj[k] for k in _VERB_KEYS if isinstance(obj.get(k), str)), None)
    for _ in range(8):  # {"action": {"action": {...}}}: a few levels, not unbounded recursion
        if verb is not None:
            break
        obj = obj.get("action") if isinstance(obj.get("action"), dict) else None
        if not obj:
            return None
        verb = next((obj[k] for k in _VERB_KEYS if isinstance(obj.get(k), str)), None)
    if verb is None:
        return None
    args = dict(obj)
    for k in _ARG_KEYS:
        if isinstance(obj.get(k), dict):
            args.update(obj[k])
    verb = verb.strip().lower().replace("left_click", "click").replace("type_text", "type")
    items: list[tuple[str, Any]] = []
    coord = args.get("coordinate") or args.get("coordinates") or args.get("point")
    if isinstance(coord, list | tuple) and len(coord) == 2:
        items += [("num", _finite(coord[0])), ("num", _finite(coord[1]))]
    elif isinstance(args.get("x"), int | float) and isinstance(args.get("y"), int | float):
        items += [("num", _finite(args["x"])), ("num", _finite(args["y"]))]
    for key, kind in (
        ("ref", "ref"),
        ("element", "ref"),
        ("element_id", "ref"),
        ("mark", "mark"),
        ("selector", "css"),
        ("css", "css"),
    ):
        if args.get(key) is not None:
            value = args[key]
            items.append((kind, int(value) if kind == "mark" else str(value)))
            break
    for key in ("text", "value", "option", "key", "keys", "url", "answer", "content"):
        if isinstance(args.get(key), str) and key not in ("type",):
            items.append(("str", args[key]))
            break
    if isinstance(args.get("direction"), str):
        items.append(("word", args["direction"]))
    elif isinstance(args.get("dy"), int | float) or isinstance(args.get("dx"), int | float):
        items += [("num", _finite(args.get("dx", 0))), ("num", _finite(args.get("dy", 0)))]
    if isinstance(args.get("seconds"), int | float):
        items.append(("num", _finite(args["seconds"])))
    try:
        return _build(verb, items)
    except ValueError as exc:
        return ParseError(f"JSON action: {exc}", text)


def _top_level_calls(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, closed) of call-shaped spans, skipping calls nested in an earlier closed
    span (``answer("click(1, 2)")`` is one answer, not a click)."""
    spans: list[tuple[int, int, bool]] = []
    end = 0
    for m in _CALL.finditer(text):
        if m.start() < end:
            continue
        call = _balanced(text[m.start() :])
        closed = call.endswith(")")
        spans.append((m.start(), m.start() + len(call), closed))
        if closed:
            end = m.start() + len(call)
    return spans


def _action_region(text: str) -> tuple[str, bool]:
    """The text after the last ``Action:`` marker that is not inside a call's arguments
    (``type("Action: x")`` types text), and whether there was such a marker."""
    closed = [(s, e) for s, e, ok in _top_level_calls(text) if ok]
    for m in reversed(list(re.finditer(r"action\s*:\s*", text, re.I))):
        if not any(s < m.start() < e for s, e in closed):
            return text[m.end() :], True
    return text, False


def _call_text(region: str, first: bool) -> str | None:
    """The first call after an ``Action:`` marker, else the last call of the output."""
    calls = _top_level_calls(region)
    if not calls:
        return None
    start, end, _ = calls[0] if first else calls[-1]
    return region[start:end]


def _balanced(s: str) -> str:
    depth, quote, i = 0, None, 0
    while i < len(s):
        ch = s[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return s[: i + 1]
        i += 1
    return s


def _split_call(call: str) -> tuple[str, list[tuple[str, Any]]]:
    m = re.match(r"\s*(\w+)\s*\((.*)\)\s*$", call, re.S)
    if not m:
        raise ValueError(f"unbalanced parentheses in {call!r}")
    name, body = m.group(1), m.group(2)
    args: list[tuple[str, Any]] = []
    pos, pending_kw = 0, None
    while pos < len(body):
        tm = _TOKEN.match(body, pos)
        if not tm or tm.end() == pos:
            if body[pos:].strip() == "":
                break
            raise ValueError(f"cannot read arguments of {name}(): {body[pos:]!r}")
        pos = tm.end()
        kind = tm.lastgroup
        if kind == "comma":
            continue
        if kind == "kw":
            pending_kw = tm.group("kw").rstrip("= ").lower()
            continue
        value: Any = tm.group(kind)
        if kind == "str":
            value = _unquote(value)
        elif kind == "num":
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"number out of range in {name}(): {tm.group(kind)}")
        elif kind == "mark":
            value = int(value.strip("[] "))
        args.append((pending_kw or kind, value))
        pending_kw = None
    return name, args


def _unquote(s: str) -> str:
    if s[0] in "“‘":
        return s[1:-1]
    if s.startswith('"'):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s[1:-1]
    return s[1:-1].replace("\\'", "'").replace("\\\\", "\\")


def _target(args: list[tuple[str, Any]]) -> tuple[Target | None, list[tuple[str, Any]]]:
    """Take a target off the front of ``args``."""
    if not args:
        return None, args
    kind, v = args[0]
    if kind in ("css", "selector"):
        return Target(selector=str(v)), args[1:]
    if kind == "mark":
        return Target(mark=v), args[1:]
    if kind == "ref" or (kind == "word" and REF.fullmatch(str(v))):
        return Target(ref=str(v)), args[1:]
    if kind == "num" and len(args) >= 2 and args[1][0] == "num":
        return Target(x=args[0][1], y=args[1][1]), args[2:]
    return None, args


def _build(name: str, args: list[tuple[str, Any]]) -> Action:
    if name == "click":
        t, rest = _target(args)
        if t is None or rest:
            raise ValueError(
                'click needs one target: click(x, y), click(e12), click([3]) or click(css="…")'
            )
        return Click(t)
    if name == "type":
        t, rest = _target(args)
        if len(rest) != 1 or rest[0][0] not in ("str", "text"):
            raise ValueError('type needs a quoted text: type("hello") or type(e12, "hello")')
        return Type(text=rest[0][1], target=t)
    if name == "press":
        if len(args) != 1:
            raise ValueError('press needs one key: press("Enter")')
        return Press(key=str(args[0][1]))
    if name == "scroll":
        t, rest = _target(args) if args and args[0][0] != "num" else (None, args)
        if t is None and len(args) in (3, 4) and args[0][0] == args[1][0] == "num":
            t, rest = _target(args)  # scroll(x, y, down) / scroll(x, y, dx, dy): at a point
        if len(rest) == 1 and str(rest[0][1]).lower() in DIRECTIONS:
            ux, uy = DIRECTIONS[str(rest[0][1]).lower()]
            return Scroll(ux * SCROLL_STEP, uy * SCROLL_STEP, t)
        if len(rest) == 2 and all(k == "num" for k, _ in rest):
            return Scroll(rest[0][1], rest[1][1], t)
        raise ValueError("scroll needs a direction (up/down/left/right) or dx, dy")
    if name == "select":
        t, rest = _target(args)
        if t is None or len(rest) != 1:
            raise ValueError('select needs a target and an option: select(css="#c", "Red")')
        return Select(target=t, value=str(rest[0][1]))
    if name == "goto":
        if len(args) != 1 or args[0][0] not in ("str", "url"):
            raise ValueError("goto needs a quoted URL")
        return Goto(url=args[0][1])
    if name == "back":
        return Back()
    if name == "wait":
        return Wait(float(args[0][1])) if args and args[0][0] == "num" else Wait()
    if name == "answer":
        if len(args) != 1:
            raise ValueError("answer needs one quoted text")
        return Answer(text=str(args[0][1]))
    raise ValueError(f"unknown action {name!r}")


def to_dict(a: Action) -> dict[str, Any]:
    """A JSON-able dict of an action (for the warehouse's ``steps.action``)."""
    d: dict[str, Any] = {"type": type(a).__name__.lower()}
    for key, value in a.__dict__.items():
        if isinstance(value, Target):
            d[key] = {k: v for k, v in value.__dict__.items() if v is not None}
        elif value is not None:
            d[key] = value
    return d


_CLASSES: dict[str, type] = {
    c.__name__.lower(): c for c in (Click, Type, Press, Scroll, Select, Goto, Back, Wait, Answer)
}


def action_from_dict(d: dict[str, Any]) -> Action | ParseError:
    """The inverse of :func:`to_dict` (``steps.action``, ``interventions.proposed_action``);
    other JSON action shapes go through the parser."""
    cls = _CLASSES.get(str(d.get("type", "")).lower())
    if cls is not None:
        try:
            kw = {k: v for k, v in d.items() if k != "type"}
            for key in ("target",):
                if isinstance(kw.get(key), dict):
                    kw[key] = Target(**kw[key])
            return cls(**kw)
        except (TypeError, ValueError):
            pass
    return parse_action(json.dumps(d))


def proposed_action_text(value: Any) -> str | None:
    """Canonical action text of an intervention's ``proposed_action`` (JSON text, dict or a
    grammar string); None when it is not an action."""
    if value is None:
        return None
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if isinstance(value, str):
        action = parse_action(value)
    elif isinstance(value, dict):
        # the grammar text when stored beside the fields ("text": curation.interventions;
        # "action_text"), else the to_dict fields
        texts = [value.get(k) for k in ("text", "action_text") if isinstance(value.get(k), str)]
        parsed = [a for a in map(parse_action, texts) if not isinstance(a, ParseError)]
        action = parsed[0] if parsed else action_from_dict(value)
    else:
        return None
    return None if isinstance(action, ParseError) else format_action(action)
