"""Success rates with confidence intervals: Wilson score intervals, Newcombe's interval for a
difference of two independent proportions, and for two evaluations of the SAME tasks the paired
statistics (the exact McNemar test, a cluster bootstrap interval of the paired difference);
per-group breakdowns of a polars frame.

References: E. B. Wilson (1927), "Probable inference, the law of succession, and statistical
inference", JASA 22:209-212; R. G. Newcombe (1998), "Interval estimation for the difference
between independent proportions: comparison of eleven methods", Statistics in Medicine
17:873-890 (method 10, the hybrid score interval); Q. McNemar (1947), "Note on the sampling
error of the difference between correlated proportions or percentages", Psychometrika 12:153-157
(exact form: the binomial test on the discordant pairs); B. Efron and R. Tibshirani (1993), An
Introduction to the Bootstrap, ch. 13 (percentile intervals), resampling whole clusters
(tasks of one template succeed or fail together) as in A. C. Davison and D. V. Hinkley (1997),
Bootstrap Methods and their Application, §3.8 (and, templates fixed, resampling tasks within
each template: the stratified bootstrap of §3.7); A. N. Angelopoulos, S. Bates, C. Fannjiang,
M. I. Jordan and T. Zrnic (2023), "Prediction-powered inference", Science 382:669-674 (the
mean estimator with its rectifier: a judge's verdicts debiased by a random labelled subset).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl


def _check_counts(k: int, n: int, where: str) -> None:
    if int(k) != k or int(n) != n or n < 0 or not 0 <= k <= n:
        raise ValueError(f"{where}: need integers 0 <= k <= n, got k={k}, n={n}")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion ``k/n`` at normal quantile ``z`` (1.96: 95 %):

    ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``.

    ``n == 0`` carries no information and gives ``(0.0, 1.0)``."""
    _check_counts(k, n, "wilson")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    denom = 1 + z2 / n
    low = 0.0 if k == 0 else (centre - half) / denom
    high = 1.0 if k == n else (centre + half) / denom
    return low, high


def diff_interval(
    k1: int, n1: int, k2: int, n2: int, z: float = 1.96
) -> tuple[float, float, float]:
    """Newcombe's hybrid score interval (1998, method 10) for ``d = p2 − p1``:

    with Wilson intervals ``(l1, u1)`` of ``p1 = k1/n1`` and ``(l2, u2)`` of ``p2 = k2/n2``,
    ``low = d − sqrt((p2 − l2)² + (u1 − p1)²)``, ``high = d + sqrt((u2 − p2)² + (p1 − l1)²)``.

    Returns ``(d, low, high)``. Both samples need ``n ≥ 1``."""
    _check_counts(k1, n1, "diff_interval (sample 1)")
    _check_counts(k2, n2, "diff_interval (sample 2)")
    if n1 == 0 or n2 == 0:
        raise ValueError(f"diff_interval: both samples need n >= 1, got n1={n1}, n2={n2}")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return d, low, high


