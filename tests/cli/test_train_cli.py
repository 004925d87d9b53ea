"""``webloop train sft`` (the train_sft flow) on a curated dataset: checkpoints and metrics in
the warehouse, lineage in one join, a stopped run resumed without repeating logged steps, bad data
refused before training; ``webloop eval`` of a checkpoint on bundled tasks in real Chromium and
``webloop eval compare``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.cli.cli_runner import webloop
from tests.curation.test_examples import engine_warehouse
from warehouse import Warehouse, WarehouseConfig

RECIPE = """\
name: train-set
sources: {splits: [train]}
filters:
  - drop_invalid_steps: {noop: false}
output: {sft: true, k_images: 2}
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("train") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        engine_warehouse(wh)
    return h


@pytest.fixture(scope="module")
def dataset(prefect_harness, home: Path, tmp_path_factory) -> str:
    recipe = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    recipe.write_text(RECIPE)
    webloop(home, "curate", "--recipe", str(recipe))
    return "train-set"


def metrics(home: Path, run_id: str, name: str = "loss") -> list[tuple[int, float]]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return wh.sql(
            "SELECT step, value FROM metrics WHERE training_run_id = ? AND name = ? ORDER BY step",
            [run_id, name],
        ).rows()


def run_id_of(out: str) -> str:
    return out.split("training run ")[1].split(":")[0]


@pytest.mark.prefect
def test_sft_stops_resumes_and_registers_checkpoints_with_lineage(home: Path, dataset: str):
    args = ["train", "sft", "--dataset", dataset, "--model", "ranker", "--epochs", "3"]
    args += ["--batch-size", "2", "--lr", "0.003", "--save-every", "2"]
    first = webloop(home, *args, "--max-steps", "3").stdout
    rid = run_id_of(first)
    assert "3 steps" in first and "resumed" not in first
    assert [s for s, _ in metrics(home, rid)] == [1, 2, 3]
    done = webloop(home, *args).stdout  # the same run, continued to its end
    assert run_id_of(done) == rid and "(resumed from step 3)" in done
    losses = metrics(home, rid)
    total = 12  # 8 rows / batch 2 x 3 epochs
    assert [s for s, _ in losses] == list(range(1, total + 1))  # each step logged once
    assert sum(v for _, v in losses[-3:]) < sum(v for _, v in losses[:3])
    ckpts = json.loads(webloop(home, "checkpoints", "list", "--format", "json").stdout)
    mine = [c for c in ckpts if c["training_run_id"] == rid]
    assert sorted(c["step"] for c in mine) == [2, 3, 4, 6, 8, 10, 12]
    assert {c["dataset"] for c in mine} == {dataset}
    assert len({c["snapshot_id"] for c in mine}) == 1
    last = max(mine, key=lambda c: c["step"])
    assert Path(last["path"], "config.json").exists()
    shown = webloop(home, "checkpoints", "lineage", last["checkpoint_id"]).stdout
    assert last["dataset_id"] in shown
    again = webloop(home, *args).stdout  # finished: nothing left to run
    assert "0 steps" in again and [s for s, _ in metrics(home, rid)] == list(range(1, total + 1))


@pytest.mark.prefect
def test_bad_training_input_is_refused_before_training(home: Path, dataset: str):
    r = webloop(home, "train", "sft", "--dataset", "nope", ok=False)
    assert r.returncode == 2 and "no dataset named or with id 'nope'" in r.stderr
    r = webloop(home, "train", "sft", "--dataset", dataset, "--model", str(home), ok=False)
    assert r.returncode == 2 and "no config.json" in r.stderr
    r = webloop(home, "train", "rl", "--policy", "x", "--estimator", "ppo", ok=False)
    assert r.returncode == 2 and "unknown estimator 'ppo'" in r.stderr
    r = webloop(home, "train", "rl", "--policy", "x", "--horizon", "10,a", ok=False)
    assert r.returncode == 2 and "--horizon '10,a': step budgets separated by commas" in r.stderr
    r = webloop(home, "train", "rl", "--policy", "nope", "--horizon", "5,10", ok=False)
    assert r.returncode == 2 and "no checkpoint 'nope'" in r.stderr
    pool = ["--n-tasks", "8", "--task-pool", "8"]
    r = webloop(home, "train", "rl", "--policy", "x", *pool, ok=False)
    assert r.returncode == 2 and "task_pool 8 must exceed n_tasks 8 (--task-pool" in r.stderr
    r = webloop(home, "train", "rl", "--policy", "x", "--anchor-coef", "1", ok=False)
    assert r.returncode == 2 and "anchor_coef 1.0 needs an anchor dataset" in r.stderr
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        runs = wh.sql("SELECT count(*) FROM training_runs WHERE base_model = ?", [str(home)])
    assert runs.item() == 0


