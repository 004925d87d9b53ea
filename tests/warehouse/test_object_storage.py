"""A team warehouse on S3-compatible storage: DuckLake's data files and the blob store on a real
S3-protocol server (moto's, standing in for S3/MinIO, :mod:`tests.s3_stand_in`), reached with
the standard AWS variables; what a second machine sees, an outage and a recovery, and the
credentials kept out of everything written."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from curation.build import build_dataset
from sites.tasks import generate
from tests.cli.cli_runner import webloop
from tests.curation.test_examples import engine_warehouse, recipe
from tests.curation.test_export import file_hashes
from tests.s3_stand_in import MARKER_SECRET, S3StandIn
from warehouse import Warehouse, WarehouseConfig
from warehouse.blobs import BlobCorruptError, BlobNotFoundError, NotAnImageError
from warehouse.config import ConfigError
from warehouse.copy import CopyError, copy_warehouse
from warehouse.info import checks
from warehouse.objectblobs import BlobStoreUnavailable, ObjectBlobStore
from warehouse.records import Trajectory
from warehouse.tasks import put_tasks


@pytest.fixture(scope="module")
def s3() -> Iterator[S3StandIn]:
    with S3StandIn() as server:
        yield server


@pytest.fixture
def team(s3: S3StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The AWS environment of the stand-in, and this test's own prefix in the bucket."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    prefix = tmp_path.name
    return {
        "catalog": str(tmp_path / "shared" / "catalog.sqlite"),  # PostgreSQL in a real team
        "data": f"s3://{s3.bucket}/{prefix}/lake/",
        "blobs": f"s3://{s3.bucket}/{prefix}/blobs",
        "prefix": prefix,
    }


def machine(team: dict[str, str], home: Path) -> WarehouseConfig:
    """One machine's view of the team warehouse: its own home (and blob cache)."""
    return WarehouseConfig.from_env(
        home=home, warehouse=team["catalog"], data_path=team["data"], blob_path=team["blobs"]
    )


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 8), color).save(buf, "PNG")
    return buf.getvalue()


def test_two_machines_share_rows_and_blobs_through_the_bucket(s3, team, tmp_path):
    tasks = generate(12, 0)
    with Warehouse.open(machine(team, tmp_path / "a")) as wh:
        put_tasks(wh, tasks)
        shot = wh.blobs.put_image(png((200, 30, 30)))
        again = wh.blobs.put_image(png((200, 30, 30)))
    assert shot.new and not again.new  # content-addressed: stored once
    keys = s3.keys(team["prefix"])
    h = shot.hash
    assert f"{team['prefix']}/blobs/{h[:2]}/{h[2:4]}/{h}" in keys
    assert any(k.startswith(f"{team['prefix']}/lake/main/tasks/") for k in keys)
    assert not (tmp_path / "a" / "lake").exists()  # no local data files
    with Warehouse.open(machine(team, tmp_path / "b")) as wh:  # another machine, empty cache
        assert isinstance(wh.blobs, ObjectBlobStore)
        assert sorted(wh.sql("SELECT task_id FROM tasks")["task_id"]) == sorted(
            t.task_id for t in tasks
        )
        assert not wh.blobs.cache.exists(h)
        assert wh.blobs.get(h) == png((200, 30, 30))
        assert wh.blobs.cache.exists(h)  # read once, then from the local cache
        assert list(wh.blobs) == [h] and wh.blobs.stats() == (1, len(png((200, 30, 30))))
        assert checks(wh) == {"catalog": "ok", "data": "ok", "blobs": "ok"}


def test_a_changed_object_a_missing_one_and_a_non_image_are_refused(s3, team, tmp_path):
    with Warehouse.open(machine(team, tmp_path / "a")) as wh:
        h = wh.blobs.put(b"an accessibility tree").hash
        before = s3.keys(team["prefix"])
        with pytest.raises(NotAnImageError, match="not storing a screenshot"):
            wh.blobs.put_image(b"<html>not a png</html>")
        assert s3.keys(team["prefix"]) == before  # nothing stored
        with pytest.raises(BlobNotFoundError, match=f"blob {'0' * 64} not found under s3://"):
            wh.blobs.get("0" * 64)
    key = f"{team['prefix']}/blobs/{h[:2]}/{h[2:4]}/{h}"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"tampered")
    fresh = ObjectBlobStore(team["blobs"], tmp_path / "other-cache")
    with pytest.raises(BlobCorruptError, match=f"blob {h} is corrupt: its bytes at s3://"):
        fresh.get(h)
    assert fresh.verify() == [h]


