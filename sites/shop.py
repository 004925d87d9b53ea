"""``shop``: catalogue search with filters, sorting and pagination; product pages with variants;
cart; checkout with a validated address form; order confirmations.

Agent obstacles: cookie banner, a newsletter modal on the first home-page visit, reviews
loaded lazily by script, pagination, form validation errors.
"""

from __future__ import annotations

import io
import math
import random
import re
from functools import lru_cache
from typing import Any

from PIL import Image, ImageDraw
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from sites.common import SiteContext, make_app, route
from sites.content import CATEGORIES, COUNTRIES, FIRST, LAST, Content, Product
from sites.taskspec import ACCEPT_COOKIES, TaskSpec, answer, click, select, template, type_
from warehouse.ids import stable_hash

PAGE_SIZE = 12
SORTS = {"relevance": None, "price_asc": "price", "price_desc": "-price", "rating": "-rating"}


def new_state() -> dict[str, Any]:
    return {"cart": [], "orders": [], "modal_dismissed": False}


def search(content: Content, params: dict[str, str]) -> list[Product]:
    """Filter and sort products as the search page does (shared with task generators)."""
    q = params.get("q", "").strip().lower()
    items = content.products
    if q:
        words = q.split()
        items = [
            p for p in items if all(w in p.name.lower() or w in p.category.lower() for w in words)
        ]
    if params.get("category"):
        items = [p for p in items if p.category == params["category"]]
    if params.get("brand"):
        items = [p for p in items if p.brand == params["brand"]]
    lo, hi = _num(params.get("min_price")), _num(params.get("max_price"))
    if lo is not None:
        items = [p for p in items if p.price >= lo]
    if hi is not None:
        items = [p for p in items if p.price <= hi]
    key = SORTS.get(params.get("sort", "relevance"))
    if key:
        attr = key.lstrip("-")
        items = sorted(items, key=lambda p: (getattr(p, attr), p.pid), reverse=key[0] == "-")
    return items


def _num(v: str | None) -> float | None:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


#: The named background colours of product photos: only the pixels show a product's (no page
#: text names it, and none is a variant colour), for the pixels-only template.
PHOTO_COLOURS = {
    "Brown": (120, 72, 30),
    "Navy": (20, 30, 110),
    "Orange": (235, 120, 20),
    "Pink": (240, 130, 180),
    "Purple": (120, 50, 160),
    "Teal": (0, 128, 128),
}


def photo_colour(seed: int, pid: str) -> str:
    """The name of product ``pid``'s photo background colour (a function of the site seed)."""
    names = sorted(PHOTO_COLOURS)
    return names[int(stable_hash(seed, pid, "photo"), 16) % len(names)]


