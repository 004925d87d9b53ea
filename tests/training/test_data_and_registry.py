"""Training data from a real curated export and from collected runs; the warehouse bookkeeping of
training (runs, metrics without duplicates, checkpoints, lineage); evaluation summaries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from curation.build import build_dataset
from rollouts.prompts import PROMPT_FORMAT_VERSION, render
from tests.curation.test_examples import RUN, engine_warehouse, recipe
from training import registry
from training.data import find_dataset, run_steps, sft_turns
from training.evaluate import compare, record, run_outcomes, summarize
from training.interface import DataMismatch
from training.rl import prepare
from training.stats import wilson
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import Task, Trajectory


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("training-data")
    cfg = WarehouseConfig.from_env(home=base / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        engine_warehouse(wh)
        r = recipe(filters="[{drop_invalid_steps: {noop: false}}]")  # (as tests/curation)
        ds = build_dataset(wh, r, out_dir=base / "datasets", blobs=wh.blobs, progress=None)
        yield wh, ds, base


def test_sft_turns_are_the_exported_rows_with_their_screenshots(built):
    wh, ds, _ = built
    ref = find_dataset(wh, ds.name)
    assert (ref.dataset_id, ref.snapshot_id) == (ds.dataset_id, ds.snapshot_id)
    turns = sft_turns(ref.export_path)
    # train tasks: 2 kettle samples x 3 + oslo 3, less the step whose output did not parse
    assert len(turns) == ds.counts["sft"] == 8
    for t in turns:
        stored = wh.blobs.get(t.prompt.encode() and _hash(t.prompt))
        assert stored == t.prompt.encode()  # the prompt the policy saw, byte for byte
        refs = t.prompt.count('"url":"sha256:')
        assert len(t.images) == refs >= 1
        assert t.completion.startswith(("Thought:", "Action:", "Summary:"))
    # screenshots are the stored blobs themselves
    first = turns[-1]
    digests = [p.split('"')[0] for p in first.prompt.split('"url":"sha256:')[1:]]
    assert [wh.blobs.get(d) for d in digests] == list(first.images)


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_bad_datasets_are_refused_before_training_with_the_reason(built):
    wh, ds, base = built
    with pytest.raises(DataMismatch, match=r"no dataset named or with id 'nope'.*demo-set"):
        find_dataset(wh, "nope")
    ref = find_dataset(wh, ds.dataset_id)
    with pytest.raises(DataMismatch, match=r"no SFT rows in split.*ood.*8 rows in train"):
        sft_turns(ref.export_path, ("ood",))
    other = base / "other-format"
    shutil.copytree(ref.export_path, other)
    meta = json.loads((other / "metadata.json").read_text())
    assert meta["prompt_format"] == PROMPT_FORMAT_VERSION == 2
    (other / "metadata.json").write_text(json.dumps({**meta, "prompt_format": 1}))
    with pytest.raises(DataMismatch, match=r"format version 1.*writes version 2"):
        sft_turns(other)


def test_rl_turns_from_a_run_carry_rewards_and_group_advantages(built):
    wh, _, _ = built
    steps = run_steps(wh, [RUN])
    assert steps.height == wh.sql("SELECT count(*) AS n FROM steps")["n"][0]
    turns, stats = prepare(wh, [RUN], "grpo")
    # every step has a stored prompt and output; rewards come from the graded statuses
    assert stats["turns"] == steps.filter(pl.col("reward").is_not_null()).height
    by_traj = steps.group_by("traj_id").agg(pl.col("status").first(), pl.col("group_id").first())
    for t in turns:
        assert wh.blobs.get_text(_hash(t.prompt)) == t.prompt
        assert t.old_logprob is None or isinstance(t.old_logprob, float)
    # a group with one success and one failure: +1 / -1; singleton groups: 0
    groups = by_traj.group_by("group_id").agg(pl.col("status"))
    mixed = [g for g in groups.iter_rows(named=True) if len(set(g["status"])) > 1]
    advs = {t.key.rsplit("/", 1)[0]: t.advantage for t in turns}
    status = dict(by_traj.select("traj_id", "status").iter_rows())
    for traj, a in advs.items():
        gid = by_traj.filter(pl.col("traj_id") == traj)["group_id"][0]
        if any(g["group_id"] == gid for g in mixed):
            assert a == pytest.approx(1.0 if status[traj] == "success" else -1.0, abs=1e-4)
        else:
            assert a == 0.0
    assert mixed, "the fixture must hold a group with both outcomes"


def test_sampled_token_ids_go_from_the_server_through_the_warehouse_to_rl_turns(tmp_path):
    """A policy that asks for its tokens by id stores them per step (``steps.token_ids``);
    RL's turns carry them to the trainer. A policy that does not ask stores none (and does not
    send the vLLM-only field a stock OpenAI endpoint would reject)."""
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        engine_warehouse(wh, token_ids=True)
        stored = wh.sql("SELECT token_ids FROM steps")["token_ids"].to_list()
        assert stored and all(json.loads(v) == [7, 9] for v in stored)
        turns, _ = prepare(wh, [RUN], "grpo")
        assert turns and all(t.reply_ids == (7, 9) for t in turns)
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path / "h2", warehouse="")) as wh:
        engine_warehouse(wh)
        assert wh.sql("SELECT count(*) FROM steps WHERE token_ids IS NOT NULL").item() == 0
        assert all(t.reply_ids is None for t in prepare(wh, [RUN], "grpo")[0])


def test_metrics_relogged_after_a_resume_are_not_duplicated_and_lineage_is_one_join(built):
    wh, ds, base = built
    rid = registry.training_run_id("sft", "ranker", ds.dataset_id, {"lr": 1e-3})
    assert rid == registry.training_run_id("sft", "ranker", ds.dataset_id, {"lr": 1e-3})
    row = registry.start_run(
        wh,
        rid,
        stage="sft",
        base_model="ranker",
        dataset_id=ds.dataset_id,
        source_run=None,
        config={"lr": 1e-3},
        code_version="test",
    )
    log = registry.MetricsLog(wh, rid, every=2)
    for step in (1, 2, 3):
        log(step, {"loss": 3.0 - step})
    log.flush()
    for step in (3, 4):  # a resumed run re-runs step 3
        log(step, {"loss": 0.5})
    log.flush()
    m = wh.sql("SELECT step, value FROM metrics WHERE training_run_id = ? ORDER BY step", [rid])
    assert m.rows() == [(1, 2.0), (2, 1.0), (3, 0.5), (4, 0.5)]
    ckpt = base / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights")
    cid = registry.register_checkpoint(wh, rid, 4, ckpt)
    registry.end_run(wh, row, "completed")
    lin = registry.lineage(wh, cid).row(0, named=True)
    assert (lin["dataset_id"], lin["snapshot_id"], lin["dataset"]) == (
        ds.dataset_id,
        ds.snapshot_id,
        ds.name,
    )
    assert registry.find_checkpoint(wh, rid)["checkpoint_id"] == cid
    assert registry.find_checkpoint(wh, str(ckpt))["checkpoint_id"] == cid
    before = registry.weights_sha256(ckpt)
    (ckpt / "model.safetensors").write_bytes(b"other")
    assert registry.weights_sha256(ckpt) != before
    status = wh.sql("SELECT status FROM training_runs WHERE training_run_id = ?", [rid]).item()
    assert status == "completed"


def test_evaluation_counts_outcomes_excludes_infra_errors_and_compares(wh: Warehouse):
    tasks = [
        Task(
            task_id=f"t{i}",
            suite="bundled",
            site="shop" if i % 2 else "wiki",
            split="test",
            instruction=f"task {i}",
            start_url="bundled://shop/",
            difficulty=1 + i % 3,
        )
        for i in range(10)
    ]
    wh.write(tasks)
    statuses = ["success"] * 6 + ["failure", "timeout", "infra_error", "success"]
    wh.write(
        [
            Trajectory(traj_id=f"a{i}", run_id="run-a", task_id=f"t{i}", policy="p", status=s)
            for i, s in enumerate(statuses)
        ]
        + [
            Trajectory(traj_id=f"b{i}", run_id="run-b", task_id=f"t{i}", policy="p", status=s)
            for i, s in enumerate(["failure"] * 9 + ["success"])
        ]
    )
    s = summarize(run_outcomes(wh, "run-a"))
    assert (s.n, s.n_success) == (9, 7)  # the infra error is no outcome of the policy
    assert s.excluded == {"infra_error": 1}
    assert (s.ci_low, s.ci_high) == pytest.approx(wilson(7, 9))
    shop = next(r for r in s.by_site if r["site"] == "shop")
    assert (shop["n"], shop["n_success"]) == (5, 4)  # t1 t3 t5 t9 success, t7 timeout
    ea, _ = record(wh, "run-a", suite="bundled", split="test", policy="p", checkpoint_id=None)
    eb, _ = record(wh, "run-b", suite="bundled", split="test", policy="p", checkpoint_id="c")
    again, _ = record(wh, "run-a", suite="bundled", split="test", policy="p", checkpoint_id=None)
    assert again.evaluation_id == ea.evaluation_id
    assert wh.sql("SELECT count(*) FROM evaluations").item() == 2
    rows = {r["evaluation_id"]: r for r in wh.sql("SELECT * FROM evaluations").to_dicts()}
    c = compare(rows[ea.evaluation_id], rows[eb.evaluation_id])
    assert c["diff"] == pytest.approx(1 / 10 - 7 / 9)
    assert c["ci_low"] < c["diff"] < c["ci_high"] < 0
    assert c["same_split"]
    assert (c["a"], c["b"], c["rate_a"], c["rate_b"]) == (
        ea.evaluation_id,
        eb.evaluation_id,
        pytest.approx(7 / 9),
        pytest.approx(1 / 10),
    )
    # the flywheel's summaries (rate, no suite/split) compare the same way: one function
    summaries = [
        {
            k: rows[e.evaluation_id][k]
            for k in ("evaluation_id", "n", "n_success", "ci_low", "ci_high")
        }
        for e in (ea, eb)
    ]
    s = compare(*summaries)
    assert {k: s[k] for k in ("diff", "ci_low", "ci_high", "separated", "rate_a", "rate_b")} == {
        k: c[k] for k in ("diff", "ci_low", "ci_high", "separated", "rate_a", "rate_b")
    }
    assert s["same_split"] is None  # they do not say


def test_outcomes_read_the_task_version_ran_and_each_judge_s_latest_judgment(wh: Warehouse):
    """The evaluation and the RL rewards took "any version" of a task (``any_value(site)`` per
    task id) and the newest non-error verdict of any judge; the shared relations say: the task
    version the trajectory ran, and a judge whose latest judgment errored has no verdict."""
    import datetime as dt

    from warehouse.records import Judgment

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    wh.write(
        [
            Task(
                task_id="k",
                suite="s",
                site="shop",
                split="test",
                instruction="i",
                start_url="u",
                difficulty=1,
                version=1,
            ),
            Task(
                task_id="k",
                suite="s",
                site="wiki",
                split="test",
                instruction="i",
                start_url="u",
                difficulty=3,
                version=2,
            ),
        ]
    )
    wh.write(
        [
            Trajectory(
                traj_id="x", run_id="r", task_id="k", policy="p", status="success", task_version=2
            ),
            Trajectory(traj_id="y", run_id="r", task_id="k", policy="p", status="finished"),
            Trajectory(traj_id="z", run_id="r", task_id="k", policy="p", status="finished"),
        ]
    )
    wh.write(
        [
            Judgment(judgment_id="y1", traj_id="y", judge="vlm", judge_version="1",
                     verdict="success", created_at=t0),
            Judgment(judgment_id="y2", traj_id="y", judge="vlm", judge_version="2",
                     error="timeout", created_at=t0 + dt.timedelta(minutes=1)),
            Judgment(judgment_id="z1", traj_id="z", judge="vlm", judge_version="2",
                     verdict="failure", created_at=t0),
        ]
    )  # fmt: skip
    out = run_outcomes(wh, "r").select("traj_id", "site", "difficulty", "status", "success")
    assert out.rows() == [
        ("x", "wiki", 3, "success", 1),
        ("y", "shop", 1, "finished", None),  # its judge's latest judgment is an error
        ("z", "shop", 1, "failure", 0),
    ]


def test_render_is_what_training_reads(built):
    """The turn prompt is render(messages) text: parseable back to the chat messages."""
    wh, ds, _ = built
    t = sft_turns(find_dataset(wh, ds.name).export_path)[0]
    assert render(json.loads(t.prompt)) == t.prompt
    assert Path(find_dataset(wh, ds.name).export_path).exists()