def test_an_outage_is_reported_clearly_and_the_store_recovers(s3, team, tmp_path):
    with Warehouse.open(machine(team, tmp_path / "a")) as wh:
        wh.blobs.put(b"before the outage")
        s3.stop()
        try:
            with pytest.raises(BlobStoreUnavailable, match=f"blob store {team['blobs']}: ") as e:
                wh.blobs.put(b"during the outage")
            assert MARKER_SECRET not in str(e.value)
            state = checks(wh)
            assert state["blobs"] != "ok" and state["data"] != "ok"
            assert MARKER_SECRET not in json.dumps(state)
        finally:
            s3.start()  # the same port, the same objects
        assert wh.blobs.put(b"during the outage").new  # nothing half-written was left
        assert wh.blobs.get_text(wh.blobs.put(b"before the outage").hash) == "before the outage"
        assert checks(wh) == {"catalog": "ok", "data": "ok", "blobs": "ok"}


def test_credentials_stay_out_of_the_catalog_the_bucket_and_the_cli(
    s3, team, tmp_path, monkeypatch
):
    home = tmp_path / "a"
    team = {**team, "catalog": str(home / "lake" / "catalog.sqlite")}  # the CLI's default one
    with Warehouse.open(machine(team, home)) as wh:
        put_tasks(wh, generate(4, 0))
        wh.blobs.put_text("page text")
        secrets = wh.con.execute("SELECT secret_string FROM duckdb_secrets()").fetchall()
        attached = wh.con.execute("SELECT path FROM duckdb_databases()").fetchall()
    assert secrets and all("secret=redacted" in s for (s,) in secrets)
    assert MARKER_SECRET not in repr(attached) and MARKER_SECRET not in repr(wh.cfg)
    assert MARKER_SECRET.encode() not in Path(team["catalog"]).read_bytes()
    assert all(MARKER_SECRET.encode() not in s3.read(k) for k in s3.keys(team["prefix"]))
    monkeypatch.setenv("WEBLOOP_DATA_PATH", team["data"])
    monkeypatch.setenv("WEBLOOP_BLOBS", team["blobs"])
    out = webloop(home, "warehouse", "info", "--format", "json")
    report = json.loads(out.stdout)
    assert report["checks"] == {"catalog": "ok", "data": "ok", "blobs": "ok"}
    assert report["blob_path"] == team["blobs"] and report["blob_count"] == 1
    assert report["data_files"] >= 1 and MARKER_SECRET not in out.stdout + out.stderr
    table = webloop(home, "warehouse", "info")
    assert f"blobs    {team['blobs']}  ok" in table.stdout
    monkeypatch.setenv("WEBLOOP_BLOBS", f"s3://no-such-bucket/{team['prefix']}")
    bad = webloop(home, "warehouse", "info", ok=False)
    assert bad.returncode == 1 and "no bucket 'no-such-bucket'" in bad.stdout
    assert MARKER_SECRET not in bad.stdout + bad.stderr


# -- warehouse copy: a laptop's warehouse to PostgreSQL + S3 ------------------------------------


