"""The sites' page handlers are module-level functions of (site context, request): each one is
called here on its own, with a hand-made request, and its response and the session state it
leaves are checked; the app built from them names each route after its handler."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlencode

import pytest
from starlette.requests import Request

from sites import mail, shop, travel, wiki
from sites.common import SID_COOKIE, SiteContext
from sites.content import generate

SID = "handler-test"


@pytest.fixture(scope="module")
def content() -> Any:
    return generate(0)


def context(module: Any, content: Any) -> SiteContext:
    name = module.__name__.rsplit(".", 1)[1]
    return SiteContext(name, content, "secret", module.new_state, slow_s=0.0)


def request(
    path: str,
    method: str = "GET",
    form: dict[str, str] | None = None,
    path_params: dict[str, str] | None = None,
    query: str = "",
) -> Request:
    """A request of the browser session :data:`SID` (a form body when ``form`` is given)."""
    body = urlencode(form or {}).encode()
    headers = [(b"cookie", f"{SID_COOKIE}={SID}".encode())]
    if form is not None:
        headers.append((b"content-type", b"application/x-www-form-urlencoded"))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query.encode(),
        "headers": headers,
        "path_params": path_params or {},
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def call(handler: Any, ctx: SiteContext, req: Request) -> Any:
    return asyncio.run(handler(ctx, req))


def test_a_shop_handler_changes_only_its_sessions_cart(content):
    ctx = context(shop, content)
    p = content.products[0]
    form = {"pid": p.pid, "qty": "2", "color": p.colors[0] if p.colors else ""}
    form["size"] = p.sizes[0] if p.sizes else ""
    resp = call(shop.cart_add, ctx, request("/cart/add", "POST", form))
    assert (resp.status_code, resp.headers["location"]) == (303, "/cart")
    cart = ctx.sessions[SID]["cart"]
    assert [(i["pid"], i["qty"]) for i in cart] == [(p.pid, 2)]
    page = call(shop.cart_page, ctx, request("/cart"))
    assert page.status_code == 200 and f"{p.price * 2:.2f}" in page.body.decode()
    assert call(shop.dismiss_modal, ctx, request("/modal/dismiss", "POST")).status_code == 303
    assert ctx.sessions[SID]["modal_dismissed"] is True
    bad = call(shop.cart_add, ctx, request("/cart/add", "POST", {**form, "qty": "11"}))
    assert "error=Quantity" in bad.headers["location"]
    missing = call(shop.order, ctx, request("/order/o999", path_params={"oid": "o999"}))
    assert missing.status_code == 404


def test_a_mail_handler_marks_what_it_shows_as_read(content):
    ctx = context(mail, content)
    m = content.messages[0]
    resp = call(mail.message, ctx, request(f"/message/{m.mid}", path_params={"mid": m.mid}))
    assert resp.status_code == 200 and m.subject in resp.body.decode()
    assert ctx.sessions[SID]["read"] == [m.mid]
    nowhere = call(mail.folder, ctx, request("/folder/spam", path_params={"name": "spam"}))
    assert nowhere.status_code == 404


def test_travel_and_wiki_handlers_answer_on_their_own(content):
    ctx = context(travel, content)
    city = content.cities[0]
    hits = call(travel.cities, ctx, request("/api/cities", query=f"q={city.code}"))
    assert {"code": city.code, "label": f"{city.name} ({city.code})"} in json.loads(hits.body)
    gone = call(travel.booking, ctx, request("/booking/B999", path_params={"bid": "B999"}))
    assert gone.status_code == 404
    ctx = context(wiki, content)
    a = content.articles[0]
    found = call(wiki.search, ctx, request("/search", query=urlencode({"q": a.title})))
    assert (found.status_code, found.headers["location"]) == (303, f"/wiki/{a.slug}")


@pytest.mark.parametrize("module", [shop, mail, travel, wiki])
def test_each_route_is_named_after_its_handler(module, content):
    app = module.build(context(module, content))
    names = {r.name: r.endpoint.func for r in app.app.routes if hasattr(r.endpoint, "func")}
    assert names and all(getattr(module, n) is f for n, f in names.items())
