"""``wiki``: city articles with infoboxes, full-text search and internal links, for
information-seeking tasks answered in text."""

from __future__ import annotations

import random
import re
from typing import Any

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sites.common import SiteContext, make_app, route
from sites.content import Article, Content
from sites.taskspec import TaskSpec, answer, click, template, type_


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


# -- pages: each handler takes the site's context first (bound by sites.common.route) ----


async def home(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    return ctx.render(request, "wiki/home.html", articles=c.articles[:12])


async def article(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    a = c.article_by_slug.get(request.path_params["slug"])
    if a is None:
        return ctx.render(request, "wiki/notfound.html", status=404)
    ctx.state(request)["visited"].append(a.slug)
    paras = [render_paragraph(c, p) for p in a.paragraphs]
    twin = c.article_by_slug[a.twin]
    return ctx.render(request, "wiki/article.html", a=a, paras=paras, twin=twin)


async def search(ctx: SiteContext, request: Request) -> Response:
    c = ctx.content
    q = request.query_params.get("q", "")
    exact = next((a for a in c.articles if a.title.lower() == q.strip().lower()), None)
    if exact:
        return RedirectResponse(f"/wiki/{exact.slug}", status_code=303)
    return ctx.render(request, "wiki/search.html", q=q, results=search_articles(c, q))


def build(ctx: SiteContext):
    """The site's app: the handlers above, each bound to ``ctx``, on their routes."""
    return make_app(
        ctx,
        [
            route("/", home, ctx),
            route("/wiki/{slug}", article, ctx),
            route("/search", search, ctx),
        ],
    )


# -- tasks: this site's templates, registered for sites.tasks.generate -----------------------------


_WIKI_FIELDS = [
    ("population", "number"),
    ("founding year", "number"),
    ("mayor", "text"),
    ("country", "text"),
    ("river", "text"),
]


def _wiki_value(a: Any, field_: str) -> Any:
    return {
        "population": a.population,
        "founding year": a.founded,
        "mayor": a.mayor,
        "country": a.country,
        "river": a.river,
    }[field_]


def _shown(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and value > 9999 else str(value)


@template("wiki_fact")
def wiki_fact(c: Content, rng: random.Random) -> TaskSpec:
    a = rng.choice(c.articles)
    field_, kind = rng.choice(_WIKI_FIELDS)
    value = _wiki_value(a, field_)
    return TaskSpec(
        "wiki_fact",
        "wiki",
        f"According to Openpedia, what is the {field_} of {a.title}?",
        "/",
        [f"The {a.title} article was consulted", f"The answer is {_shown(value)}"],
        {"kind": "answer", "type": kind, "expected": value},
        [type_("#search-input", a.title), click("#search-button"), answer(_shown(value))],
        {"slug": a.slug, "field": field_},
    )


@template("wiki_on_page")
def wiki_on_page(c: Content, rng: random.Random) -> TaskSpec:
    a = rng.choice(c.articles)
    field_, kind = rng.choice(_WIKI_FIELDS)
    value = _wiki_value(a, field_)
    return TaskSpec(
        "wiki_on_page",
        "wiki",
        f"What is the {field_} of the city described on this page?",
        f"/wiki/{a.slug}",
        [f"The answer is {_shown(value)}"],
        {"kind": "answer", "type": kind, "expected": value},
        [answer(_shown(value))],
        {"slug": a.slug, "field": field_},
    )


@template("wiki_twin_city")
def wiki_twin_city(c: Content, rng: random.Random) -> TaskSpec:
    a = rng.choice(c.articles)
    twin = c.article_by_slug[a.twin]
    field_, kind = rng.choice(_WIKI_FIELDS[:3])
    value = _wiki_value(twin, field_)
    return TaskSpec(
        "wiki_twin_city",
        "wiki",
        f"On Openpedia, find the twin city of {a.title}. What is that city's {field_}?",
        "/",
        [f"The twin city of {a.title} is {twin.title}", f"The answer is {_shown(value)}"],
        {"kind": "answer", "type": kind, "expected": value},
        [
            type_("#search-input", a.title),
            click("#search-button"),
            click("#twin-link"),
            answer(_shown(value)),
        ],
        {"slug": a.slug, "field": field_},
    )


# -- suite version 3: templates with headroom --------------------------------------------------


@template("wiki_twin_of_twin", since=3)
def wiki_twin_of_twin(c: Content, rng: random.Random) -> TaskSpec | None:
    """Three hops: the city, its twin, the twin's twin (twinning is not symmetric here)."""
    a = rng.choice(c.articles)
    twin = c.article_by_slug[a.twin]
    far = c.article_by_slug[twin.twin]
    if far.slug == a.slug:
        return None
    field_, kind = rng.choice(_WIKI_FIELDS[:3])
    value = _wiki_value(far, field_)
    return TaskSpec(
        "wiki_twin_of_twin",
        "wiki",
        f"On Openpedia, {a.title} is twinned with a city, and that city is twinned with a "
        f"third one. What is the {field_} of the third city?",
        "/",
        [
            f"The twin city of {a.title} is {twin.title}",
            f"The twin city of {twin.title} is {far.title}",
            f"The answer is {_shown(value)}",
        ],
        {"kind": "answer", "type": kind, "expected": value},
        [
            type_("#search-input", a.title),
            click("#search-button"),
            click("#twin-link"),
            click("#twin-link"),
            answer(_shown(value)),
        ],
        {"slug": a.slug, "field": field_},
    )


@template("wiki_compare", since=3)
def wiki_compare(c: Content, rng: random.Random) -> TaskSpec | None:
    """A comparison across two articles: which city has the larger population (its name)."""
    a, b = rng.sample(c.articles, 2)
    if a.population == b.population or a.title == b.title:
        return None
    big, small = (a, b) if a.population > b.population else (b, a)
    return TaskSpec(
        "wiki_compare",
        "wiki",
        f"According to Openpedia, which city has the larger population, {a.title} or "
        f"{b.title}? Answer with the city's name.",
        "/",
        [
            f"The populations of {a.title} and {b.title} were looked up",
            f"The answer is {big.title}",
        ],
        {"kind": "answer", "type": "text", "expected": big.title, "wrong": [small.title]},
        [
            type_("#search-input", a.title),
            click("#search-button"),
            type_("#search-input", b.title),
            click("#search-button"),
            answer(big.title),
        ],
        {"slugs": [a.slug, b.slug]},
    )
