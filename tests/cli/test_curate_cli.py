"""``webloop curate`` (the curate Prefect flow) and ``webloop datasets list|show|diff``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_runner import webloop
from tests.curation.test_examples import engine_warehouse
from warehouse import Warehouse, WarehouseConfig

RECIPE = """\
name: cli-set
description: SFT from the scripted runs
sources: {splits: [train]}
filters:
  - drop_invalid_steps: {noop: false}
output: {sft: true, rl_groups: true, k_images: 2}
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("curate") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        engine_warehouse(wh)
    return h


def test_curate_then_list_show_and_diff(
    prefect_harness, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = webloop(home, "curate", "--recipe", str(recipe), "--out", str(tmp_path / "ds")).stdout
    assert "curate select: 3 trajectories, 8 steps" in out
    assert "curate gates: 9 passed" in out
    assert "dataset cli-set dataset-" in out and "sft 8, rl 3" in out
    first = json.loads(webloop(home, "datasets", "list", "--format", "json").stdout)
    assert [d["name"] for d in first] == ["cli-set"]
    a = first[0]["dataset_id"]
    assert Path(first[0]["export_path"], "sft", "dataset_info.json").exists()

    # a second version: one kettle trajectory per task, built from the first one's snapshot
    recipe.write_text(RECIPE + "balance: {per_task: 1}\n")
    snap = str(first[0]["snapshot_id"])
    ds_dir = str(tmp_path / "ds")
    webloop(home, "curate", "--recipe", str(recipe), "--out", ds_dir, "--snapshot", snap)
    shown = webloop(home, "datasets", "show", "cli-set", "--format", "json").stdout
    fields = {r["field"]: r["value"] for r in json.loads(shown)}
    b = fields["dataset_id"]
    assert b != a and fields["snapshot_id"] == snap
    assert (fields["member trajectories"], fields["member steps"]) == ("2", "5")
    diff = json.loads(webloop(home, "datasets", "diff", a, b, "--format", "json").stdout)
    rows = {r["what"]: r for r in diff}
    assert rows["trajectories removed"]["n"] == "1" and rows["steps removed"]["n"] == "3"
    assert rows["trajectories added"]["n"] == "0" and rows["steps added"]["n"] == "0"
    assert (rows["recipe balance.per_task"]["a"], rows["recipe balance.per_task"]["b"]) == (
        "null",
        "1",
    )
    assert (rows["count sft"]["a"], rows["count sft"]["b"]) == ("8", "5")
    assert rows["snapshot"]["a"] == rows["snapshot"]["b"] == snap
    _push(home, tmp_path, monkeypatch)


def _push(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``webloop datasets push`` to a local stand-in of the Hub's upload endpoints: the newest
    cli-set goes up, to a private repository unless --public; the token is sent, never printed;
    offline, a one-line error and exit 1."""
    from tests.curation.hub_stand_in import HubStandIn

    monkeypatch.setenv("HF_TOKEN", "hf_cli_secret")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with HubStandIn(tmp_path / "hub", "hf_cli_secret") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        res = webloop(home, "datasets", "push", "cli-set", "--repo", "me/cli-set")
        public = webloop(home, "datasets", "push", "cli-set", "--repo", "me/open", "--public")
        visibility = dict(hub.repos)
    assert visibility == {"me/cli-set": True, "me/open": False}
    assert "5 files to me/cli-set (private)" in res.stdout
    assert "5 files to me/open (public)" in public.stdout
    assert "pushed cli-set (dataset-" in res.stdout and "5 files to me/cli-set" in res.stdout
    assert "hf_cli_secret" not in res.stdout + res.stderr
    assert (tmp_path / "hub" / "me" / "cli-set" / "parquet" / "sft.parquet").is_file()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = webloop(home, "datasets", "push", "cli-set", "--repo", "me/cli-set", ok=False)
    assert res.returncode == 1 and "offline mode" in res.stderr


def test_bad_recipe_and_unknown_dataset_are_one_line_usage_errors(home: Path, tmp_path: Path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(RECIPE.replace("k_images: 2", "k_images: many"))
    res = webloop(home, "curate", "--recipe", str(recipe), ok=False)
    assert res.returncode == 2
    assert "bad.yaml:6: output.k_images:" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = webloop(home, "datasets", "show", "nope", ok=False)
    assert res.returncode == 2 and "no dataset with id or name 'nope'" in res.stderr


def test_empty_result_is_a_clear_error(prefect_harness, home: Path, tmp_path: Path):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(RECIPE.replace("{noop: false}", "{noop: false}\n  - length: {min_steps: 9}"))
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        before = wh.sql("SELECT dataset_id FROM datasets ORDER BY 1")["dataset_id"].to_list()
    res = webloop(home, "curate", "--recipe", str(recipe), "--out", str(tmp_path), ok=False)
    assert res.returncode == 2
    assert "selected nothing: filter 'length' removed the last rows" in res.stderr
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        after = wh.sql("SELECT dataset_id FROM datasets ORDER BY 1")["dataset_id"].to_list()
    assert after == before
    assert not list(tmp_path.glob("cli-set-*"))
