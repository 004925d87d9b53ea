"""Expert trajectories are SFT data: collected in real Chromium in the model-facing action space,
each step stores the prompt a model would have seen, and the exported SFT rows render back to
exactly those stored bytes (and train on the action a model would emit, not a CSS selector)."""

from __future__ import annotations

import datasets
import pytest

from curation.build import build_dataset
from curation.examples import sft_messages
from curation.recipe import parse_recipe
from rollouts.actions import ParseError, parse_action
from rollouts.prompts import render
from sites.tasks import generate
from stages.collect import CollectConfig, run_collect
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TEMPLATES = ["shop_add_to_cart", "wiki_fact", "mail_archive"]

RECIPE = """
name: expert-sft
sources: {splits: [train], policies: [expert]}
filters: [{length: {min_steps: 1, max_steps: 30}}]
output: {sft: true, k_images: 3}
gates: {success_rate: [1.0, 1.0]}
"""


def test_expert_rollouts_export_as_sft_rows_with_the_stored_prompt_bytes(tmp_path, sites, chromium):
    tasks = [t for t in generate(40, 0, templates=TEMPLATES) if t.split == "train"][:3]
    assert {t.site for t in tasks} == {"shop", "wiki", "mail"}
    cfg = CollectConfig(split="train", n_tasks=3, concurrency=3, run_name="expert-sft")
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path / "home")) as wh:
        put_tasks(wh, tasks)
        out = chromium.run(run_collect(wh, cfg, server=sites, browser=chromium.browser))
        assert out.by_status == {"success": 3}
        steps = wh.sql("SELECT prompt_hash, action_text FROM steps")
        assert steps["prompt_hash"].null_count() == 0  # the expert stored its prompts
        stored = {h: wh.blobs.get(h) for h in steps["prompt_hash"].to_list()}
        ds = build_dataset(
            wh, parse_recipe(RECIPE, "expert-sft.yaml"), out_dir=tmp_path / "out", blobs=wh.blobs
        )
    assert ds.counts["sft"] == steps.height
    rows = datasets.load_from_disk(f"{ds.export_path}/sft")
    # the PNG bytes as stored (decoding to PIL and re-encoding would change the bytes, not pixels)
    rows = rows.cast_column("images", datasets.List(datasets.Image(decode=False)))
    assert len(rows) == steps.height
    for row in rows:
        messages = sft_messages(row)
        assert render(messages[:-1]).encode() == stored[row["prompt_hash"]]
        action = messages[-1]["content"].rsplit("Action: ", 1)[-1]
        assert not isinstance(parse_action(action), ParseError)
        assert "css=" not in action  # what a model emits: refs / coordinates, never selectors