@pytest.mark.prefect
def test_the_tiny_vlm_trains_on_the_dataset_screenshots(home: Path, dataset: str):
    out = webloop(
        home,
        "train",
        "sft",
        "--dataset",
        dataset,
        "--model",
        "tiny",
        "--max-steps",
        "2",
        "--batch-size",
        "2",
        "--lr",
        "0.001",
    ).stdout
    rid = run_id_of(out)
    assert [s for s, _ in metrics(home, rid)] == [1, 2]
    assert Path(home, "models", "tiny-vlm", "config.json").exists()


def test_a_vlm_refuses_data_without_screenshots_unless_text_only():
    from training.data import check_modality
    from training.interface import DataMismatch, Turn

    text = [Turn(prompt="[]", completion="Action: scroll(down)")]
    with pytest.raises(DataMismatch, match=r"dataset d has no screenshots.*--text-only"):
        check_modality("vlm", text, "dataset d")
    check_modality("vlm", text, "dataset d", text_only=True)
    check_modality("ranker", text, "dataset d")
    check_modality("vlm", [Turn(prompt="[]", completion="x", images=(b"png",))], "dataset d")


@pytest.mark.browser
def test_eval_of_a_checkpoint_stores_intervals_and_compares(
    server, chromium, wh: Warehouse, tmp_path: Path
):
    from sites.tasks import generate
    from stages.config import config_from_mapping
    from stages.evaluate import EvalConfig, run_evaluation
    from training.evaluate import (
        ProtocolMismatch,
        compare,
        compare_evaluations,
        find_evaluation,
    )
    from training.ranker import RankerTrainable
    from training.stats import mcnemar_exact
    from warehouse.tasks import put_tasks

    put_tasks(wh, generate(60, seed=0))
    ckpt = tmp_path / "untrained"
    RankerTrainable.new(seed=0).save(ckpt)

    async def evaluate(checkpoint: str | None = None, **kw):
        rollout = {"split": "test", "n_tasks": 3, "max_steps": 4, "concurrency": 3, **kw}
        cfg = config_from_mapping(EvalConfig, {"checkpoint": checkpoint, "rollout": rollout})
        return await run_evaluation(wh, cfg, server=server, browser=chromium.browser)

    ranker = chromium.run(evaluate(policy="ranker", checkpoint=str(ckpt)))
    expert = chromium.run(evaluate(policy="expert", max_steps=30))
    assert ranker.summary.n + sum(ranker.summary.excluded.values()) == 3
    assert expert.summary.n == 3 and expert.summary.n_success == 3
    assert expert.summary.ci_low == pytest.approx(0.4385, abs=1e-3)  # Wilson, 3 of 3
    sites = {r["site"] for r in expert.summary.by_site}
    assert sites and sites <= {"shop", "wiki", "mail"}
    stored = find_evaluation(wh, ranker.evaluation_id)
    assert stored["policy"] == "ranker" and stored["checkpoint_id"] is None
    c = compare(stored, find_evaluation(wh, expert.evaluation_id))
    assert c["diff"] == pytest.approx(1 - ranker.evaluation.success_rate)
    # the same 3 tasks (a seeded selection): paired, over the tasks both scored
    # the ranker ran 4 steps a11y-only, the expert 30 with screenshots: different protocols,
    # refused unless forced
    exp_row = find_evaluation(wh, expert.evaluation_id)
    with pytest.raises(ProtocolMismatch, match=r"max_steps: 4 vs 30"):
        compare_evaluations(wh, stored, exp_row)
    refused = webloop(wh.cfg.home, "eval", "compare", ranker.evaluation_id, expert.evaluation_id,
                      ok=False)  # fmt: skip
    assert refused.returncode == 2 and "different protocols" in refused.stderr
    # the same 3 tasks (a seeded selection): paired, over the tasks both scored
    paired = compare_evaluations(wh, stored, exp_row, force=True)
    assert {"max_steps", "prompt_mode"} <= set(paired["protocol_differs"])
    assert paired["method"] == "paired" and paired["n_pairs"] == ranker.summary.n
    assert paired["a_only"] == 0 and paired["b_only"] == ranker.summary.n - ranker.summary.n_success
    assert paired["mcnemar_p"] == mcnemar_exact(0, paired["b_only"])
    assert paired["ci_low"] <= paired["diff"] <= paired["ci_high"]
    out = webloop(wh.cfg.home, "eval", "compare", "--force", ranker.evaluation_id,
                  expert.evaluation_id).stdout  # fmt: skip
    assert "forced: the protocols differ (" in out and f"paired on {paired['n_pairs']} tasks" in out
    assert "cluster bootstrap" in out and "McNemar exact p = " in out
    # the expert again on other tasks (the same protocol): unpaired, and it says why
    two = chromium.run(evaluate(policy="expert", max_steps=30, n_tasks=2))
    other = compare_evaluations(wh, exp_row, find_evaluation(wh, two.evaluation_id))
    assert other["method"] == "unpaired" and other["protocol_differs"] == {}
    assert "different tasks (1 only in A" in other["unpaired_because"]
    out = webloop(wh.cfg.home, "eval", "compare", expert.evaluation_id, two.evaluation_id).stdout
    assert "unpaired (the evaluations ran different tasks" in out and "Newcombe" in out
    # asked to, it pairs on the tasks both ran (the 2 are the first of the same seeded order)
    common = compare_evaluations(
        wh, exp_row, find_evaluation(wh, two.evaluation_id), common_tasks=True
    )
    assert common["method"] == "paired" and common["n_pairs"] == 2
    assert common["tasks_left_out"] == 1 and common["diff"] == 0.0
    out = webloop(wh.cfg.home, "eval", "compare", "--common-tasks", expert.evaluation_id,
                  two.evaluation_id).stdout  # fmt: skip
    assert "paired on 2 tasks" in out and "1 task(s) run by one only, left out" in out
    # the untrained ranker runs text-only: no screenshot was captured
    shots = wh.sql(
        "SELECT count(*) FROM steps JOIN trajectories USING (traj_id) "
        "WHERE run_id = ? AND screenshot_hash IS NOT NULL",
        [ranker.run_id],
    ).item()
    assert shots == 0
    # an evaluation stops episodes that repeat an action on an unchanged page (the untrained
    # ranker scrolls): the collect run records the setting, and such episodes end early
    config = wh.sql("SELECT config FROM runs WHERE run_id = ?", [ranker.run_id]).item()
    assert json.loads(config)["engine"] == {"max_repeats": 3}
    ended = wh.sql(
        "SELECT meta->>'ended_by' AS e, n_steps FROM trajectories WHERE run_id = ?",
        [ranker.run_id],
    ).rows()
    assert all(n < 4 for e, n in ended if e == "repeated action"), ended


