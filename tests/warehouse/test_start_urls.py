"""Start URLs are read the way a browser reads them, and one policy refuses what an agent must not
be sent to: every importer (task files, Online-Mind2Web results) goes through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hypothesis_profiles import examples
from warehouse.interop.om2w import read_result
from warehouse.interop.task_formats import parse_task_file
from warehouse.urls import NotAWebUrl, UrlRefused, WebUrl, parse_web_url

# (as written, what the browser visits, its host): where urlsplit and a browser disagree
BROWSER_READS = [
    ("http://example.com\\@evil.com/", "http://example.com/@evil.com/", "example.com"),
    ("http://exa\tmp\nle.com/a\r\nb", "http://example.com/ab", "example.com"),
    ("  https://Example.COM:443/x/../y  ", "https://example.com/y", "example.com"),
    ("http:\\\\example.com\\path", "http://example.com/path", "example.com"),
    ("http://%65xample.com/", "http://example.com/", "example.com"),
    ("https://münchen.de/straße", "https://xn--mnchen-3ya.de/stra%C3%9Fe", "xn--mnchen-3ya.de"),
    ("http://8.8.8.8:8080", "http://8.8.8.8:8080/", "8.8.8.8"),
    ("https://www.booking.com", "https://www.booking.com/", "www.booking.com"),
]


@pytest.mark.parametrize(("given", "href", "host"), BROWSER_READS)
def test_urls_are_stored_as_the_browser_visits_them(given: str, href: str, host: str):
    url = parse_web_url(given)
    assert (url.href, url.host) == (href, host)
    assert url.origin == href[: href.index("/", len("https://"))]


ALWAYS_REFUSED = [
    "http://169.254.169.254/latest/meta-data/",
    "http://0xA9.0xFE.0xA9.0xFE/",  # the same address, as a browser reads it
    "http://2852039166/",
    "http://169.254.170.2/v2/credentials",
    "http://[fe80::1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.google.internal./",
    "http://metadata/",
    "http://instance-data/latest/",
    "http://100.100.100.200/latest/meta-data/",
    "http://[fd00:ec2::254]/",
]
PRIVATE = [
    "http://[::1]/",
    "http://127.0.0.1:8000/",
    "http://127.1/",
    "http://localhost/",
    "http://shop.localhost/",
    "http://0.0.0.0/",
    "http://10.0.0.5/",
    "http://192.168.1.1/admin",
    "http://172.16.0.1/",
    "http://[fd12::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://intranet/",
    "http://printer.local/",
    "http://db.corp.internal/",
]
NOT_WEB = [
    "file:///etc/passwd",
    "javascript:alert(1)",
    "data:text/html,<script>x</script>",
    "chrome://settings",
    "http://ex ample.com/",
    "http://ex%20ample.com/",
    "http://exa<mple.com/",
    "http://a.com:99999/",
    "http://",
    "not a url",
]


@pytest.mark.parametrize("url", ALWAYS_REFUSED)
@pytest.mark.parametrize("allow_private", [False, True])
def test_link_local_and_metadata_hosts_are_always_refused(url: str, allow_private: bool):
    with pytest.raises(UrlRefused, match="metadata"):
        parse_web_url(url, allow_private=allow_private)


@pytest.mark.parametrize("url", PRIVATE)
def test_loopback_and_private_hosts_need_the_opt_in(url: str):
    with pytest.raises(UrlRefused, match="not on the public internet"):
        parse_web_url(url)
    assert isinstance(parse_web_url(url, allow_private=True), WebUrl)


@pytest.mark.parametrize("url", NOT_WEB)
def test_what_is_not_an_http_url_is_refused(url: str):
    with pytest.raises(NotAWebUrl):
        parse_web_url(url, allow_private=True)


def test_credentials_in_a_start_url_are_refused():
    with pytest.raises(UrlRefused, match="user name or password"):
        parse_web_url("https://user:secret@example.com/")


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=40).map(lambda s: "http://" + s) | st.text(max_size=40))
def test_any_text_gives_a_url_or_a_reason(text: str):
    try:
        url = parse_web_url(text)
    except UrlRefused as exc:
        assert str(exc)
        return
    assert url.href.startswith(("http://", "https://")) and url.host
    assert parse_web_url(url.href) == url  # the serialisation is a fixed point


# -- importers ---------------------------------------------------------------------------------


def _rows_file(tmp_path: Path, urls: list[str]) -> Path:
    rows = [{"id": str(i), "ques": f"task {i}", "web": u} for i, u in enumerate(urls)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["om2w", "webvoyager", "rubric"])
def test_task_files_store_the_browser_url_and_refuse_bad_rows_one_by_one(tmp_path: Path, fmt: str):
    urls = [
        "http://example.com\\@evil.com/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "http://ex ample.com/",
        "https://www.example.org",
        "file:///etc/passwd",
        "http://metadata.google.internal/",
    ]
    rows = [
        {"task_id": str(i), "confirmed_task": f"t{i}", "ques": f"t{i}", "instruction": f"t{i}"}
        | {"web": u, "website": u, "start_url": u, "rubric": ["done"]}
        for i, u in enumerate(urls)
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    parsed = parse_task_file(fmt, path)
    got = {t.task_id.removeprefix("webvoyager/"): (t.start_url, t.site) for t in parsed.tasks}
    assert got == {
        "0": ("http://example.com/@evil.com/", "example.com"),
        "4": ("https://www.example.org/", "www.example.org"),
    }
    errors = dict(parsed.errors)
    assert set(errors) == {2, 3, 4, 6, 7}  # line numbers
    assert "link-local or cloud metadata" in errors[2]
    assert "[::1]" in errors[3] and "not on the public internet" in errors[3]
    assert "not an http(s) URL" in errors[4] and "not an http(s) URL" in errors[6]
    assert "cloud metadata endpoint" in errors[7]


def test_a_task_file_for_a_local_site_can_opt_in_to_loopback(tmp_path: Path):
    path = _rows_file(
        tmp_path, ["http://[::1]:8080/a", "http://localhost/", "http://169.254.169.254/"]
    )
    assert [t.start_url for t in parse_task_file("webvoyager", path).tasks] == []
    parsed = parse_task_file("webvoyager", path, allow_private=True)
    assert [(t.start_url, t.site) for t in parsed.tasks] == [
        ("http://[::1]:8080/a", "[::1]"),
        ("http://localhost/", "localhost"),
    ]
    assert [n for n, _ in parsed.errors] == [3]


@pytest.mark.parametrize(
    ("website", "stored"),
    [
        ("http://example.com\\@evil.com/", "http://example.com/@evil.com/"),
        ("HTTPS://Example.com", "https://example.com/"),
        ("http://169.254.169.254/latest/meta-data/", None),
        ("http://[::1]/", None),
        ("http://localhost:8080/", None),
        ("http://metadata.google.internal/", None),
        ("http://ex ample.com/", None),
    ],
)
def test_om2w_results_keep_only_a_browser_url_the_policy_allows(website: str, stored: str | None):
    result = {"task_id": "t1", "task": "Find it", "website": website}
    assert read_result(result).website == stored
