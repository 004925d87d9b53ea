"""Programmatic checkers: the final server state + the agent's answer → a verdict per criterion.

A checker spec is JSON stored with the task (``tasks.checker``). :func:`check` never raises: an
odd state (empty cart, unknown product, a garbage answer, a malformed spec) yields a failing
verdict whose criteria say why. :class:`Verdict` and :class:`Criterion` are the warehouse's
(``warehouse.records``), the same values the judges return.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from warehouse.records import Criterion, Verdict

__all__ = ["CHECKERS", "Criterion", "Verdict", "check", "checker", "numbers_in"]


CHECKERS: dict[str, Callable[[dict, dict, str | None], list[Criterion]]] = {}


def checker(kind: str):
    def deco(fn):
        CHECKERS[kind] = fn
        return fn

    return deco


def check(spec: Any, state: Any, answer: Any = None) -> Verdict:
    """Grade a final state and answer against a checker spec; never raises."""
    try:
        if not isinstance(spec, dict) or spec.get("kind") not in CHECKERS:
            kind = spec.get("kind") if isinstance(spec, dict) else None
            return Verdict.of([Criterion("spec", False, f"unknown checker kind {kind!r}")])
        st = state if isinstance(state, dict) else {}
        ans = answer if isinstance(answer, str) else None
        return Verdict.of(CHECKERS[spec["kind"]](spec, st, ans))
    except Exception as exc:  # a checker bug must not crash a rollout: report it
        return Verdict.of([Criterion("checker", False, f"checker error: {exc!r}")])


# -- answers ------------------------------------------------------------------------------------


def numbers_in(text: str) -> list[float]:
    """Numbers in free text: '1,234,567', '$12.50', '1 234' (thin spaces) → floats."""
    cleaned = re.sub(r"(?<=\d)[,\u202f\u00a0 ](?=\d{3}\b)", "", text)
    return [float(m) for m in re.findall(r"-?\d+(?:\.\d+)?", cleaned)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


@checker("answer")
def _answer(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    if not answer or not answer.strip():
        return [Criterion("answer given", False, "no final answer")]
    out = [Criterion("answer given", True)]
    expected = spec.get("expected")
    if spec.get("type") == "number":
        got = numbers_in(answer)
        ok = any(abs(g - float(expected)) <= float(spec.get("tolerance", 0.005)) for g in got)
        out.append(
            Criterion(
                "correct value",
                ok,
                "" if ok else f"expected {expected}, the answer has {got or 'no number'}",
            )
        )
    else:
        options = expected if isinstance(expected, list) else [expected]
        ok = any(_norm(str(o)) in _norm(answer) for o in options)
        out.append(
            Criterion("correct value", ok, "" if ok else f"expected {options[0]!r} in the answer")
        )
        wrong = spec.get("wrong") or []  # a comparison's other options
        if wrong:
            named = [w for w in wrong if _norm(str(w)) in _norm(answer)]
            detail = f"the answer also names {named[0]!r}" if named else ""
            out.append(Criterion("no other option named", not named, detail))
    return out


# -- shop ---------------------------------------------------------------------------------------


def _item_matches(item: Any, want: dict) -> bool:
    return isinstance(item, dict) and all(
        str(item.get(k, "")) == str(want.get(k, "")) for k in ("pid", "color", "size")
    )


def _items(items: list, wanted: list[dict], where: str) -> list[Criterion]:
    out = []
    for want in wanted:
        found = [i for i in items if _item_matches(i, want)]
        qty = sum(int(i.get("qty", 0)) for i in found)
        label = (
            f"{want.get('name', want.get('pid'))} ({want.get('color') or '-'}"
            f"/{want.get('size') or '-'}) × {want['qty']} in {where}"
        )
        detail = "" if qty == want["qty"] else f"found quantity {qty}"
        out.append(Criterion(label, qty == want["qty"], detail))
    return out


@checker("shop.cart")
def _shop_cart(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    cart = state.get("cart") if isinstance(state.get("cart"), list) else []
    return _items(cart, spec["items"], "the cart")


@checker("shop.order")
def _shop_order(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    orders = [o for o in state.get("orders", []) if isinstance(o, dict)]
    if not orders:
        return [Criterion("order placed", False, "no order was placed")]
    order = orders[-1]
    out = [Criterion("order placed", True)]
    out += _items(order.get("items", []), spec["items"], "the order")
    addr = order.get("address", {}) if isinstance(order.get("address"), dict) else {}
    for key, want in spec["address"].items():
        got = str(addr.get(key, ""))
        out.append(
            Criterion(
                f"address {key}",
                _norm(got) == _norm(want),
                "" if _norm(got) == _norm(want) else f"got {got!r}",
            )
        )
    return out


# -- travel -------------------------------------------------------------------------------------


@checker("travel.booking")
def _travel_booking(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    bookings = [b for b in state.get("bookings", []) if isinstance(b, dict)]
    if not bookings:
        return [Criterion("booking made", False, "no booking was made")]
    b = bookings[-1]
    out = [Criterion("booking made", True)]
    ok = b.get("fid") == spec["fid"]
    out.append(
        Criterion(
            "the right flight",
            ok,
            "" if ok else f"booked {b.get('airline')} {b.get('depart', '')} at ${b.get('price')}",
        )
    )
    for key in ("first_name", "last_name", "email", "seats"):
        got, want = str(b.get(key, "")), str(spec[key])
        out.append(
            Criterion(
                key, _norm(got) == _norm(want), "" if _norm(got) == _norm(want) else f"got {got!r}"
            )
        )
    return out


# -- mail ---------------------------------------------------------------------------------------


@checker("mail.sent")
def _mail_sent(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    sent = [s for s in state.get("sent", []) if isinstance(s, dict)]
    to = [s for s in sent if _norm(str(s.get("to", ""))) == _norm(spec["to"])]
    out = [
        Criterion(
            f"a message to {spec['to']}",
            bool(to),
            "" if to else f"{len(sent)} message(s) sent, none to that address",
        )
    ]
    if not to:
        return out
    m = to[-1]
    if spec.get("reply_to"):
        ok = m.get("reply_to") == spec["reply_to"]
        out.append(Criterion("is a reply to the message", ok, "" if ok else "not a reply"))
    if spec.get("subject_contains"):
        ok = _norm(spec["subject_contains"]) in _norm(str(m.get("subject", "")))
        out.append(Criterion("subject", ok, "" if ok else f"got {m.get('subject')!r}"))
    if spec.get("body_contains"):
        ok = _norm(spec["body_contains"]) in _norm(str(m.get("body", "")))
        out.append(Criterion("body mentions the text", ok, "" if ok else "text missing"))
    return out


@checker("mail.moved")
def _mail_moved(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    moved = state.get("moved") if isinstance(state.get("moved"), dict) else {}
    got = moved.get(spec["mid"], "inbox")
    ok = got == spec["folder"]
    return [Criterion(f"message in {spec['folder']}", ok, "" if ok else f"it is in {got}")]


@checker("mail.settings")
def _mail_settings(spec: dict, state: dict, answer: str | None) -> list[Criterion]:
    s = state.get("settings") if isinstance(state.get("settings"), dict) else {}
    out = []
    for key, want in spec["settings"].items():
        got = s.get(key)
        ok = _norm(str(got)) == _norm(str(want)) if not isinstance(want, bool) else got is want
        out.append(Criterion(f"setting {key}", ok, "" if ok else f"got {got!r}"))
    return out
