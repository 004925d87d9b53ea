"""Task generation is pinned: the same seed gives byte-identical tasks across code moves."""

from __future__ import annotations

import hashlib
import json

import pytest

from sites import mail, shop, travel, wiki
from sites.tasks import TEMPLATES, generate, suite_templates

# sha256 of (task_id, instruction, reference) of generate(130, 0), recorded when the templates
# moved from sites/tasks.py into their site modules. A deliberate template change updates it
# (and changes task ids: stored tasks get new versions, never silent overwrites).
PINNED = "8a0596a6282c6ff0cc36b6182989499613f73abccc54cecc1c70480c4e25ead9"


def test_the_same_seed_gives_the_pinned_tasks():
    tasks = generate(130, 0)
    rows = [(t.task_id, t.instruction, t.reference) for t in tasks]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == PINNED


def test_each_site_module_holds_its_own_templates():
    for site, module in {"shop": shop, "travel": travel, "wiki": wiki, "mail": mail}.items():
        names = [n for n, fn in TEMPLATES.items() if fn.__module__ == module.__name__]
        assert names and all(n.startswith(f"{site}_") for n in names), (site, names)
    assert all(fn.__module__ != "sites.tasks" for fn in TEMPLATES.values())


def test_suite_version_3_adds_the_headroom_templates_and_leaves_version_2_as_it_was():
    headroom = {"shop_cart_three", "shop_compare_price", "wiki_twin_of_twin", "wiki_compare"}
    assert set(suite_templates("3")) - set(suite_templates("2")) == headroom
    v2 = generate(130, 0)
    assert [t.task_id for t in generate(130, 0, version="2")] == [t.task_id for t in v2]
    assert not {t.task_id.split("/")[1] for t in v2} & headroom  # the pinned tasks above
    v3 = generate(170, 0, version="3")
    assert {t.task_id.split("/")[1] for t in v3} >= headroom
    assert {t.suite_version for t in v3} == {"3/site-seed-0"}
    twice = [t for t in v3 if t.task_id.startswith("bundled/wiki_twin_of_twin/")]
    assert twice and all(t.reference.count('click(css="#twin-link")') == 2 for t in twice)
    with pytest.raises(ValueError, match="unknown suite version '9'"):
        generate(10, 0, version="9")


def test_suite_version_4_adds_the_pixels_only_template():
    assert set(suite_templates("4")) - set(suite_templates("3")) == {"shop_photo_colour"}
    v4 = [t for t in generate(180, 0, version="4") if "/shop_photo_colour/" in t.task_id]
    answers = {t.reference[0] for t in v4}
    assert len(v4) >= 8 and len(answers) >= 3  # products of several photo colours
    assert all(t.start_url.startswith("bundled://shop/product/p") for t in v4)