@pytest.mark.browser
def test_a_judged_evaluation_records_its_judge_and_leaves_what_it_could_not_decide_out(
    server, chromium, wh: Warehouse
):
    """``eval --judge rubric_vlm``: the same rollouts, decided by a rubric judge over a local
    OpenAI-protocol server (a stand-in for a paid judge model: its verdicts are scripted per
    task). Another evaluation id, the judge recorded, a reply it cannot parse left out (never a
    failure), deltas only against evaluations of the same judge; a bad judge is refused before
    any rollout."""
    from sites.tasks import generate
    from stages.config import config_from_mapping
    from stages.evaluate import EvalConfig, evaluation_deltas, run_evaluation
    from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
    from warehouse.config import ConfigError
    from warehouse.relations import with_relations
    from warehouse.tasks import put_tasks

    put_tasks(wh, generate(60, seed=0))
    rollout = {"policy": "expert", "split": "test", "n_tasks": 3, "concurrency": 3, "seed": 7}

    def evaluate(judge: dict | None = None):
        data = {"rollout": rollout, **({"judge": judge} if judge else {})}
        cfg = config_from_mapping(EvalConfig, data)
        return chromium.run(run_evaluation(wh, cfg, server=server, browser=chromium.browser))

    own = evaluate()
    assert (own.summary.n, own.summary.n_success, own.evaluation.judge) == (3, 3, None)
    tasks = wh.sql(
        "SELECT k.instruction FROM trajectories t JOIN tasks k USING (task_id) "
        "WHERE t.run_id = ? ORDER BY k.instruction",
        [own.run_id],
    )["instruction"].to_list()
    verdict = {tasks[0]: "success", tasks[1]: "failure", tasks[2]: "garbage"}

    def model(body):
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. do what the task asks"
        said = next(v for t, v in verdict.items() if t in text)
        return "no verdict here" if said == "garbage" else json.dumps({"verdict": said})

    with FakeOpenAI([], default=("fn", model)) as fake:
        judge = {"judge": "rubric_vlm", "base_url": fake.url, "model": "judge-m"}
        judge["selection"] = "heuristic"
        judged = evaluate(judge)
        again = evaluate(judge)
    assert judged.run_id == own.run_id  # the same rollouts, not collected again
    assert judged.evaluation_id == again.evaluation_id != own.evaluation_id
    assert judged.evaluation.judge == "rubric_vlm" and judged.judged.judge == "rubric_vlm"
    s = judged.summary
    assert (s.n, s.n_success, s.excluded) == (2, 1, {"judge_error": 1})
    row = wh.sql(
        "SELECT judge, n, n_success FROM evaluations WHERE evaluation_id = ?",
        [judged.evaluation_id],
    ).row(0)
    assert row == ("rubric_vlm", 2, 1)
    assert evaluation_deltas(wh, judged) == ()  # the own-graded evaluation is not comparable
    assert [d["a"] for d in evaluation_deltas(wh, own)] == []
    # people label the two scored trajectories with the truth (the expert solved every task):
    # the judge's 1/2 is debiased by prediction-powered inference to 1/2 + mean(label − judge)
    from training.evaluate import record
    from warehouse.records import HumanLabel

    scored = wh.sql(
        with_relations(
            "SELECT traj_id FROM latest_judgments WHERE judge = 'rubric_vlm' "
            "AND verdict IN ('success', 'failure') ORDER BY traj_id"
        )
    )["traj_id"].to_list()
    # (a label from the disagreement-first queue is no random sample: not used)
    wh.write([HumanLabel("l-dis", scored[0], "failure", "tester", source="dashboard")])
    wh.write([HumanLabel(f"l{i}", t, "success", "tester", source="random-queue")
              for i, t in enumerate(scored)])  # fmt: skip
    cfg = config_from_mapping(EvalConfig, {"rollout": rollout, "judge": judge})
    identity = dataclasses.replace(cfg.judge, run=judged.run_id).identity()  # as the stage's
    ev, _ = record(wh, judged.run_id, suite="bundled", split="test", policy="expert",
                   checkpoint_id=None, judge="rubric_vlm", judge_identity=identity)  # fmt: skip
    assert ev.evaluation_id == judged.evaluation_id  # the same evaluation, its row replaced
    ppi = json.loads(wh.sql("SELECT breakdown FROM evaluations WHERE evaluation_id = ?",
                            [ev.evaluation_id]).item())["ppi"]  # fmt: skip
    # θ = mean([1, 0]) + mean([1 − 1, 1 − 0]) = 1; se² = ½/2 + ½/2: the interval is [0, 1]
    assert ppi == {"rate": 1.0, "ci_low": 0.0, "ci_high": 1.0, "n": 2, "n_labelled": 2,
                   "judge_rate": 0.5, "labelled_agreement": 0.5}  # fmt: skip
    n_runs = wh.sql("SELECT count(*) FROM runs").item()
    with pytest.raises(ConfigError, match="judge 'nope'"):
        evaluate({"judge": "nope"})
    assert wh.sql("SELECT count(*) FROM runs").item() == n_runs  # refused before any rollout