def fingerprint(cfg: WarehouseConfig) -> dict[str, str]:
    """The catalog file, every data file and every blob of an embedded warehouse, hashed
    (SQLite's -wal/-shm side files, which any reader may create, left out)."""
    files = [Path(cfg.catalog), *Path(cfg.data_path).rglob("*"), *Path(cfg.blob_path).rglob("*")]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def dashboard_page(monkeypatch: pytest.MonkeyPatch, name: str, **query: str):
    """A dashboard page (AppTest) after one run, on the warehouse the environment names."""
    from streamlit.testing.v1 import AppTest

    from tests.dashboards.conftest import APP

    at = AppTest.from_file(str(APP), default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(f"views/{name}.py")
    return at.run()


def test_copy_moves_every_pinned_snapshot_to_postgres_and_s3_and_resumes(
    s3, team, pg_url, tmp_path, monkeypatch
):
    laptop = WarehouseConfig.from_env(home=tmp_path / "laptop", warehouse="")
    r = recipe(filters="[{drop_invalid_steps: {noop: false}}]")
    with Warehouse.open(laptop) as wh:
        engine_warehouse(wh)
        first = build_dataset(wh, r, out_dir=tmp_path / "a", blobs=wh.blobs, progress=None)
        wh.write([Trajectory("late", "run-engine", "shop-kettle", "openai", "success", 0)])
        src_steps = wh.sql("SELECT count(*) FROM steps").item()
    before = fingerprint(laptop)
    team_cfg = WarehouseConfig.from_env(
        home=tmp_path / "team-machine", warehouse=pg_url, data_path=team["data"],
        blob_path=team["blobs"],
    )  # fmt: skip
    shared = WarehouseConfig.from_env(
        home=tmp_path / "x", warehouse=pg_url, data_path=laptop.data_path
    )
    with pytest.raises(ConfigError, match="is the source's own: two catalogs must not share"):
        copy_warehouse(laptop, shared)
    s3.stop()  # the storage is down when the copy starts: it stops, saying where and why
    try:
        with pytest.raises(CopyError, match=r"copying data file .* failed .*re-run to resume"):
            copy_warehouse(laptop, team_cfg)
    finally:
        s3.start()
    said: list[str] = []
    rep = copy_warehouse(laptop, team_cfg, progress=said.append)
    assert rep.catalog == "copied" and rep.files_copied > 0 and rep.blobs_copied > 0
    assert first.snapshot_id in rep.pinned and rep.rows["steps"] == src_steps
    assert any(m.startswith("verified: rows of") for m in said)
    assert fingerprint(laptop) == before  # the source is only read
    assert any(k.startswith(f"{team['prefix']}/lake/") for k in s3.keys(team["prefix"]))
    args = ("--to", pg_url, "--data-path", team["data"], "--blobs", team["blobs"])
    again = webloop(laptop.home, "warehouse", "copy", *args)  # as a user re-runs it
    assert "nothing to do: postgres:" in again.stdout and MARKER_SECRET not in again.stdout
    for k, v in (("HOME", team_cfg.home), ("WAREHOUSE", pg_url), ("DATA_PATH", team["data"])):
        monkeypatch.setenv(f"WEBLOOP_{k}", str(v))
    monkeypatch.setenv("WEBLOOP_BLOBS", team["blobs"])
    with Warehouse.open(team_cfg) as wh:  # the team's machine, its own blob cache
        assert wh.sql("SELECT count(*) FROM trajectories WHERE traj_id = 'late'").item() == 1
        shown = wh.sql("SELECT traj_id FROM steps WHERE screenshot_hash IS NOT NULL").item(0, 0)
    at = dashboard_page(monkeypatch, "trajectories", traj=shown, step="0")
    assert not at.exception and len(at.image) == 1  # the screenshot, read from the bucket
    assert MARKER_SECRET not in repr([e.value for kind in ("text", "code", "markdown")
                                      for e in getattr(at, kind)])  # fmt: skip
    with Warehouse.open(team_cfg) as wh:
        rebuilt = build_dataset(
            wh, r, out_dir=tmp_path / "b", snapshot_id=first.snapshot_id, blobs=wh.blobs,
            progress=None,
        )  # fmt: skip
    assert rebuilt.dataset_id == first.dataset_id  # the same snapshot id, the same dataset
    assert file_hashes(Path(rebuilt.export_path)) == file_hashes(Path(first.export_path))
    with pytest.raises(CopyError, match="history of its own"):
        copy_warehouse(laptop, team_cfg)  # the team wrote to it since: never overwritten


@pytest.mark.browser
def test_storage_down_mid_collect_keeps_no_half_rows_and_a_rerun_completes(
    s3, team, tmp_path, sites, chromium, caplog
):
    """The S3 server stops after the first blobs of a collect's first batch have landed: the
    collect stops saying the blob store failed; no trajectory of that batch has rows (blobs go
    first, rows after); with the storage back, the same command runs what is missing and
    nothing twice. The outage comes at an exact place (after the 2nd PUT of a new blob), not
    after a sleep: the store's own ``put`` is wrapped to stop the real server there."""
    from stages.collect import CollectConfig, run_collect
    from tests.flows.integrity import duplicate_and_mismatched

    cfg = WarehouseConfig.from_env(home=tmp_path / "a", warehouse="", blob_path=team["blobs"])
    config = CollectConfig(n_tasks=3, policy="expert", prompt_mode="a11y", run_name="outage")
    prefix = f"{team['prefix']}/blobs/"

    with Warehouse.open(cfg) as wh:
        put_tasks(wh, generate(12, 0))
        store, real_put, calls = wh.blobs, wh.blobs.put, []

        def put_then_fail(data: bytes) -> Any:
            if len(calls) == 2:  # two blobs are in: the third PUT meets the outage
                s3.stop()
            calls.append(data)
            return real_put(data)

        store.put = put_then_fail  # type: ignore[method-assign]
        try:
            with pytest.raises(Exception, match=f"blob store {team['blobs']}: ") as err:
                chromium.run(run_collect(wh, config, server=sites, browser=chromium.browser))
            assert MARKER_SECRET not in str(err.value)
            assert wh.sql("SELECT count(*) FROM trajectories").item() == 0  # no half batch
        finally:
            store.put = real_put  # type: ignore[method-assign]
            s3.start()
        assert len(s3.keys(prefix)) == 2  # the outage came mid-batch: two blobs, no rows
        res = chromium.run(run_collect(wh, config, server=sites, browser=chromium.browser))
        assert res.ran == 3 and res.by_status == {"success": 3}
        assert duplicate_and_mismatched(wh) == (0, 0)
        named = set(wh.sql("SELECT hash FROM blobs")["hash"])
        config_text = wh.sql("SELECT CAST(config AS VARCHAR) FROM runs").item()
    assert named <= {k.rsplit("/", 1)[-1] for k in s3.keys(prefix)}  # every row's blob stored
    assert MARKER_SECRET not in config_text + caplog.text  # nor in the run's config or logs


def test_copy_into_a_new_sqlite_catalog_with_local_files(tmp_path):
    """No object storage at all: a warehouse moved to another folder and SQLite file (the
    destination file does not exist yet), its blob store shared (content-addressed)."""
    src = WarehouseConfig.from_env(home=tmp_path / "old", warehouse="")
    with Warehouse.open(src) as wh:
        put_tasks(wh, generate(6, 0))
        h = wh.blobs.put_text("a tree").hash
    dst = WarehouseConfig.from_env(
        home=tmp_path / "new", warehouse=str(tmp_path / "new" / "catalog.sqlite"),
        data_path=str(tmp_path / "new" / "data"), blob_path=src.blob_path,
    )  # fmt: skip
    rep = copy_warehouse(src, dst)
    assert rep.catalog == "copied" and rep.files_copied >= 1 and rep.blobs_copied == 0
    assert rep.rows["tasks"] == 6 and copy_warehouse(src, dst).nothing_to_do
    with Warehouse.open(dst, read_only=True) as wh:
        assert wh.sql("SELECT count(*) FROM tasks").item() == 6
        assert wh.blobs.get_text(h) == "a tree"
    assert Path(dst.data_path).is_dir() and Path(src.data_path).is_dir()  # both intact


def test_storage_urls_of_other_schemes_are_refused_with_the_variable_named(tmp_path):
    with pytest.raises(ConfigError, match=r"WEBLOOP_DATA_PATH='gs://b/lake/': use a folder or"):
        WarehouseConfig.from_env(home=tmp_path, warehouse="", data_path="gs://b/lake/")
    with pytest.raises(ConfigError, match=r"WEBLOOP_BLOBS='http://h/b': use a folder or an s3"):
        WarehouseConfig.from_env(home=tmp_path, warehouse="", blob_path="http://h/b")
