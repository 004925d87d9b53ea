"""``wiki``: city articles with infoboxes, full-text search and internal links, for
information-seeking tasks answered in text."""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from sites.common import SiteContext, make_app
from sites.content import Article, Content


def new_state() -> dict[str, Any]:
    return {"visited": []}


def render_paragraph(content: Content, text: str) -> Markup:
    """Escape article text and turn ``[[slug]]`` into internal links."""

    def link(m: re.Match) -> str:
        a = content.article_by_slug.get(m.group(1))
        title = a.title if a else m.group(1)
        return f'<a href="/wiki/{escape(m.group(1))}">{escape(title)}</a>'

    parts = re.split(r"(\[\[[a-z]+\]\])", text)
    out = [
        link(re.match(r"\[\[([a-z]+)\]\]", p)) if p.startswith("[[") else str(escape(p))
        for p in parts
    ]
    return Markup("".join(out))


def search_articles(content: Content, q: str) -> list[Article]:
    q = q.strip().lower()
    if not q:
        return []
    return [
        a
        for a in content.articles
        if q in a.title.lower() or any(q in p.lower() for p in a.paragraphs)
    ]


def build(ctx: SiteContext):
    c = ctx.content

    async def home(request: Request) -> Response:
        return ctx.render(request, "wiki/home.html", articles=c.articles[:12])

    async def article(request: Request) -> Response:
        a = c.article_by_slug.get(request.path_params["slug"])
        if a is None:
            return ctx.render(request, "wiki/notfound.html", status=404)
        ctx.state(request)["visited"].append(a.slug)
        paras = [render_paragraph(c, p) for p in a.paragraphs]
        twin = c.article_by_slug[a.twin]
        return ctx.render(request, "wiki/article.html", a=a, paras=paras, twin=twin)

    async def search(request: Request) -> Response:
        q = request.query_params.get("q", "")
        exact = next((a for a in c.articles if a.title.lower() == q.strip().lower()), None)
        if exact:
            return RedirectResponse(f"/wiki/{exact.slug}", status_code=303)
        return ctx.render(request, "wiki/search.html", q=q, results=search_articles(c, q))

    return make_app(
        ctx,
        [
            Route("/", home),
            Route("/wiki/{slug}", article),
            Route("/search", search),
        ],
    )
