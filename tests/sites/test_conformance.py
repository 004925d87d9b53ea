"""Conformance of every site and task template, in real Chromium (like Gymnasium's check_env).

For each template: the start page loads; the checker fails on the fresh state; the reference
solution, executed by the scripted expert, makes it pass. Plus: a sample of generated tasks
passes at >= 99%, two sessions at once keep separate state, and the inspection endpoint refuses
requests without the server's secret.

Everything runs on the session's sites server and Chromium (fixtures ``server`` and ``chromium``).
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollouts.expert import run_reference
from sites import shop as shop_site
from sites.client import fetch_state, session_of
from sites.content import generate as content
from sites.server import SITES, SiteServer
from sites.tasks import SUITE_VERSIONS, TEMPLATES, generate, task_from_spec
from sites.taskspec import click, select
from stages.bundled import run_expert

pytestmark = pytest.mark.browser


def one_task_per_template(seed: int = 7):
    c = content(0)
    out = []
    for name in sorted(TEMPLATES):
        rng = random.Random(f"{seed}-{name}")
        spec = None
        while spec is None:
            spec = TEMPLATES[name](c, rng)
        out.append(task_from_spec(spec, site_seed=0, ood_site="travel"))
    return out


def expert(chromium, tasks, server: SiteServer, **kw):
    """:func:`run_expert` on the session's Chromium."""
    return chromium.run(run_expert(tasks, server, browser=chromium.browser, **kw))


def test_every_template_conforms(server: SiteServer, chromium):
    tasks = one_task_per_template()
    assert {t.site for t in tasks} == set(SITES)
    results = expert(chromium, tasks, server, concurrency=4, check_fresh=True)
    for task, res in zip(tasks, results, strict=True):
        assert res.start_status == 200, task.task_id
        assert res.fresh_verdict is not None and not res.fresh_verdict.success, task.task_id
        assert res.fresh_verdict.reasons, task.task_id  # a failing verdict says why
        assert res.error is None, f"{task.task_id}: {res.error}"
        assert res.verdict.success, f"{task.task_id}: {res.verdict.reasons}"


def test_generated_tasks_are_solvable(server: SiteServer, chromium):
    """A sample of generated tasks (not the hand-picked ones above): the first of every template
    in ``generate(60, seed=123)`` of the newest suite version, so every site, template and split,
    with parameters other than
    test_every_template_conforms's (tests/rollouts/test_expert_actions.py solves one more task
    of every template, with seed 3)."""
    tasks, per_template = [], {}
    for t in generate(60, seed=123, version=SUITE_VERSIONS[-1]):
        if per_template.setdefault(t.meta["template"], 0) < 1:
            per_template[t.meta["template"]] += 1
            tasks.append(t)
    assert per_template == dict.fromkeys(TEMPLATES, 1)
    assert {t.site for t in tasks} == set(SITES) and {t.split for t in tasks} == {
        "train",
        "val",
        "test",
        "ood",
    }
    results = expert(chromium, tasks, server, concurrency=4)
    assert len(results) == len(tasks)
    failed = [(r.task_id, r.error, r.verdict.reasons) for r in results if not r.verdict.success]
    assert not failed, failed


