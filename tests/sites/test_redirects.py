"""Redirects on the bundled sites stay on the site: no open redirect through ``?next=``."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from sites import common
from sites.server import SITES, build_apps


@pytest.fixture(scope="module")
def clients():
    apps = build_apps(seed=0, secret="s", slow_s=0.0)
    return {
        name: TestClient(app, base_url=f"http://{name}.localhost") for name, app in apps.items()
    }


OFF_SITE = [
    "//evil.example",
    "//evil.example/path",
    "/\\evil.example",
    "/\\/evil.example",
    "\\\\evil.example",
    "/\t/evil.example",
    "/\n/evil.example",
    " //evil.example",
    "https://evil.example/",
    "http:/evil.example",
    "javascript:alert(1)",
    "evil.example",
    "",
    "/ok\r\nSet-Cookie: x=1",
]


@pytest.mark.parametrize("target", OFF_SITE)
def test_consent_never_redirects_off_site(clients, target):
    for name in SITES:
        r = clients[name].post(f"/consent?next={quote(target, safe='')}", follow_redirects=False)
        assert r.status_code == 303
        assert r.headers["location"] == "/", (name, target)
        assert "set-cookie: x=1" not in str(r.headers).lower()


@pytest.mark.parametrize(
    "target", ["/", "/cart", "/search?q=red+shoes&page=2", "/wiki/Some_Page#History", "/a//b"]
)
def test_consent_keeps_same_site_paths(clients, target):
    r = clients["shop"].get(f"/consent?next={quote(target, safe='')}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == target
    assert "wl_cookies_shop=accepted" in r.headers["set-cookie"]


def test_safe_next_rules():
    assert common.safe_next("/x") == "/x"
    assert common.safe_next("//x") == "/"
    assert common.safe_next("/\\x") == "/"
    assert common.safe_next(None) == "/"
    assert common.safe_next("https://shop.localhost/x") == "/"  # absolute URLs are refused outright


def test_the_cookie_banner_form_comes_back_to_the_page():
    client = TestClient(build_apps(seed=0, secret="s", slow_s=0.0)["wiki"])  # no consent yet
    page = "/search?q=a+b"
    html = client.get(page).text
    action = html.split('action="/consent', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    action = "/consent" + action
    assert action.startswith("/consent?next=")
    r = client.post(action, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == page
