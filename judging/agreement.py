"""Judge calibration: how well a judge's success verdicts agree with a reference.

Pure functions over paired binary outcomes (success = True), plus the warehouse query that
pairs a judge's latest verdicts with a reference (human labels, the programmatic checker, or
another judge) per site. A judge's verdict on a trajectory is its latest judgment
(``latest_judgments`` of :mod:`warehouse.relations`, the judgment curation's ``verdict`` filter
reads too); when that is a judge error or an abstention, like a "not executable" label, the
trajectory is left out of the pairs, never counted as a failure. Sites are those of the task
version each trajectory ran (``trajectory_tasks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warehouse.relations import with_relations


@dataclass(frozen=True)
class BinaryAgreement:
    """Agreement of predictions with a reference on n paired outcomes."""

    n: int
    accuracy: float | None
    precision: float | None
    recall: float | None
    f1: float | None
    kappa: float | None
    judge_success_rate: float | None
    reference_success_rate: float | None

    @property
    def success_rate_gap(self) -> float | None:
        """Judge success rate minus reference success rate (positive: the judge is lenient)."""
        if self.judge_success_rate is None or self.reference_success_rate is None:
            return None
        return self.judge_success_rate - self.reference_success_rate


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def binary_agreement(pred: Sequence[bool], ref: Sequence[bool]) -> BinaryAgreement:
    """Accuracy, precision/recall/F1 on success, Cohen's kappa and success rates."""
    if len(pred) != len(ref):
        raise ValueError(f"{len(pred)} predictions but {len(ref)} reference outcomes")
    n = len(pred)
    tp = sum(p and r for p, r in zip(pred, ref, strict=True))
    tn = sum((not p) and (not r) for p, r in zip(pred, ref, strict=True))
    fp = sum(p and not r for p, r in zip(pred, ref, strict=True))
    fn = sum((not p) and r for p, r in zip(pred, ref, strict=True))
    precision, recall = _div(tp, tp + fp), _div(tp, tp + fn)
    f1 = (
        2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall
        else None
    )
    acc = _div(tp + tn, n)
    kappa = None
    if n:
        p_pred, p_ref = (tp + fp) / n, (tp + fn) / n
        expected = p_pred * p_ref + (1 - p_pred) * (1 - p_ref)
        kappa = (acc - expected) / (1 - expected) if expected < 1 else (1.0 if acc == 1 else 0.0)
    return BinaryAgreement(n, acc, precision, recall, f1, kappa, _div(tp + fp, n), _div(tp + fn, n))


def reference_outcomes(wh, reference: str) -> dict[str, bool]:
    """traj_id → success for a reference: ``human`` (latest label; 'not_executable' left out),
    or a judge name (its latest non-error success/failure verdict)."""
    if reference == "human":
        df = wh.sql(with_relations("SELECT traj_id, label FROM latest_human_labels"))
        return {t: lab == "success" for t, lab in df.iter_rows() if lab in ("success", "failure")}
    return judge_outcomes(wh, reference)


def judge_outcomes(wh, judge: str, version: str | None = None) -> dict[str, bool]:
    """traj_id → success for the trajectories whose latest judgment by ``judge`` (of
    ``version``, when given: the latest judgment of that version) is a success or a failure."""
    latest = "latest_judgments" if version is None else "latest_judgments_per_version"
    df = wh.sql(
        with_relations(
            f"SELECT traj_id, verdict FROM {latest} WHERE judge = $j "
            "AND ($v IS NULL OR judge_version = $v) AND error IS NULL "
            "AND verdict IN ('success', 'failure')"
        ),
        {"j": judge, "v": version},
    )
    return {t: v == "success" for t, v in df.iter_rows()}


def compute_agreements(wh, judge: str, reference: str, version: str | None = None):
    """Agreement of ``judge`` with ``reference`` overall and per site; stored and returned."""
    from warehouse.ids import make_id
    from warehouse.records import Agreement

    pred, ref = judge_outcomes(wh, judge, version), reference_outcomes(wh, reference)
    common = sorted(set(pred) & set(ref))
    sites = dict(wh.sql(with_relations("SELECT traj_id, site FROM trajectory_tasks")).iter_rows())
    groups: dict[str | None, list[str]] = {None: common}  # None: all sites together
    for tid in common:
        if sites.get(tid) is not None:  # live-web tasks without a site count in "all" only
            groups.setdefault(sites[tid], []).append(tid)
    rows = []
    for site, tids in groups.items():
        a = binary_agreement([pred[t] for t in tids], [ref[t] for t in tids])
        rows.append(
            Agreement(
                agreement_id=make_id("agreement", judge, version, reference, site),
                judge=judge,
                judge_version=version,
                reference=reference,
                site=site,
                n=a.n,
                accuracy=a.accuracy,
                precision=a.precision,
                recall=a.recall,
                f1=a.f1,
                kappa=a.kappa,
                judge_success_rate=a.judge_success_rate,
                reference_success_rate=a.reference_success_rate,
                success_rate_gap=a.success_rate_gap,
            )
        )
    wh.write(rows)
    return rows