@pytest.mark.browser
def test_an_imported_suite_is_evaluated_by_its_judge(server, chromium, wh: Warehouse):
    """A suite with no checker (tasks as an import stores them: a plain web start URL, here a
    bundled site's, and a rubric) ends its episodes ``finished``: the rollouts' own grading has
    no outcome for them, the rubric judge (a local OpenAI-protocol stand-in, verdicts scripted)
    decides them."""
    from stages.config import config_from_mapping
    from stages.evaluate import EvalConfig, run_evaluation
    from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
    from warehouse.records import Task
    from warehouse.tasks import put_tasks

    shop = server.urls["shop"]
    put_tasks(
        wh,
        [
            Task(task_id=f"local/{i}", suite="local-rubric", split="test", site="shop",
                 instruction=text, start_url=f"{shop}/", rubric=["the page shows it"])
            for i, text in enumerate(["Find a kettle", "Find a mug"])
        ],
    )  # fmt: skip
    rollout = {"policy": "random", "suite": "local-rubric", "split": "test", "n_tasks": 2}
    rollout.update(max_steps=2, concurrency=2)

    def evaluate(judge: dict | None = None):
        data = {"rollout": rollout, **({"judge": judge} if judge else {})}
        cfg = config_from_mapping(EvalConfig, data)
        return chromium.run(run_evaluation(wh, cfg, server=server, browser=chromium.browser))

    own = evaluate()
    assert own.summary.n == 0 and sum(own.summary.excluded.values()) == 2  # no outcome

    def model(body):
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. the page shows it"
        return json.dumps({"verdict": "success" if "kettle" in text else "failure"})

    with FakeOpenAI([], default=("fn", model)) as fake:
        judged = evaluate({"judge": "rubric_vlm", "base_url": fake.url, "model": "j"})
    assert judged.run_id == own.run_id and judged.evaluation.suite == "local-rubric"
    assert (judged.summary.n, judged.summary.n_success) == (2, 1)


