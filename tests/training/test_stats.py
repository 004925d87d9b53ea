"""Intervals against published values.

Wilson: Newcombe (1998a), "Two-sided confidence intervals for the single proportion", Stat. Med.
17:857-872, Table I (method 3): 0/10 -> (0, 0.2775); 5/10 -> (0.2366, 0.7634).
Difference: Newcombe (1998b), "Interval estimation for the difference between independent
proportions: comparison of eleven methods", Stat. Med. 17:873-890, Table II, method 10:
(a) 56/70 − 48/80 = 0.2000: (0.0524, 0.3339); (b) 9/10 − 3/10 = 0.6: (0.1705, 0.8090);
(c) 6/7 − 2/7 = 0.5714: (0.0582, 0.8062); (d) 5/56 − 0/29 = 0.0893: (−0.0381, 0.1926);
(e) 0/10 − 0/20 = 0: (−0.1611, 0.2775).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from training.stats import (
    breakdown,
    cluster_bootstrap,
    diff_interval,
    mcnemar_exact,
    ppi_mean,
    stratified_bootstrap,
    wilson,
)


def test_wilson_published_values():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="0 <= k <= n, got k=11, n=10"):
        wilson(11, 10)


@pytest.mark.parametrize(
    ("k1", "n1", "k2", "n2", "expected"),
    [
        (48, 80, 56, 70, (0.2000, 0.0524, 0.3339)),
        (3, 10, 9, 10, (0.6000, 0.1705, 0.8090)),
        (2, 7, 6, 7, (0.5714, 0.0582, 0.8062)),
        (0, 29, 5, 56, (0.0893, -0.0381, 0.1926)),
        (0, 20, 0, 10, (0.0, -0.1611, 0.2775)),
    ],
)
def test_newcombe_hybrid_score_table_ii(k1, n1, k2, n2, expected):
    # diff_interval is for p2 − p1: the paper's first proportion is our second sample
    # published to 4 decimals: allow one unit in the last place
    assert diff_interval(k1, n1, k2, n2) == pytest.approx(expected, abs=1e-4)


def test_diff_interval_is_antisymmetric_and_rejects_empty_samples():
    d, lo, hi = diff_interval(56, 70, 48, 80)
    assert (d, lo, hi) == pytest.approx((-0.2, -0.3339, -0.0524), abs=5e-5)
    with pytest.raises(ValueError, match="n1=0"):
        diff_interval(0, 0, 1, 2)


def test_breakdown_per_group():
    frame = pl.DataFrame(
        {
            "site": ["shop"] * 10 + ["mail"] * 4,
            "split": ["test"] * 14,
            "success": [True] * 5 + [False] * 5 + [False] * 4,
        }
    )
    out = breakdown(frame, ["site", "split"])
    assert out.columns == ["site", "split", "n", "n_success", "rate", "ci_low", "ci_high"]
    assert out["site"].to_list() == ["mail", "shop"]
    assert out["n"].to_list() == [4, 10] and out["n_success"].to_list() == [0, 5]
    assert out["rate"].to_list() == [0.0, 0.5]
    assert out["ci_low"][1] == pytest.approx(0.2366, abs=5e-5)
    assert out["ci_high"].to_list() == pytest.approx([wilson(0, 4)[1], 0.7634], abs=5e-5)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['difficulty'\]"):
        breakdown(frame, ["difficulty"])
    with pytest.raises(ValueError, match="null value"):
        breakdown(frame.with_columns(pl.lit(None, pl.Boolean).alias("success")), ["site"])


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (5, 2, 58 / 128),  # 2 · (C(7,0) + C(7,1) + C(7,2)) / 2^7 = 2 · 29/128
        (2, 5, 58 / 128),  # symmetric
        (0, 6, 2 / 64),  # 2 · 1/2^6
        (3, 3, 1.0),  # 2 · 42/64 > 1: capped
        (0, 0, 1.0),  # no discordant pair: no evidence
        (10, 0, 2 / 1024),
    ],
)
def test_mcnemar_exact_against_hand_computed_binomial_tails(b, c, p):
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=1e-12)


def test_cluster_bootstrap_against_the_enumerable_case_and_wider_for_moving_clusters():
    # two pairs, each its own cluster: the bootstrap means are 0, 1/2, 1 with probabilities
    # 1/4, 1/2, 1/4, so the 2.5% and 97.5% percentiles are 0 and 1
    assert cluster_bootstrap([1.0, 0.0], ["a", "b"], n_boot=4000) == (0.0, 1.0)
    assert cluster_bootstrap([0.25] * 5, list("abcde")) == (0.25, 0.25)
    # 40 differences: +1 on 12 tasks, 0 elsewhere. Spread over 40 templates, vs the same +1s
    # all in 3 templates of 4 (the templates move together): the clustered interval is wider
    values = [1.0] * 12 + [0.0] * 28
    alone = cluster_bootstrap(values, [f"t{i}" for i in range(40)])
    together = cluster_bootstrap(values, [f"t{i // 4}" for i in range(40)])
    assert alone[0] < 0.3 < alone[1] and together[0] < 0.3 < together[1]
    assert together[1] - together[0] > 1.3 * (alone[1] - alone[0])
    # deterministic for a seed
    assert cluster_bootstrap(values, list(map(str, range(40))), seed=3) == cluster_bootstrap(
        values, list(map(str, range(40))), seed=3
    )
    with pytest.raises(ValueError, match="as many clusters as values"):
        cluster_bootstrap([1.0], ["a", "b"])


def test_stratified_bootstrap_keeps_templates_fixed_and_is_narrower_than_the_clustered():
    # a template whose tasks all agree contributes no variance: every draw keeps it whole
    assert stratified_bootstrap([1.0, 1.0, 0.0, 0.0], list("aabb")) == (0.5, 0.5)
    # one stratum of two tasks (+1, 0): means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
    assert stratified_bootstrap([1.0, 0.0], ["a", "a"], n_boot=4000) == (0.0, 1.0)
    # a gain concentrated in 3 of 10 templates: the clustered interval reaches 0, the
    # within-template one (templates fixed, tasks the sample) does not
    values = [1.0] * 3 + [0.0] * 7 + [1.0] * 3 + [0.0] * 7 + [1.0] * 3 + [0.0] * 7 + [0.0] * 70
    templates = [f"t{i // 10}" for i in range(100)]
    within = stratified_bootstrap(values, templates)
    clustered = cluster_bootstrap(values, templates)
    assert within[0] > 0.0 and clustered[0] <= 0.0 + 1e-12
    assert within[0] < 0.09 < within[1]
    assert stratified_bootstrap(values, templates, seed=2) == stratified_bootstrap(
        values, templates, seed=2
    )
    with pytest.raises(ValueError, match="as many strata as values"):
        stratified_bootstrap([1.0], ["a", "b"])


def test_ppi_mean_against_its_closed_form():
    # judge on N = 4: mean 3/4, sample variance 1/4; on n = 3 labelled: judge [1, 0, 1] vs
    # labels [0, 0, 1]: rectifier [-1, 0, 0], mean -1/3, sample variance 1/3
    theta, lo, hi = ppi_mean([1, 1, 0, 1], [1, 0, 1], [0, 0, 1])
    se = math.sqrt(0.25 / 4 + (1 / 3) / 3)
    assert theta == pytest.approx(0.75 - 1 / 3)
    assert theta - 1.96 * se < 0 < theta + 1.96 * se - 1  # both ends clipped to [0, 1]
    assert (lo, hi) == (0.0, 1.0)
    theta, lo, hi = ppi_mean([1, 1, 0, 1] * 25, [1, 0, 1] * 10, [0, 0, 1] * 10)
    se = math.sqrt(np.var([1, 1, 0, 1] * 25, ddof=1) / 100 + np.var([-1, 0, 0] * 10, ddof=1) / 30)
    assert (lo, hi) == pytest.approx((theta - 1.96 * se, theta + 1.96 * se))
    with pytest.raises(ValueError, match="2 judged labelled verdicts but 3 labels"):
        ppi_mean([1, 0], [1, 0], [1, 0, 1])


def test_ppi_covers_the_truth_where_a_biased_judge_alone_does_not():
    """600 trajectories whose true outcomes are known (success rate ~0.4); a judge biased
    towards success (it passes 35% of the failures); 100 of them labelled at random. Over 200
    seeded repeats the prediction-powered interval covers the true rate of the 600 in >= 90%,
    the judge's own Wilson interval almost never."""
    rng = np.random.default_rng(0)
    covered = judge_covered = 0
    for _ in range(200):
        truth = (rng.random(600) < 0.4).astype(float)
        judge = np.where(truth == 1, rng.random(600) < 0.95, rng.random(600) < 0.35).astype(float)
        picked = rng.choice(600, size=100, replace=False)
        _, lo, hi = ppi_mean(judge, judge[picked], truth[picked])
        covered += lo <= truth.mean() <= hi
        jl, jh = wilson(int(judge.sum()), 600)
        judge_covered += jl <= truth.mean() <= jh
    assert covered >= 180 and judge_covered <= 10, (covered, judge_covered)


def test_an_evaluation_s_interval_resamples_templates_whole():
    """20 tasks of 2 templates, one solved throughout, one failed throughout: Wilson (tasks as
    independent) says [0.30, 0.70]; resampling the two templates says [0, 1], as it should."""
    from training.evaluate import summarize

    frame = pl.DataFrame(
        {
            "task_id": [f"t{i}" for i in range(20)],
            "site": ["shop"] * 20,
            "difficulty": [1] * 20,
            "template": ["buy"] * 10 + ["search"] * 10,
            "status": ["success"] * 10 + ["failure"] * 10,
            "success": [1] * 10 + [0] * 10,
        }
    )
    s = summarize(frame)
    assert (s.n, s.n_success) == (20, 10) and s.ci_low == pytest.approx(0.299, abs=1e-3)
    assert s.clustered == {"ci_low": 0.0, "ci_high": 1.0, "clusters": 2}
    # resampling tasks within each template keeps both: every draw is 10 of 20 (no spread)
    assert s.within == {"ci_low": 0.5, "ci_high": 0.5, "templates": 2}
    one = summarize(frame.with_columns(pl.lit("one").alias("template")))
    assert one.clustered is None and one.within is None
