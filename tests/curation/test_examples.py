"""SFT / RL / preference examples rendered from stored trajectories.

The warehouses here are written by the real rollout engine (``rollouts.engine.Engine`` +
``BatchWriter``) with an OpenAI-compatible model server (a local HTTP server, the protocol of a
remote provider) scripting the replies, so every step stores the exact prompt the policy saw
(``steps.prompt_hash``). The browser test does the same through ``flows.collect.run_collect`` in
real Chromium over the bundled sites."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import datasets
import polars as pl
import pytest

from curation import examples as ex_mod
from curation.examples import render_examples, sft_messages
from curation.recipe import parse_recipe
from curation.select import select
from rollouts.engine import Engine, EngineConfig, Outcome, make_jobs
from rollouts.policies import OpenAIPolicy
from rollouts.prompts import PromptConfig, render
from rollouts.simenv import SimEnv
from rollouts.writer import BatchWriter
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from warehouse import Warehouse
from warehouse.ids import traj_id_for
from warehouse.records import Intervention, Run, Task
from warehouse.tasks import put_tasks
from warehouse.versions import current_snapshot

RUN = "run-engine"
TASKS = [
    # task_id, split, instruction, replies of sample 0, replies of sample 1 (None: one sample)
    ("shop-kettle", "train", "Add the blue kettle to the cart"),
    ("travel-oslo", "train", "Find the cheapest flight from Berlin to Oslo"),
    ("mail-alice", "test", "Open the newest email from Alice and report its subject"),
]
# What the scripted model replies: per task, per sample, the replies in order. Sample 0 of the
# kettle succeeds; sample 1 shares the first action and then goes wrong (a preference pair).
SCRIPT = {
    "Add the blue kettle": [
        [
            "Thought: the search box.\nSummary: looking for kettles\nAction: click(e2)",
            'Action: type(e2, "blue kettle")',
            'Thought: found it.\nAction: answer("added")',
        ],
        [
            "Thought: the search box.\nAction: click(e2)",
            "Thought: maybe next.\nAction: click(e4)",
            'Action: answer("could not")',
        ],
    ],
    "Find the cheapest flight": [
        ["Action: click(e3)", "Action: nonsense without a call", 'Action: answer("EUR 89")']
    ],
    "Open the newest email": [["Action: click(e1)", 'Action: answer("Hello")']],
    "Open Alice's newest email": [["Action: click(e1)", 'Action: answer("Hello")']],
    "Open the newest email from Bob": [["Action: click(e1)", 'Action: answer("Hi")']],
}
REWORDED = ("mail-reworded", "train", "Open Alice's newest email and report its subject")
OTHER = ("mail-bob", "train", "Open the newest email from Bob and report its subject")
FAILED = traj_id_for(RUN, "shop-kettle", 1)
OUTCOME = {("shop-kettle", 0): "success", ("shop-kettle", 1): "failure"}


class ScriptedModel:
    """Replies from :data:`SCRIPT`: the sample is the number of episodes of that task seen so
    far (the engine runs one trajectory at a time here), the turn the number of earlier
    actions in the prompt."""

    def __init__(self) -> None:
        self.episodes: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> str:
        text = last_user_text(body)
        key = max((k for k in SCRIPT if k in text), key=len)
        if "Previous actions: none" in text:
            self.episodes[key] = self.episodes.get(key, 0) + 1
        sample = self.episodes[key] - 1
        turn = sum(1 for line in text.splitlines() if line[:1].isdigit() and ". " in line)
        replies = SCRIPT[key][min(sample, len(SCRIPT[key]) - 1)]
        return replies[min(turn, len(replies) - 1)]


def engine_warehouse(
    wh: Warehouse,
    *,
    k_images: int = 2,
    samples: int = 2,
    extra: tuple = (),
    token_ids: bool = False,
) -> None:
    """Tasks, a collect run (its prompt config in runs.config) and its trajectories, written
    by the real engine and batch writer over a simulated browser (``token_ids``: the policy
    records the sampled token ids the fake server names)."""
    tasks = [
        Task(
            task_id=tid,
            suite="bundled",
            site=tid.split("-")[0],
            split=split,
            instruction=text,
            start_url=f"bundled://{tid.split('-')[0]}/",
            difficulty=2,
        )
        for tid, split, text in [*TASKS, *extra]
    ]
    put_tasks(wh, tasks)
    prompt = PromptConfig(mode="both", k_images=k_images, self_summary=True)
    config = {"policy": "openai", "prompt_mode": "both", "k_images": k_images, "self_summary": True}
    wh.write([Run(run_id=RUN, kind="collect", config=config, status="completed")])
    model = ScriptedModel()

    async def grade(env: Any, job: Any, answer: str | None) -> Outcome:
        return Outcome(OUTCOME.get((job.task.task_id, job.sample_idx), "success"))

    async def go() -> None:
        with FakeOpenAI([], default=("fn", model)) as server:
            policy = OpenAIPolicy(
                server.url, "scripted", prompt=prompt, retries=0, token_ids=token_ids
            )
            writer = BatchWriter(wh).start()
            zero = lambda _rng: 0.0  # noqa: E731
            engine = Engine(
                RUN,
                policy,
                grade,
                writer.put,
                config=EngineConfig(concurrency=1, samples=1, max_steps=5, schedule="fifo"),
                env_factory=lambda: SimEnv(step_s=zero, reset_s=zero),
            )
            resolve = lambda t: (t.start_url, [])  # noqa: E731
            jobs = make_jobs(RUN, tasks, 1, resolve)
            if samples > 1:  # a second kettle sample, after the first (fifo, one at a time)
                jobs += make_jobs(RUN, tasks[:1], samples, resolve)[1:]
            await engine.run(jobs)
            await writer.close()
            await policy.aclose()

    asyncio.run(go())


RECIPE = """
name: demo-set
sources: {{splits: [{splits}]}}
filters: {filters}
output: {{sft: true, rl_groups: true, preferences: true, k_images: {k}}}
"""


def recipe(k: int = 2, splits: str = "train", extra: str = "", filters: str = "[]") -> Any:
    text = RECIPE.format(k=k, splits=splits, filters=filters) + extra
    return parse_recipe(text, "test.yaml")


def read_spool(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa

    with pa.ipc.open_stream(pa.OSFile(str(path))) as reader:
        return reader.read_all().to_pylist()


@pytest.fixture
def engine_wh(wh: Warehouse) -> Warehouse:
    engine_warehouse(wh)
    return wh


def test_sft_rows_render_back_to_the_exact_stored_prompt_bytes(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    sel = select(wh, recipe(), snapshot_id=current_snapshot(wh))
    ex = render_examples(wh, sel, recipe(), wh.blobs, tmp_path / "spool")
    rows = read_spool(ex.spool["sft"])
    # train tasks only: kettle (2 samples x 3 steps) + oslo (3 steps) = 9 steps
    assert len(rows) == 9 == ex.counts["sft"]
    for row in rows:
        stored = wh.blobs.get(row["prompt_hash"])
        assert row["prompt"].encode() == stored
        assert render(sft_messages(row)[:-1]).encode() == stored
    # step 2 of a kettle trajectory: k_images=2 screenshots, two earlier actions, the summary
    third = next(r for r in rows if r["task_id"] == "shop-kettle" and r["step_idx"] == 2)
    assert len(third["images"]) == 2
    user = sft_messages(third)[1]["content"]
    assert [p["type"] for p in user] == ["text", "image_url", "image_url"]
    assert user[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "1. click(e2)" in user[0]["text"]
    assert "looking for kettles" in user[0]["text"]  # the running self-summary


def test_targets_are_model_replies_and_invalid_steps_stay_visible(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    sel = select(wh, recipe(), snapshot_id=current_snapshot(wh))
    ex = render_examples(wh, sel, recipe(), wh.blobs, tmp_path / "spool")
    rows = {
        (r["task_id"], r["traj_id"] == FAILED, r["step_idx"]): r
        for r in read_spool(ex.spool["sft"])
    }
    assert rows[("shop-kettle", False, 1)]["completion"] == 'Action: type(e2, "blue kettle")'
    # the unparseable reply is the stored target; the next prompt shows it as invalid
    assert rows[("travel-oslo", False, 1)]["completion"] == "Action: nonsense without a call"
    shown = json.loads(rows[("travel-oslo", False, 2)]["prompt"])[1]["content"][0]["text"]
    assert re.search(r'\n2\. \(invalid action\)  # on page ".*"  \(failed: no action found', shown)
    checks = ex.target_checks.filter(~pl.col("parses"))
    assert checks.get_column("completion").to_list() == ["Action: nonsense without a call"]


def test_recipe_k_images_changes_the_rendering(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    r1 = recipe(k=1)
    sel = select(wh, r1, snapshot_id=current_snapshot(wh))
    rows = read_spool(render_examples(wh, sel, r1, wh.blobs, tmp_path / "s").spool["sft"])
    assert {len(r["images"]) for r in rows} == {1}
    later = [r for r in rows if r["step_idx"] > 0]
    assert later and all(r["prompt"].encode() != wh.blobs.get(r["prompt_hash"]) for r in later)
    r0 = recipe(k=0)  # text-only prompts: no image part, no images, the same text otherwise
    blind = read_spool(render_examples(wh, sel, r0, wh.blobs, tmp_path / "t").spool["sft"])
    assert {len(r["images"]) for r in blind} == {0}
    assert all('"image_url"' not in r["prompt"] for r in blind)
    seen = {(r["traj_id"], r["step_idx"]): r for r in rows}
    for r in blind:
        text = json.loads(seen[(r["traj_id"], r["step_idx"])]["prompt"])[1]["content"][0]["text"]
        assert json.loads(r["prompt"])[1]["content"][0]["text"] == text


def test_rl_groups_carry_group_relative_advantages(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    sel = select(wh, recipe(), snapshot_id=current_snapshot(wh))
    rows = read_spool(render_examples(wh, sel, recipe(), wh.blobs, tmp_path / "s").spool["rl"])
    by = {(r["task_id"], r["status"]): r for r in rows}
    # kettle group: rewards 1, 0 -> mean 0.5, std 0.5 -> advantages ±0.5 / (0.5 + 1e-6)
    assert by[("shop-kettle", "success")]["advantage"] == pytest.approx(0.5 / (0.5 + 1e-6))
    assert by[("shop-kettle", "failure")]["advantage"] == pytest.approx(-0.5 / (0.5 + 1e-6))
    # a group of one: advantage 0
    assert by[("travel-oslo", "success")]["advantage"] == 0.0
    assert by[("shop-kettle", "success")]["actions"] == [
        "click(e2)",
        'type(e2, "blue kettle")',
        'answer("added")',
    ]


def test_outcome_preference_pair_at_the_first_differing_step(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    sel = select(wh, recipe(), snapshot_id=current_snapshot(wh))
    ex = render_examples(wh, sel, recipe(), wh.blobs, tmp_path / "s")
    rows = read_spool(ex.spool["preferences"])
    assert len(rows) == 1
    pair = rows[0]
    assert (pair["source"], pair["task_id"], pair["step_idx"]) == ("outcome", "shop-kettle", 1)
    assert pair["chosen"] == 'Action: type(e2, "blue kettle")'
    assert pair["rejected"] == "Thought: maybe next.\nAction: click(e4)"
    assert pair["rejected_ref"] == FAILED


def test_interventions_become_prefix_plus_correction(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    failed = FAILED
    wh.write(
        [
            Intervention(
                intervention_id="iv-1",
                traj_id=failed,
                first_error_step=1,
                proposed_action={"type": "type", "text": 'type(e2, "blue kettle")'},
                rationale="the kettle must be searched for",
                verified=True,
                verified_outcome="success",
            )
        ]
    )
    r = recipe(extra="include: {interventions: true}\n")
    sel = select(wh, r, snapshot_id=current_snapshot(wh))
    rows = read_spool(render_examples(wh, sel, r, wh.blobs, tmp_path / "s").spool["sft"])
    iv = [x for x in rows if x["kind"] == "intervention"]
    assert len(iv) == 1
    assert iv[0]["completion"] == (
        'Thought: the kettle must be searched for\nAction: type(e2, "blue kettle")'
    )
    assert iv[0]["step_idx"] == 1 and iv[0]["traj_id"] == failed
    # the prefix: what the failed trajectory's policy saw at its first error
    assert iv[0]["prompt"].encode() == wh.blobs.get(iv[0]["prompt_hash"])


def test_the_names_callers_import_from_here_are_the_split_modules_objects():
    """``curation.examples`` was split along its seams; every name imported from it still is."""
    from curation import reads, render, rl_rows, schemas
    from curation.blob_reader import BlobReader
    from rollouts import actions

    homes = {
        "BlobReader": BlobReader,
        "SCHEMAS": schemas.SCHEMAS,
        "KINDS": schemas.KINDS,
        "group_advantages": rl_rows.group_advantages,
        "REWARDS": rl_rows.REWARDS,
        "reply": render.reply,
        "summaries": render.summaries,
        "sft_messages": render.sft_messages,
        "expert_policy": render.expert_policy,
        "prompt_config": render.prompt_config,
        "INVALID": render.INVALID,
        "read_steps": reads.read_steps,
        "read_run_configs": reads.read_run_configs,
        "trajectory_info": reads.trajectory_info,
        "proposed_action_text": actions.proposed_action_text,
        "action_from_dict": actions.action_from_dict,
    }
    for name, obj in homes.items():
        assert getattr(ex_mod, name) is obj, name
    assert set(homes) < set(ex_mod.__all__)
    assert all(hasattr(ex_mod, name) for name in ex_mod.__all__)


def test_exported_image_bytes_are_the_screenshot_blob(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    sel = select(wh, recipe(), snapshot_id=current_snapshot(wh))
    rows = read_spool(render_examples(wh, sel, recipe(), wh.blobs, tmp_path / "s").spool["sft"])
    row = rows[0]
    assert [wh.blobs.get(h) for h in row["image_hashes"]] == [i["bytes"] for i in row["images"]]
    url = sft_messages(row)[1]["content"][1]["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == row["images"][0]["bytes"]
    assert datasets.Image().decode_example(row["images"][0]).size == (160, 100)


def test_training_rows_render_with_the_system_prompt_their_run_used():
    """A run collected with ``--system-prompt short`` trains on prompts with that system prompt
    (what its policy saw); runs that predate the setting render with the full one."""
    from curation.render import prompt_config

    run = {"prompt_mode": "a11y", "a11y_chars": 600, "a11y_focus": True}
    assert prompt_config(run, 1).system == "full"
    short = prompt_config({**run, "system_prompt": "short"}, 1)
    assert (short.system, short.max_a11y_chars, short.a11y_focus) == ("short", 600, True)
    assert prompt_config(None, 3).system == "full"