@pytest.mark.prefect
def test_two_processes_train_the_tiny_vlm_and_every_tracker_gets_the_warehouse_s_curve(
    home: Path, dataset: str, monkeypatch
):
    """``--num-processes 2`` (DDP over gloo): rank 0's steps and checkpoints land in the
    warehouse once each; ``--report-to all`` writes the same scalars and the run's lineage to
    TensorBoard, MLflow (a local SQLite store) and W&B (offline), each read back with its own
    reader. No network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["train", "sft", "--dataset", dataset, "--model", "tiny", "--max-steps", "3"]
    args += ["--batch-size", "3", "--lr", "0.001", "--save-every", "2", "--seed", "7"]
    out = webloop(home, *args, "--num-processes", "2", "--report-to", "all").stdout
    rid = run_id_of(out)
    curve = metrics(home, rid)
    assert [s for s, _ in curve] == [1, 2, 3]
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        steps = wh.sql(
            "SELECT step FROM checkpoints WHERE training_run_id = ? ORDER BY step", [rid]
        ).rows()
        dataset_id = wh.sql(
            "SELECT dataset_id FROM training_runs WHERE training_run_id = ?", [rid]
        ).item()
    assert [s for (s,) in steps] == [2, 3]
    state = json.loads(
        (home / "checkpoints" / rid / "checkpoint-3" / "trainer_state.json").read_text()
    )
    assert state["parallel"]["world_size"] == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(home / "trackers" / "tensorboard" / rid))
    events.Reload()
    tb = [(e.step, e.value) for e in events.Scalars("loss")]
    assert [s for s, _ in tb] == [1, 2, 3]
    assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(tb, curve, strict=True))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'trackers' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("webloop")
    (run,) = client.search_runs([exp.experiment_id], f"tags.`webloop.training_run_id` = '{rid}'")
    assert run.info.status == "FINISHED"
    assert run.data.tags["dataset_id"] == dataset_id and run.data.params["lr"] == "0.001"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, round(m.value, 5)) for m in history] == [(s, round(v, 5)) for s, v in curve]

    (folder,) = (home / "trackers" / "wandb").glob(f"offline-run-*-{rid.lower()}")
    (log,) = folder.glob("*.wandb")
    assert b"loss" in log.read_bytes() and dataset_id.encode() in log.read_bytes()