@lru_cache(maxsize=4096)
def product_png(seed: int, pid: str, name: str) -> bytes:
    """A product's photo: its named background colour, a lighter disc, its name in white."""
    color = PHOTO_COLOURS[photo_colour(seed, pid)]
    img = Image.new("RGB", (240, 180), color)
    d = ImageDraw.Draw(img)
    d.ellipse([70, 40, 170, 140], fill=tuple((c + 255) // 2 for c in color))
    d.text((10, 160), name[:34], fill=(255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# -- pages: each handler takes the site's context first (bound by sites.common.route) ----


async def home(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    st = ctx.state(request)
    featured = sorted(c.products, key=lambda p: (-p.rating, p.pid))[:8]
    return ctx.render(
        request,
        "shop/home.html",
        categories=CATEGORIES,
        products=featured,
        show_modal=not st["modal_dismissed"],
    )


async def dismiss_modal(ctx: SiteContext, request: Request) -> Response:
    ctx.state(request)["modal_dismissed"] = True
    return RedirectResponse("/", status_code=303)


async def search_page(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    params = dict(request.query_params)
    results = search(c, params)
    pages = max(1, math.ceil(len(results) / PAGE_SIZE))
    page = min(max(1, int(_num(params.get("page")) or 1)), pages)
    shown = results[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    brands = sorted({p.brand for p in c.products})
    base = {k: v for k, v in params.items() if k != "page" and v}
    return ctx.render(
        request,
        "shop/search.html",
        results=shown,
        total=len(results),
        page=page,
        pages=pages,
        params=params,
        base=base,
        categories=CATEGORIES,
        brands=brands,
        sorts=list(SORTS),
    )


async def product(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    p = c.product_by_id.get(request.path_params["pid"])
    if p is None:
        return ctx.render(request, "shop/notfound.html", status=404)
    error = request.query_params.get("error")
    return ctx.render(request, "shop/product.html", p=p, reviews=_reviews(c, p)[:3], error=error)


async def reviews_api(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    p = c.product_by_id.get(request.path_params["pid"])
    if p is None:
        return JSONResponse({"reviews": []}, status_code=404)
    off = int(_num(request.query_params.get("offset")) or 0)
    return JSONResponse({"reviews": _reviews(c, p)[off : off + 5]})


async def image(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    p = c.product_by_id.get(request.path_params["pid"])
    if p is None:
        return Response(status_code=404)
    return Response(product_png(c.seed, p.pid, p.name), media_type="image/png")


async def cart_add(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    form = await request.form()
    p = c.product_by_id.get(str(form.get("pid", "")))
    if p is None:
        return RedirectResponse("/cart", status_code=303)
    color, size = str(form.get("color", "")), str(form.get("size", ""))
    qty = int(_num(str(form.get("qty", "1"))) or 0)
    problem = _variant_problem(p, color, size, qty)
    if problem:
        return RedirectResponse(f"/product/{p.pid}?error={problem}", status_code=303)
    cart = ctx.state(request)["cart"]
    for item in cart:
        if (item["pid"], item["color"], item["size"]) == (p.pid, color, size):
            item["qty"] += qty
            break
    else:
        cart.append(
            {
                "pid": p.pid,
                "name": p.name,
                "color": color,
                "size": size,
                "qty": qty,
                "price": p.price,
            }
        )
    return RedirectResponse("/cart", status_code=303)


async def cart_remove(ctx: SiteContext, request: Request) -> Response:
    form = await request.form()
    idx = int(_num(str(form.get("index", "-1"))) or -1)
    cart = ctx.state(request)["cart"]
    if 0 <= idx < len(cart):
        cart.pop(idx)
    return RedirectResponse("/cart", status_code=303)


async def cart_page(ctx: SiteContext, request: Request) -> Response:
    cart = ctx.state(request)["cart"]
    total = round(sum(i["price"] * i["qty"] for i in cart), 2)
    return ctx.render(request, "shop/cart.html", cart=cart, total=total)


async def checkout(ctx: SiteContext, request: Request) -> Response:
    st = ctx.state(request)
    if request.method == "GET":
        return ctx.render(
            request,
            "shop/checkout.html",
            form={},
            errors={},
            countries=COUNTRIES,
            cart=st["cart"],
        )
    form = {k: str(v).strip() for k, v in (await request.form()).items()}
    errors = _address_errors(form)
    if not st["cart"]:
        errors["cart"] = "Your cart is empty."
    if errors:
        return ctx.render(
            request,
            "shop/checkout.html",
            status=422,
            form=form,
            errors=errors,
            countries=COUNTRIES,
            cart=st["cart"],
        )
    oid = f"o{len(st['orders']) + 1:03d}"
    address = {k: form.get(k, "") for k in ("name", "street", "city", "zip", "country")}
    total = round(sum(i["price"] * i["qty"] for i in st["cart"]), 2)
    st["orders"].append({"oid": oid, "items": st["cart"], "address": address, "total": total})
    st["cart"] = []
    return RedirectResponse(f"/order/{oid}", status_code=303)


async def order(ctx: SiteContext, request: Request) -> Response:
    st = ctx.state(request)
    o = next((o for o in st["orders"] if o["oid"] == request.path_params["oid"]), None)
    if o is None:
        return ctx.render(request, "shop/notfound.html", status=404)
    return ctx.render(request, "shop/order.html", order=o)


def build(ctx: SiteContext):
    """The site's app: the handlers above, each bound to ``ctx``, on their routes."""
    return make_app(
        ctx,
        [
            route("/", home, ctx),
            route("/modal/dismiss", dismiss_modal, ctx, methods=["POST"]),
            route("/search", search_page, ctx),
            route("/product/{pid}", product, ctx),
            route("/api/reviews/{pid}", reviews_api, ctx),
            route("/img/product/{pid}.png", image, ctx),
            route("/cart", cart_page, ctx),
            route("/cart/add", cart_add, ctx, methods=["POST"]),
            route("/cart/remove", cart_remove, ctx, methods=["POST"]),
            route("/checkout", checkout, ctx, methods=["GET", "POST"]),
            route("/order/{oid}", order, ctx),
        ],
    )


def _variant_problem(p: Product, color: str, size: str, qty: int) -> str | None:
    if p.colors and color not in p.colors:
        return "Please choose a colour."
    if p.sizes and size not in p.sizes:
        return "Please choose a size."
    if not 1 <= qty <= 10:
        return "Quantity must be between 1 and 10."
    return None


def _address_errors(form: dict[str, str]) -> dict[str, str]:
    errors = {}
    for key, label in (("name", "Full name"), ("street", "Street"), ("city", "City")):
        if not form.get(key):
            errors[key] = f"{label} is required."
    if not re.fullmatch(r"\d{5}", form.get("zip", "")):
        errors["zip"] = "ZIP code must be 5 digits."
    if form.get("country") not in COUNTRIES:
        errors["country"] = "Choose a country."
    return errors


def _reviews(c: Content, p: Product) -> list[dict[str, Any]]:
    rng = random.Random(stable_hash(c.seed, p.pid, "reviews"))
    words = ["sturdy", "pretty", "light", "solid", "cheap-feeling", "great", "useful", "nice"]
    return [
        {
            "author": f"Customer {rng.randrange(100, 999)}",
            "stars": rng.randint(1, 5),
            "text": f"Quite {rng.choice(words)} and {rng.choice(words)}.",
        }
        for _ in range(p.n_reviews)
    ]


# -- tasks: this site's templates, registered for sites.tasks.generate -----------------------------


def _pick_variant(p: Product, rng: random.Random) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "name": p.name,
        "color": rng.choice(p.colors) if p.colors else "",
        "size": rng.choice(p.sizes) if p.sizes else "",
        "qty": rng.randint(1, 3),
    }


def _describe(item: dict[str, Any]) -> str:
    bits = [f"{item['qty']} × the {item['name']}"]
    if item["color"]:
        bits.append(f"in {item['color']}")
    if item["size"]:
        bits.append(f"size {item['size']}")
    return " ".join(bits)


def _add_item_steps(item: dict[str, Any]) -> list[str]:
    steps = [
        type_("#search-input", item["name"]),
        click("#search-button"),
        click(f".result[data-pid='{item['pid']}'] a"),
    ]
    if item["color"]:
        steps.append(select("#color", item["color"]))
    if item["size"]:
        steps.append(select("#size", item["size"]))
    if item["qty"] != 1:
        steps.append(type_("#qty", str(item["qty"])))
    return [*steps, click("#add-to-cart")]


def _item_rubric(item: dict[str, Any]) -> str:
    return f"{_describe(item)} is in the cart/order".replace("× the", "×")


@template("shop_add_to_cart")
def shop_add_to_cart(c: Content, rng: random.Random) -> TaskSpec:
    item = _pick_variant(rng.choice(c.products), rng)
    return TaskSpec(
        "shop_add_to_cart",
        "shop",
        f"Add {_describe(item)} to your shopping cart.",
        "/",
        [_item_rubric(item), "Nothing else needs to be bought"],
        {"kind": "shop.cart", "items": [item]},
        [ACCEPT_COOKIES, click("#close-modal"), *_add_item_steps(item)],
        item,
    )


@template("shop_buy")
def shop_buy(c: Content, rng: random.Random) -> TaskSpec:
    products = rng.sample(c.products, rng.randint(1, 2))
    items = [_pick_variant(p, rng) for p in products]
    who = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    address = {
        "name": who,
        "street": f"{rng.randint(1, 99)} {rng.choice(LAST)} Street",
        "city": rng.choice(c.cities).name,
        "zip": f"{rng.randint(10000, 99999)}",
        "country": rng.choice(COUNTRIES),
    }
    where = (
        f"{address['name']}, {address['street']}, {address['zip']} {address['city']}, "
        f"{address['country']}"
    )
    steps = [ACCEPT_COOKIES, click("#close-modal")]
    for item in items:
        steps += _add_item_steps(item)
    steps += [
        click("#checkout"),
        *(type_(f"#{k}", address[k]) for k in ("name", "street", "city", "zip")),
        select("#country", address["country"]),
        click("#place-order"),
    ]
    return TaskSpec(
        "shop_buy",
        "shop",
        f"Buy {' and '.join(_describe(i) for i in items)}, shipped to {where}.",
        "/",
        [*(_item_rubric(i) for i in items), f"The order ships to {where}", "The order was placed"],
        {"kind": "shop.order", "items": items, "address": address},
        steps,
        {"items": items, "address": address},
    )


@template("shop_cheapest")
def shop_cheapest(c: Content, rng: random.Random) -> TaskSpec | None:
    cat, brand = rng.choice(CATEGORIES), rng.choice(sorted({p.brand for p in c.products}))
    hits = search(c, {"category": cat, "brand": brand, "sort": "price_asc"})
    if len(hits) < 2 or hits[0].price == hits[1].price:
        return None
    price = f"${hits[0].price:.2f}"
    return TaskSpec(
        "shop_cheapest",
        "shop",
        f"What is the price of the cheapest {cat} product from {brand} on Shoply?",
        "/search",
        [f"The {cat} products of {brand} were compared by price", f"The answer is {price}"],
        {"kind": "answer", "type": "number", "expected": hits[0].price},
        [
            ACCEPT_COOKIES,
            select("#filter-category", cat),
            select("#filter-brand", brand),
            select("#sort", "price asc"),
            click("#apply-filters"),
            answer(price),
        ],
        {"category": cat, "brand": brand},
    )


@template("shop_product_fact")
def shop_product_fact(c: Content, rng: random.Random) -> TaskSpec:
    p = rng.choice(c.products)
    field_, value, kind = rng.choice(
        [
            ("customer rating", p.rating, "number"),
            ("brand", p.brand, "text"),
            ("price", p.price, "number"),
        ]
    )
    shown = f"${value:.2f}" if field_ == "price" else str(value)
    return TaskSpec(
        "shop_product_fact",
        "shop",
        f"What is the {field_} of this product?",
        f"/product/{p.pid}",
        [f"The answer states the {field_}: {shown}"],
        {"kind": "answer", "type": kind, "expected": value},
        [answer(shown)],
        {"pid": p.pid, "field": field_},
    )


# -- suite version 3: templates with headroom (long, or a comparison of two pages) ------------


@template("shop_cart_three", since=3)
def shop_cart_three(c: Content, rng: random.Random) -> TaskSpec:
    """Three different products in the cart: the three-item sibling of shop_add_to_cart."""
    items = [_pick_variant(p, rng) for p in rng.sample(c.products, 3)]
    steps = [ACCEPT_COOKIES, click("#close-modal")]
    for item in items:
        steps += _add_item_steps(item)
    described = ", ".join(_describe(i) for i in items[:-1]) + f" and {_describe(items[-1])}"
    return TaskSpec(
        "shop_cart_three",
        "shop",
        f"Add {described} to your shopping cart.",
        "/",
        [*(_item_rubric(i) for i in items), "Nothing else needs to be bought"],
        {"kind": "shop.cart", "items": items},
        steps,
        {"items": items},
    )


@template("shop_compare_price", since=3)
def shop_compare_price(c: Content, rng: random.Random) -> TaskSpec | None:
    """Which of two products of one brand and category is cheaper: filter to that brand and
    category (one results page lists both, with their prices), then the name (not the price)."""
    a = rng.choice(c.products)
    kin = [p for p in c.products if (p.category, p.brand) == (a.category, a.brand) and p != a]
    if not kin:
        return None
    b = rng.choice(kin)
    if abs(a.price - b.price) < 1.0 or a.name == b.name:
        return None
    cheap, dear = (a, b) if a.price < b.price else (b, a)
    return TaskSpec(
        "shop_compare_price",
        "shop",
        f"Which is cheaper on Shoply, the {a.name} or the {b.name}? Both are {a.brand} "
        f"{a.category} products. Answer with its name.",
        "/search",
        ["Both prices were compared", f"The answer is the {cheap.name}"],
        {"kind": "answer", "type": "text", "expected": cheap.name, "wrong": [dear.name]},
        [
            ACCEPT_COOKIES,
            select("#filter-category", a.category),
            select("#filter-brand", a.brand),
            click("#apply-filters"),
            answer(cheap.name),
        ],
        {"pids": [a.pid, b.pid]},
    )


# -- suite version 4: a pixels-only template ----------------------------------------------------


@template("shop_photo_colour", since=4)
def shop_photo_colour(c: Content, rng: random.Random) -> TaskSpec:
    """The background colour of a product's photo: shown only in the rendered image (the page's
    text and accessibility tree never name it), so only a policy that reads screenshots can
    answer better than by chance."""
    p = rng.choice(c.products)
    colour = photo_colour(c.seed, p.pid)
    return TaskSpec(
        "shop_photo_colour",
        "shop",
        "What is the background colour of this product's photo? Answer with the colour's name.",
        f"/product/{p.pid}",
        [f"The answer names the photo's background colour: {colour}"],
        {
            "kind": "answer",
            "type": "text",
            "expected": colour,
            "wrong": [n for n in sorted(PHOTO_COLOURS) if n != colour],
        },
        [answer(colour)],
        {"pid": p.pid, "pixels_only": True},
    )
