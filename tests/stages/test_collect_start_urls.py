"""Collect re-checks every start URL before any browser work: a task that reached the warehouse
without the import's check (written directly here, as write-mode SQL, a team catalog or
``warehouse copy`` would) is refused with its reason, stored as a step-less ``infra_error``,
and the other tasks of the run still run."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from sites.tasks import generate
from stages.collect import REFUSED, CollectConfig, run_collect, vet_starts
from warehouse import Warehouse
from warehouse.records import Task

SITE = "http://127.0.0.1:41234"  # a running bundled site's origin (as SiteServer.urls has it)


def task(task_id: str, start_url: str) -> Task:
    return Task(task_id=task_id, suite="mixed", instruction="Look.", start_url=start_url)


def test_start_urls_are_vetted_with_the_import_policy_and_the_running_sites_admitted():
    server: object = SimpleNamespace(urls={"shop": SITE})
    tasks = [
        task("bundled", "bundled://shop/search?q=mug"),
        task("own-site", f"{SITE}/item/3"),  # an imported suite on a running site
        task("public", "https://Example.com/a/../b"),
        task("file", "file:///etc/passwd"),
        task("metadata", "http://169.254.169.254/latest/meta-data/"),
        task("metadata-hex", "http://0xA9.0xFE.0xA9.0xFE/"),
        task("loopback", "http://127.0.0.1:5432/"),
        task("intranet", "http://wiki.internal/"),
        task("credentials", "http://user:pw@example.com/"),
    ]
    starts, refused = vet_starts(tasks, server, allow_private=False)  # type: ignore[arg-type]
    assert {k: v.href for k, v in starts.items()} == {
        "bundled": f"{SITE}/search?q=mug",
        "own-site": f"{SITE}/item/3",
        "public": "https://example.com/b",  # what the browser visits
    }
    assert starts["bundled"].origin == SITE
    assert set(refused) == {
        "file",
        "metadata",
        "metadata-hex",
        "loopback",
        "intranet",
        "credentials",
    }
    assert all(r.startswith(f"{REFUSED}: ") for r in refused.values())
    assert "the scheme 'file' is not http or https" in refused["file"]
    assert "169.254.169.254 is a link-local or cloud metadata address" in refused["metadata"]
    assert "169.254.169.254 is a link-local" in refused["metadata-hex"]
    assert "user name or password" in refused["credentials"] and "pw" not in refused["credentials"]
    for private in ("loopback", "intranet"):  # refused, with the way to admit them
        assert "--allow-private" in refused[private]
    assert "--allow-private" not in refused["metadata"] + refused["file"]

    starts, refused = vet_starts(tasks, server, allow_private=True)  # type: ignore[arg-type]
    assert set(refused) == {"file", "metadata", "metadata-hex", "credentials"}
    assert starts["loopback"].href == "http://127.0.0.1:5432/"

    _, refused = vet_starts([task("own-site", f"{SITE}/")], None, allow_private=False)
    assert set(refused) == {"own-site"}  # no sites running: a loopback URL like any other


def test_allow_private_does_not_change_the_run():
    assert CollectConfig(allow_private=True).identity() == CollectConfig().identity()


@pytest.mark.browser
def test_collect_refuses_bad_start_urls_written_past_the_import_and_runs_the_rest(
    wh: Warehouse, sites, chromium
):
    good = dataclasses.replace(generate(1, 0, templates=["mail_archive"])[0], suite="mixed")
    wh.write(
        [
            good,
            task("mixed/file", "file:///etc/passwd"),
            task("mixed/metadata", "http://169.254.169.254/latest/meta-data/"),
        ]
    )
    cfg = CollectConfig(suite="mixed", split=None, n_tasks=3, concurrency=2, run_name="mixed")
    out = chromium.run(run_collect(wh, cfg, server=sites, browser=chromium.browser))
    assert out.ran == 3 and out.by_status == {"success": 1, "infra_error": 2}
    rows = wh.sql(
        "SELECT task_id, status, n_steps, error, meta->>'ended_by' AS ended_by "
        "FROM trajectories WHERE run_id = 'mixed' ORDER BY task_id"
    ).rows(named=True)
    by_task = {r["task_id"]: r for r in rows}
    assert by_task[good.task_id]["status"] == "success"
    for tid, why in [
        ("mixed/file", "the scheme 'file' is not http or https"),
        ("mixed/metadata", "the host 169.254.169.254 is a link-local or cloud metadata address"),
    ]:
        row = by_task[tid]
        assert (row["status"], row["n_steps"], row["ended_by"]) == ("infra_error", 0, REFUSED)
        assert row["error"] == f"{REFUSED}: {why}"
    assert (
        wh.sql(
            "SELECT count(*) FROM steps WHERE traj_id IN "
            "(SELECT traj_id FROM trajectories WHERE task_id LIKE 'mixed/%')"
        ).item()
        == 0
    )  # no browser work for them
