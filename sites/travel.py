"""``travel``: flight search with city autocomplete and a date picker, results with sorting and
filters (served slowly, like a real fare search), and a validated booking form."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from sites.common import SiteContext, make_app, route
from sites.content import AIRLINES, FIRST, LAST, City, Content, Flight
from sites.taskspec import ACCEPT_COOKIES, TaskSpec, answer, click, select, template, type_

SORTS = ("price", "duration", "depart")


def new_state() -> dict[str, Any]:
    return {"bookings": []}


def resolve_city(content: Content, text: str) -> City | None:
    """A city from a code (``ZUT``), a name (``Zutan``) or an autocomplete label."""
    text = text.strip()
    m = re.search(r"\(([A-Z]{3})\)\s*$", text)
    code = m.group(1) if m else text.upper()
    if code in content.city_by_code:
        return content.city_by_code[code]
    return next((c for c in content.cities if c.name.lower() == text.lower()), None)


def find_flights(content: Content, params: dict[str, str]) -> list[Flight]:
    """Results as the page shows them: filtered by stops/airline, sorted (shared with tasks)."""
    o, d = (
        resolve_city(content, params.get("from", "")),
        resolve_city(content, params.get("to", "")),
    )
    if not o or not d:
        return []
    flights = content.flights(o.code, d.code, params.get("date", ""))
    stops = params.get("stops", "any")
    if stops in ("0", "1"):
        flights = [f for f in flights if f.stops <= int(stops)]
    if params.get("airline"):
        flights = [f for f in flights if f.airline == params["airline"]]
    key = params.get("sort", "price")
    attr = {"price": "price", "duration": "duration_min", "depart": "depart"}.get(key, "price")
    return sorted(flights, key=lambda f: (getattr(f, attr), f.fid))


# -- pages: each handler takes the site's context first (bound by sites.common.route) ----


async def home(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    return ctx.render(
        request,
        "travel/home.html",
        error=request.query_params.get("error"),
        today=c.today.isoformat(),
    )


async def cities(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    q = request.query_params.get("q", "").strip().lower()
    hits = [
        {"code": x.code, "label": f"{x.name} ({x.code})"}
        for x in c.cities
        if q and (x.name.lower().startswith(q) or x.code.lower().startswith(q))
    ]
    return JSONResponse(hits[:8])


async def flights(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    params = dict(request.query_params)
    o, d = resolve_city(c, params.get("from", "")), resolve_city(c, params.get("to", ""))
    if not o or not d or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", params.get("date", "")):
        return RedirectResponse(
            "/?error=Choose+both+cities+from+the+list+and+a+date.", status_code=303
        )
    await asyncio.sleep(ctx.slow_s)  # fare search is slow, as on the real web
    results = find_flights(c, params)
    return ctx.render(
        request,
        "travel/results.html",
        flights=results,
        origin=o,
        dest=d,
        params=params,
        airlines=AIRLINES,
        sorts=SORTS,
    )


async def book(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    f = c.flight(request.path_params["fid"])
    if f is None:
        return ctx.render(request, "travel/notfound.html", status=404)
    if request.method == "GET":
        return ctx.render(request, "travel/book.html", f=f, form={}, errors={})
    form = {k: str(v).strip() for k, v in (await request.form()).items()}
    errors = _booking_errors(form)
    if errors:
        return ctx.render(request, "travel/book.html", status=422, f=f, form=form, errors=errors)
    st = ctx.state(request)
    bid = f"B{len(st['bookings']) + 1:03d}"
    st["bookings"].append(
        {
            "bid": bid,
            "fid": f.fid,
            "origin": f.origin,
            "dest": f.dest,
            "date": f.date,
            "airline": f.airline,
            "price": f.price,
            "first_name": form["first_name"],
            "last_name": form["last_name"],
            "email": form["email"],
            "seats": int(form["seats"]),
        }
    )
    return RedirectResponse(f"/booking/{bid}", status_code=303)


async def booking(ctx: SiteContext, request: Request) -> Response:
    st = ctx.state(request)
    b = next((b for b in st["bookings"] if b["bid"] == request.path_params["bid"]), None)
    if b is None:
        return ctx.render(request, "travel/notfound.html", status=404)
    return ctx.render(request, "travel/booking.html", b=b)


def build(ctx: SiteContext):
    """The site's app: the handlers above, each bound to ``ctx``, on their routes."""
    return make_app(
        ctx,
        [
            route("/", home, ctx),
            route("/api/cities", cities, ctx),
            route("/flights", flights, ctx),
            route("/book/{fid}", book, ctx, methods=["GET", "POST"]),
            route("/booking/{bid}", booking, ctx),
        ],
    )