def test_a_wrong_answer_or_partial_work_fails(server: SiteServer, chromium):
    """The checker is not fooled: the expert's work with a wrong final answer fails."""
    wiki = next(t for t in one_task_per_template() if t.meta["template"] == "wiki_fact")
    wrong = [*wiki.reference[:-1], 'answer("I do not know")']
    shop = next(t for t in one_task_per_template() if t.meta["template"] == "shop_buy")
    partial = shop.reference[: len(shop.reference) // 2]  # stops before checkout
    tasks = [
        wiki.__class__(**{**wiki.__dict__, "reference": wrong}),
        shop.__class__(**{**shop.__dict__, "reference": partial}),
    ]
    results = expert(chromium, tasks, server, concurrency=2)
    assert [r.verdict.success for r in results] == [False, False]
    assert any("correct value" in x for x in results[0].verdict.reasons)
    assert any("no order" in x for x in results[1].verdict.reasons)


async def _two_sessions(server: SiteServer, browser) -> tuple[dict, dict]:
    shop = server.url("shop")
    async with httpx.AsyncClient() as client:
        ctx_a, ctx_b = await browser.new_context(), await browser.new_context()
        page_a, page_b = await ctx_a.new_page(), await ctx_b.new_page()

        async def add(page, pid, color):
            await page.goto(f"{shop}/product/{pid}")
            run = await run_reference(
                page, [click("#accept-cookies"), select("#color", color), click("#add-to-cart")]
            )
            assert run.error is None and page.url.endswith("/cart")

        c = content(0)
        pa, pb = [p for p in c.products if p.colors and not p.sizes][:2]
        await asyncio.gather(add(page_a, pa.pid, pa.colors[0]), add(page_b, pb.pid, pb.colors[0]))
        sid_a = session_of(await ctx_a.cookies(shop))
        sid_b = session_of(await ctx_b.cookies(shop))
        assert sid_a and sid_b and sid_a != sid_b
        states = (
            await fetch_state(client, shop, server.secret, sid_a),
            await fetch_state(client, shop, server.secret, sid_b),
        )
        await ctx_a.close()
        await ctx_b.close()
        return states, (pa.pid, pb.pid)


def test_two_sessions_do_not_see_each_other(server: SiteServer, chromium):
    (a, b), (pid_a, pid_b) = chromium.run(_two_sessions(server, chromium.browser))
    assert [i["pid"] for i in a["cart"]] == [pid_a]
    assert [i["pid"] for i in b["cart"]] == [pid_b]


def test_inspection_endpoint_requires_the_secret(server: SiteServer):
    for site in SITES:
        url = f"{server.url(site)}/__webloop/state?session=x"
        assert httpx.get(url).status_code == 403
        assert httpx.get(url, headers={"X-Webloop-Secret": "guess"}).status_code == 403
        ok = httpx.get(url, headers={"X-Webloop-Secret": server.secret})
        assert ok.status_code == 200 and ok.json()["site"] == site
        assert httpx.get(f"{server.url(site)}/__webloop/metrics").status_code == 403


def test_pages_never_link_to_the_inspection_endpoint(server: SiteServer):
    paths = {
        "shop": ["/", "/search?q=mug", "/product/p0003", "/cart", "/checkout"],
        "travel": ["/"],
        "wiki": ["/", "/wiki/" + content(0).articles[0].slug],
        "mail": ["/folder/inbox", "/message/m001", "/compose", "/settings"],
    }
    for site, ps in paths.items():
        for p in ps:
            r = httpx.get(server.url(site) + p, follow_redirects=True)
            assert r.status_code == 200, (site, p)
            assert "__webloop" not in r.text and server.secret not in r.text


def test_obstacles_are_there(server: SiteServer):
    shop = server.url("shop")
    home = httpx.get(shop + "/").text
    assert 'id="cookie-banner"' in home and 'id="newsletter-modal"' in home
    with httpx.Client(base_url=shop) as client:
        client.get("/")
        client.post(
            "/cart/add",
            data={"pid": "p0001", "color": content(0).product_by_id["p0001"].colors[0], "qty": "1"},
        )
        bad = client.post(
            "/checkout",
            data={"name": "A", "street": "B", "city": "C", "zip": "12", "country": "Norland"},
        )
        assert bad.status_code == 422 and "ZIP code must be 5 digits" in bad.text
        page2 = client.get("/search?q=&page=2")
        shown = re.findall(r'data-pid="(p\d+)"', page2.text)
        expected = [p.pid for p in shop_site.search(content(0), {})]
        expected = expected[shop_site.PAGE_SIZE : 2 * shop_site.PAGE_SIZE]
        assert page2.status_code == 200 and shown == expected and len(shown) == shop_site.PAGE_SIZE
        assert '<span class="current">2</span>' in page2.text
        more = client.get("/api/reviews/p0001?offset=3").json()["reviews"]
        assert isinstance(more, list)
    travel = httpx.get(server.url("travel") + "/api/cities?q=" + content(0).cities[0].name[:2])
    assert content(0).cities[0].code in {c["code"] for c in travel.json()}


def test_same_seed_same_content_and_tasks():
    assert content(0) == content(0) and content(0) != content(1)
    assert [t.task_id for t in generate(60, 5)] == [t.task_id for t in generate(60, 5)]
    assert [t.task_id for t in generate(60, 5)] != [t.task_id for t in generate(60, 6)]


def test_process_mode_serves_too():
    with SiteServer(seed=0, mode="process") as s:
        assert httpx.get(s.url("wiki") + "/").status_code == 200
        r = httpx.get(
            s.url("wiki") + "/__webloop/state?session=x", headers={"X-Webloop-Secret": s.secret}
        )
        assert r.status_code == 200


def test_process_mode_names_a_port_it_cannot_bind_and_leaves_no_process():
    """The child binds its own sockets and reports the ports (a port picked by the parent and
    re-bound by the child could be taken in between); a port in use is a clear error."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        server = SiteServer(seed=0, mode="process", ports={"wiki": port})
        with pytest.raises(RuntimeError, match=rf"did not start: OSError.*in use.*{port}"):
            server.start()
        assert server._proc is None and server.urls == {}
    finally:
        taken.close()


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_parent_takes_its_server_process_with_it():
    """A parent killed by a signal runs no exit handlers; its server process sees that it is
    orphaned and exits (else it would keep serving and hold its ports)."""
    script = (
        "import time\n"
        "from sites.server import SiteServer\n"
        "s = SiteServer(seed=0, mode='process').start()\n"
        "print(s._proc.pid, s.url('wiki'), flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).parents[2]
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=root)
    try:
        pid, url = parent.stdout.readline().decode().split()
        assert httpx.get(url + "/").status_code == 200
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing check
    while _running(int(pid)):
        assert time.monotonic() < deadline, "the orphaned server process kept running"
        time.sleep(0.1)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/")


def test_the_photo_colour_is_in_the_pixels_only(server: SiteServer, chromium):
    """shop_photo_colour's answer is in no page text (HTML, accessibility snapshot) but is the
    colour of the photo's pixels, in the rendered page as in the image file."""
    c = content(0)
    spec = shop_site.shop_photo_colour(c, random.Random(5))
    pid, colour = spec.params["pid"], spec.checker["expected"]
    base = server.url("shop")
    html = httpx.get(f"{base}/product/{pid}").text
    names = list(shop_site.PHOTO_COLOURS)
    assert not [n for n in names if n.lower() in html.lower()]
    assert not [n for n in names for p in c.products if n.lower() in str(p).lower()]

    async def look():
        page = await chromium.browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            await page.goto(f"{base}/product/{pid}")
            tree = await page.locator("body").aria_snapshot()
            box = await page.locator("img").first.bounding_box()
            shot = await page.screenshot(clip={**box, "width": 8, "height": 8})
            return tree, shot
        finally:
            await page.close()

    tree, shot = chromium.run(look())
    assert not [n for n in names if n.lower() in tree.lower()]
    from io import BytesIO

    from PIL import Image

    pixel = Image.open(BytesIO(shot)).convert("RGB").getpixel((2, 2))
    want = shop_site.PHOTO_COLOURS[colour]
    assert max(abs(a - b) for a, b in zip(pixel, want, strict=True)) <= 8, (pixel, colour)
    others = [v for n, v in shop_site.PHOTO_COLOURS.items() if n != colour]
    assert all(max(abs(a - b) for a, b in zip(pixel, v, strict=True)) > 40 for v in others)
