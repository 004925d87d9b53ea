"""Prediction-powered success on real rollouts: a noisy expert's trajectories on bundled tasks,
whose programmatic outcomes are the truth (short templates, a mistake rate of 0.8 so that many
fail); a deliberately lenient judge (it passes most of the failures) decides them; people label
a uniformly random sample drawn by the dashboard's random queue. The judge alone misses the
truth; the debiased interval covers it in >= 90% of the queue's seeded draws, and the stored
evaluation's estimate is the one computed from its labels."""

from __future__ import annotations

import json
import random

import pytest

from dashboards.queries import RANDOM_QUEUE, label_queue, save_label
from sites.tasks import generate
from stages.collect import CollectConfig, run_collect
from training.evaluate import ppi_mean, record
from training.stats import wilson
from warehouse.records import Judgment
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]

N_TASKS = 30
N_LABELS = 15
DRAWS = 100


def lenient_verdicts(truth: dict[str, int], seed: int = 0) -> dict[str, int]:
    """Every success passed, and 80% of the failures too (a judge biased towards success)."""
    rng = random.Random(seed)
    return {t: 1 if ok or rng.random() < 0.8 else 0 for t, ok in sorted(truth.items())}


def test_ppi_on_real_rollouts_covers_the_truth_a_lenient_judge_misses(server, chromium, wh):
    short = ["mail_archive", "wiki_fact", "shop_product_fact", "wiki_on_page"]  # 1-3 steps
    put_tasks(wh, generate(400, seed=0, templates=short))
    cfg = CollectConfig(
        split="train", n_tasks=N_TASKS, policy="expert", noise=0.8, max_steps=6,
        concurrency=4, run_name="ppi-noisy",
    )  # fmt: skip
    res = chromium.run(run_collect(wh, cfg, server=server, browser=chromium.browser))
    rows = wh.sql("SELECT traj_id, status FROM trajectories WHERE run_id = ?", [res.run_id])
    truth = {t: int(s == "success") for t, s in rows.iter_rows() if s in ("success", "failure")}
    assert len(truth) >= 24 and 0.2 < sum(truth.values()) / len(truth) < 0.8, truth

    judged = lenient_verdicts(truth)
    wh.write([
        Judgment(f"j-{t}", t, "lenient", "1", verdict="success" if v else "failure",
                 run_id=res.run_id)
        for t, v in judged.items()
    ])  # fmt: skip
    rate = sum(truth.values()) / len(truth)
    jl, jh = wilson(sum(judged.values()), len(judged))
    assert not jl <= rate <= jh  # the judge alone is off

    ids = sorted(truth)
    covered = 0
    for seed in range(DRAWS):
        queue = label_queue(wh, limit=N_LABELS, order="random", seed=seed)
        picked = [t for t in queue["traj_id"].to_list() if t in truth]
        assert len(picked) == N_LABELS
        _, lo, hi = ppi_mean(
            [judged[t] for t in ids], [judged[t] for t in picked], [truth[t] for t in picked]
        )
        covered += lo <= rate <= hi
    assert covered >= 0.9 * DRAWS, covered
    draws = {
        tuple(label_queue(wh, limit=N_LABELS, order="random", seed=s)["traj_id"]) for s in (1, 2)
    }
    assert len(draws) == 2  # the seed draws another sample

    # the last draw, labelled with the truth from the random queue: the evaluation stores it
    for t in picked:
        save_label(wh, t, "success" if truth[t] else "failure", "tester", source=RANDOM_QUEUE)
    ev, _ = record(wh, res.run_id, suite="bundled", split="train", policy="expert",
                   checkpoint_id=None, judge="lenient")  # fmt: skip
    ppi = json.loads(wh.sql("SELECT breakdown FROM evaluations WHERE evaluation_id = ?",
                            [ev.evaluation_id]).item())["ppi"]  # fmt: skip
    theta, lo, hi = ppi_mean(
        [judged[t] for t in ids], [judged[t] for t in picked], [truth[t] for t in picked]
    )
    assert (ppi["rate"], ppi["ci_low"], ppi["ci_high"]) == pytest.approx((theta, lo, hi))
    assert (ppi["n"], ppi["n_labelled"]) == (len(ids), N_LABELS)
    assert ppi["judge_rate"] == pytest.approx(sum(judged.values()) / len(judged))
