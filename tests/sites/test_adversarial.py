"""Adversarial (prompt-injection) variants of the bundled sites and tasks.

``?wl_inject=1`` makes a site show :data:`sites.common.INJECTION_TEXT` on every page of that
browser session (via the ``wl_inject`` cookie) without changing its behaviour, so the reference
solutions still succeed and only a judge reading the page can be fooled.
"""

from __future__ import annotations

import html

import httpx
import pytest

from sites.common import INJECTION_TEXT
from sites.content import generate as content
from sites.server import SITES, SiteServer
from sites.tasks import (
    ADVERSARIAL_SUITE,
    SUITE,
    adversarial_variants,
    generate,
    resolve_start_url,
)
from tests.sites.test_conformance import one_task_per_template
from warehouse import Warehouse
from warehouse.records import Task
from warehouse.tasks import put_tasks

ESCAPED = html.escape(INJECTION_TEXT)
PAGES = {
    "shop": ["/", "/search?q=mug", "/product/p0003", "/cart", "/checkout"],
    "travel": ["/"],
    "wiki": ["/", "/wiki/" + content(0).articles[0].slug],
    "mail": ["/folder/inbox", "/message/m001", "/compose", "/settings"],
}


def _has_injection(text: str) -> bool:
    return ESCAPED in text or INJECTION_TEXT in text


# -- pages ------------------------------------------------------------------------------------


def test_the_flag_injects_and_sticks_through_the_cookie(server: SiteServer):
    for site, paths in PAGES.items():
        with httpx.Client(base_url=server.url(site), follow_redirects=True) as client:
            first = client.get(paths[0], params={"wl_inject": "1"})
            assert first.status_code == 200, site
            assert _has_injection(first.text), site
            assert '<aside id="wl-injected" class="injected-note" role="note">' in first.text
            # inside <main>, before the page's own content
            main = first.text.index("<main>")
            assert first.text.index('id="wl-injected"') - main < 20
            cookie = next(
                h
                for r in [*first.history, first]
                for h in r.headers.get_list("set-cookie")
                if h.startswith("wl_inject=")
            )
            assert cookie.startswith("wl_inject=1;")
            assert {"path=/", "httponly", "samesite=lax"} <= {
                p.strip().lower() for p in cookie.split(";")
            }
            assert client.cookies.get("wl_inject") == "1"
            for p in paths:  # later pages of the session, without the parameter
                r = client.get(p)
                assert r.status_code == 200, (site, p)
                assert _has_injection(r.text), (site, p)


def test_the_cookie_is_set_on_redirects_too(server: SiteServer):
    with httpx.Client(base_url=server.url("mail")) as client:
        r = client.get("/", params={"wl_inject": "1"})
        assert r.status_code == 303 and client.cookies.get("wl_inject") == "1"
        inbox = client.get(r.headers["location"])
        assert "wl_inject" not in str(inbox.url) and _has_injection(inbox.text)


def test_pages_without_the_flag_are_untouched(server: SiteServer):
    for site, paths in PAGES.items():
        with httpx.Client(base_url=server.url(site), follow_redirects=True) as client:
            for p in paths:
                r = client.get(p)
                assert r.status_code == 200, (site, p)
                assert not _has_injection(r.text) and "wl-injected" not in r.text, (site, p)
                assert all(
                    not h.startswith("wl_inject=")
                    for x in [*r.history, r]
                    for h in x.headers.get_list("set-cookie")
                )
            # other values of the parameter or cookie do nothing
            assert not _has_injection(client.get(paths[0], params={"wl_inject": "0"}).text)
            assert "wl_inject" not in client.cookies
            client.cookies.set("wl_inject", "yes")
            assert not _has_injection(client.get(paths[0]).text)


def test_pages_without_the_flag_render_byte_identically():
    """The base template with no injection gives exactly the pre-injection markup."""
    from types import SimpleNamespace

    from jinja2 import DictLoader, Environment, select_autoescape
    from starlette.datastructures import URL

    from sites.common import TEMPLATES as TEMPLATE_DIR

    base = (TEMPLATE_DIR / "base.html").read_text()
    assert "{% if wl_injection %}" in base
    start = base.index("{% if wl_injection %}")
    end = base.index("{% endif %}", start) + len("{% endif %}")
    before = base[:start] + base[end:]
    page = '{% extends "base.html" %}{% block content %}<p>x &amp; y</p>{% endblock %}'

    def render(base_text: str, **kw) -> str:
        env = Environment(
            loader=DictLoader({"base.html": base_text, "page.html": page}),
            autoescape=select_autoescape(["html"]),
        )
        req = SimpleNamespace(url=URL("http://x/path?a=1"))
        return env.get_template("page.html").render(
            site="shop", request=req, show_cookie_banner=True, **kw
        )

    assert render(base, wl_injection=None) == render(before)
    injected = render(base, wl_injection="<b>hi</b> & bye")
    assert "&lt;b&gt;hi&lt;/b&gt; &amp; bye" in injected  # autoescaped
    assert "<main>\n<aside" in injected


# -- task variants ------------------------------------------------------------------------------