def _booking_errors(form: dict[str, str]) -> dict[str, str]:
    errors = {}
    if not form.get("first_name"):
        errors["first_name"] = "First name is required."
    if not form.get("last_name"):
        errors["last_name"] = "Last name is required."
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", form.get("email", "")):
        errors["email"] = "Enter a valid email address."
    if form.get("seats") not in ("1", "2", "3", "4"):
        errors["seats"] = "Choose 1 to 4 seats."
    return errors


# -- tasks: this site's templates, registered for sites.tasks.generate -----------------------------


def _route(c: Content, rng: random.Random) -> tuple[Any, Any, str]:
    o, d = rng.sample(c.cities, 2)
    date = (c.today + dt.timedelta(days=rng.randint(5, 60))).isoformat()
    return o, d, date


def _search_steps(o: Any, d: Any, date: str) -> list[str]:
    return [
        ACCEPT_COOKIES,
        type_("#from", o.name[:3]),
        click(f"#from-suggestions .suggestion[data-code='{o.code}']"),
        type_("#to", d.name[:3]),
        click(f"#to-suggestions .suggestion[data-code='{d.code}']"),
        type_("#date", date),
        click("#search-flights"),
    ]


@template("travel_book_cheapest")
def travel_book_cheapest(c: Content, rng: random.Random) -> TaskSpec | None:
    o, d, date = _route(c, rng)
    nonstop = rng.random() < 0.5
    params = {"from": o.code, "to": d.code, "date": date, "stops": "0" if nonstop else "any"}
    flights = find_flights(c, params)
    if not flights:
        return None
    f = flights[0]
    first, last = rng.choice(FIRST), rng.choice(LAST)
    email = f"{first.lower()}.{last.lower()}@example.net"
    seats = rng.randint(1, 3)
    steps = _search_steps(o, d, date)
    if nonstop:
        steps += [select("#stops", "Nonstop only"), click("#apply-filters")]
    steps += [
        click("#select-1"),
        type_("#first_name", first),
        type_("#last_name", last),
        type_("#email", email),
        select("#seats", str(seats)),
        click("#confirm-booking"),
    ]
    kind = "nonstop flight" if nonstop else "flight"
    return TaskSpec(
        "travel_book_cheapest",
        "travel",
        f"Book the cheapest {kind} from {o.name} to {d.name} on {date} for {first} {last} "
        f"({email}), {seats} seat{'s' if seats > 1 else ''}.",
        "/",
        [
            f"A {kind} {o.name} → {d.name} on {date} was booked",
            f"It is the cheapest such flight (${f.price})",
            f"Passenger {first} {last}, {email}, {seats} seat(s)",
        ],
        {
            "kind": "travel.booking",
            "fid": f.fid,
            "first_name": first,
            "last_name": last,
            "email": email,
            "seats": seats,
        },
        steps,
        params,
    )


@template("travel_cheapest_price")
def travel_cheapest_price(c: Content, rng: random.Random) -> TaskSpec | None:
    o, d, date = _route(c, rng)
    flights = find_flights(c, {"from": o.code, "to": d.code, "date": date})
    if not flights:
        return None
    price = flights[0].price
    return TaskSpec(
        "travel_cheapest_price",
        "travel",
        f"How much is the cheapest flight from {o.name} to {d.name} on {date}?",
        "/",
        [f"Flights {o.name} → {d.name} on {date} were searched", f"The answer is ${price}"],
        {"kind": "answer", "type": "number", "expected": price},
        [*_search_steps(o, d, date), answer(f"${price}")],
        {"from": o.code, "to": d.code, "date": date},
    )