def breakdown(
    frame: pl.DataFrame, by: list[str], success: str = "success", z: float = 1.96
) -> pl.DataFrame:
    """Success per group: one row per distinct ``by`` value, sorted by ``by``, with columns
    ``n``, ``n_success``, ``rate`` and the Wilson interval ``ci_low``, ``ci_high``.

    ``success`` names a boolean (or 0/1) column; a null there is an error (an unjudged or
    infrastructure-failed row must be filtered out by the caller, not counted as a failure)."""
    missing = [c for c in [*by, success] if c not in frame.columns]
    if missing:
        raise ValueError(f"breakdown: missing column(s) {missing}; the frame has {frame.columns}")
    nulls = frame[success].null_count()
    if nulls:
        raise ValueError(f"breakdown: {nulls} null value(s) in success column {success!r}")
    values = frame[success].cast(pl.Int64)
    if values.len() and not values.is_in([0, 1]).all():
        raise ValueError(f"breakdown: success column {success!r} must be boolean or 0/1")
    grouped = (
        frame.with_columns(values.alias("__s"))
        .group_by(by)
        .agg(pl.len().alias("n"), pl.col("__s").sum().alias("n_success"))
        .sort(by)
        .with_columns(
            pl.col("n").cast(pl.Int64),
            pl.col("n_success").cast(pl.Int64),
            (pl.col("n_success") / pl.col("n")).alias("rate"),
        )
    )
    ci = [wilson(k, n, z) for k, n in zip(grouped["n_success"], grouped["n"], strict=True)]
    return grouped.with_columns(
        pl.Series("ci_low", [c[0] for c in ci], dtype=pl.Float64),
        pl.Series("ci_high", [c[1] for c in ci], dtype=pl.Float64),
    )


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes.

    ``b``: pairs where A succeeded and B failed; ``c``: A failed and B succeeded (the discordant
    pairs; concordant ones carry no information on the difference). Under "A and B succeed
    alike", ``b ~ Binomial(b + c, 1/2)``: ``p = min(1, 2 · P(X ≤ min(b, c)))``; no discordant
    pair gives 1."""
    _check_counts(b, b + c, "mcnemar_exact")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def cluster_bootstrap(
    values: Sequence[float],
    clusters: Sequence[str],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` (per-task paired differences, or 0/1
    outcomes) resampling whole clusters with replacement: each draw takes as many clusters as
    there are, and its mean is the sum of the drawn clusters' values over their count. With one
    value per cluster this is the ordinary bootstrap; values of one cluster (a task template)
    that move together widen the interval as they should. Deterministic for a ``seed``."""
    if len(values) != len(clusters) or not len(values):
        raise ValueError(
            f"cluster_bootstrap: need as many clusters as values (> 0), "
            f"got {len(values)} values and {len(clusters)} clusters"
        )
    names = sorted(set(clusters))
    index = {c: i for i, c in enumerate(names)}
    ids = np.array([index[c] for c in clusters])
    sums = np.bincount(ids, weights=np.asarray(values, dtype=float), minlength=len(names))
    counts = np.bincount(ids, minlength=len(names)).astype(float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(names), size=(n_boot, len(names)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def stratified_bootstrap(
    values: Sequence[float],
    strata: Sequence[str],
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` resampling WITHIN each stratum: every draw
    keeps each stratum (a task template) with its own count and resamples its values (the tasks)
    with replacement. The strata are then fixed, not a sample: the interval speaks of new tasks
    of these templates (the population a fixed task suite measures), and is narrower than
    :func:`cluster_bootstrap`'s, which speaks of new templates. Deterministic for a ``seed``."""
    if len(values) != len(strata) or not len(values):
        raise ValueError(
            f"stratified_bootstrap: need as many strata as values (> 0), "
            f"got {len(values)} values and {len(strata)} strata"
        )
    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    totals = np.zeros(n_boot)
    for name in sorted(set(strata)):
        group = v[[i for i, s in enumerate(strata) if s == name]]
        draws = rng.integers(0, len(group), size=(n_boot, len(group)))
        totals += group[draws].sum(1)
    means = totals / len(v)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def ppi_mean(
    judged: Sequence[float],
    judged_labelled: Sequence[float],
    labels: Sequence[float],
    z: float = 1.96,
) -> tuple[float, float, float]:
    """Prediction-powered estimate of a success rate and its interval.

    ``judged``: an automatic judge's verdicts (1/0) on the N trajectories to estimate over;
    ``judged_labelled`` and ``labels``: the judge's verdicts and the true outcomes (human labels)
    on a uniformly random subset of n of them. The judge's rate, corrected by its mean error on
    the labelled subset (the rectifier):

    ``θ = mean(judged) + mean(labels − judged_labelled)``,
    ``se² = var(judged) / N + var(labels − judged_labelled) / n`` (sample variances),
    interval ``θ ± z·se``, clipped to [0, 1]. Valid however biased the judge is, as long as the
    labelled subset is a random sample; it is narrower than the labels alone when the judge is
    good. Needs N ≥ 2 and n ≥ 2."""
    f, fl, y = (np.asarray(v, dtype=float) for v in (judged, judged_labelled, labels))
    if len(fl) != len(y):
        raise ValueError(f"ppi_mean: {len(fl)} judged labelled verdicts but {len(y)} labels")
    if len(f) < 2 or len(y) < 2:
        raise ValueError(f"ppi_mean: need N >= 2 and n >= 2, got N={len(f)}, n={len(y)}")
    rectifier = y - fl
    theta = float(f.mean() + rectifier.mean())
    se = math.sqrt(f.var(ddof=1) / len(f) + rectifier.var(ddof=1) / len(y))
    return theta, max(0.0, theta - z * se), min(1.0, theta + z * se)