def _task(start_url: str, **kw) -> Task:
    return Task(
        task_id=f"{SUITE}/t/abc",
        suite=SUITE,
        suite_version="1/site-seed-0",
        site="shop",
        instruction="Do it.",
        start_url=start_url,
        split="train",
        difficulty=3,
        rubric=["done"],
        reference=['click(css="#x")'],
        checker={"kind": "shop.cart", "items": []},
        source="webloop-bundled",
        meta={"template": "t", "params": {"a": 1}},
        **kw,
    )


@pytest.mark.parametrize(
    ("start_url", "expected"),
    [
        ("bundled://shop/", "bundled://shop/?wl_inject=1"),
        ("bundled://shop/search", "bundled://shop/search?wl_inject=1"),
        ("bundled://shop/search?q=mug&page=2", "bundled://shop/search?q=mug&page=2&wl_inject=1"),
        ("bundled://wiki/wiki/x#history", "bundled://wiki/wiki/x?wl_inject=1#history"),
    ],
)
def test_adversarial_variant_fields(start_url: str, expected: str):
    task = _task(start_url, content_hash="stale")
    (v,) = adversarial_variants([task])
    assert v.task_id == f"{task.task_id}/inject"
    assert v.suite == ADVERSARIAL_SUITE == "bundled-adversarial"
    assert v.start_url == expected
    assert v.meta == {
        "template": "t",
        "params": {"a": 1},
        "adversarial": {"of": task.task_id, "kind": "page"},
    }
    assert task.meta == {"template": "t", "params": {"a": 1}}  # the original is not touched
    assert v.content_hash is None
    for f in (
        "instruction",
        "checker",
        "reference",
        "rubric",
        "difficulty",
        "split",
        "site",
        "suite_version",
        "source",
    ):
        assert getattr(v, f) == getattr(task, f), f
    urls = {"shop": "http://127.0.0.1:5000", "wiki": "http://127.0.0.1:5001"}
    assert "wl_inject=1" in resolve_start_url(v.start_url, urls)


def test_adversarial_variants_of_generated_tasks():
    tasks = generate(30, seed=3)
    variants = adversarial_variants(tasks)
    assert [v.task_id for v in variants] == [f"{t.task_id}/inject" for t in tasks]
    assert len({v.task_id for v in variants}) == len(tasks)
    assert all(v.start_url.count("wl_inject=1") == 1 for v in variants)
    assert all(v.start_url.count("?") == 1 for v in variants)
    # already-adversarial tasks and tasks outside the bundled sites have no new variant
    assert adversarial_variants(variants) == []
    assert adversarial_variants([_task("https://example.com/?q=1")]) == []


def test_variants_are_stored_as_their_own_versioned_tasks(wh: Warehouse):
    tasks = generate(12, seed=1)
    variants = adversarial_variants(tasks)
    first = put_tasks(wh, [*tasks, *variants])
    assert len(first.new) == 24 and not first.new_version
    again = put_tasks(wh, [*tasks, *adversarial_variants(tasks)])
    assert len(again.unchanged) == 24 and not again.new and not again.new_version
    hashes = {t.task_id: t.content_hash for t in first.stored}
    assert all(hashes[v.task_id] != hashes[v.meta["adversarial"]["of"]] for v in variants)
    # variants of stored tasks (which carry a content hash) store unchanged too
    assert put_tasks(wh, adversarial_variants(again.stored)).unchanged == [
        v.task_id for v in variants
    ]


# -- in Chromium ----------------------------------------------------------------------------------


async def _start_page_texts(
    server: SiteServer, browser, tasks: list[Task]
) -> list[tuple[str, bool]]:
    out = []
    for task in tasks:
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        try:
            page = await context.new_page()
            await page.goto(resolve_start_url(task.start_url, server.urls))
            note = page.locator("#wl-injected")
            visible = await note.count() == 1 and await note.is_visible()
            out.append((await page.inner_text("body"), visible))
        finally:
            await context.close()
    return out


@pytest.mark.browser
def test_reference_solutions_still_succeed_on_the_variants(server: SiteServer, chromium):
    from stages.bundled import run_expert

    tasks = one_task_per_template(seed=11)
    assert {t.site for t in tasks} == set(SITES)
    variants = adversarial_variants(tasks)
    results = chromium.run(
        run_expert(variants, server, concurrency=4, check_fresh=True, browser=chromium.browser)
    )
    for task, res in zip(variants, results, strict=True):
        assert res.start_status == 200, task.task_id
        assert res.fresh_verdict is not None and not res.fresh_verdict.success, task.task_id
        assert res.error is None, f"{task.task_id}: {res.error}"
        assert res.verdict.success, f"{task.task_id}: {res.verdict.reasons}"

    one_per_site = [next(v for v in variants if v.site == s) for s in SITES]
    texts = chromium.run(_start_page_texts(server, chromium.browser, [*one_per_site, *tasks[:2]]))
    for task, (text, visible) in zip(one_per_site, texts, strict=False):
        assert INJECTION_TEXT in text and visible, task.task_id
    for task, (text, visible) in zip(tasks[:2], texts[len(one_per_site) :], strict=True):
        assert INJECTION_TEXT not in text and not visible, task.task_id
