"""One run's trajectories under several named evaluation protocols, side by side.

``webloop judge --protocol NAME --run RUN`` re-judges stored trajectories under a protocol
(:mod:`judging.protocols`); :func:`compare_protocols` then reads the verdicts each protocol
gave (only judgments made under its current hash: one made under an earlier version of a
protocol, or without one, is not its verdict) and compares them where it is fair to: every
success rate is over the same trajectories (those every listed protocol judged), every
difference is paired (the exact McNemar test on the trajectories where two protocols
disagree, Cohen's kappa for agreement beyond chance), and agreement with the human labels is on
the labelled ones among them. The rows are stored (``protocol_comparisons``) for the dashboard's
Protocols page. Rates are never put in one column across protocols: each is labelled with its
protocol's name and hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from judging.agreement import binary_agreement, reference_outcomes
from judging.base import JUDGED_STATUSES
from judging.protocols import PROTOCOLS, EvalProtocol, get_protocol
from stages.config import ConfigError
from training.stats import mcnemar_exact, wilson
from warehouse import Warehouse
from warehouse.ids import make_id
from warehouse.listings import run_exists
from warehouse.records import ProtocolComparison
from warehouse.relations import with_relations


@dataclass(frozen=True)
class ProtocolColumn:
    """One protocol of the table: its verdicts on the run (traj_id → success)."""

    protocol: EvalProtocol
    model: str | None
    verdicts: dict[str, bool]


@dataclass
class ProtocolTable:
    """The side-by-side table: ``rows`` (stored), the trajectories of the run that a judge can
    take (``trajectories``), those every protocol judged (``common``), per protocol how many it
    judged, and judgments made under a protocol hash no registered protocol has now
    (``outdated``: hash → count; re-judge them with ``--protocol``)."""

    run_id: str
    columns: list[ProtocolColumn]
    trajectories: int
    common: list[str]
    rows: list[ProtocolComparison] = field(default_factory=list)
    outdated: dict[str, int] = field(default_factory=dict)

    def own(self) -> list[ProtocolComparison]:
        return [r for r in self.rows if r.other is None]

    def pairs(self) -> list[ProtocolComparison]:
        return [r for r in self.rows if r.other not in (None, "human")]

    def human(self) -> list[ProtocolComparison]:
        return [r for r in self.rows if r.other == "human"]


def protocol_names(text: str | None, wh: Warehouse, run_id: str) -> list[str]:
    """The protocols to compare: ``text`` (comma-separated), else every registered protocol
    with verdicts on the run. Unknown names are a :class:`ConfigError`."""
    if text:
        names = [n.strip() for n in text.split(",") if n.strip()]
        for n in names:
            try:
                get_protocol(n)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return list(dict.fromkeys(names))
    used = set(
        wh.sql(
            "SELECT DISTINCT j.protocol FROM judgments j JOIN trajectories t USING (traj_id) "
            "WHERE t.run_id = $run AND j.protocol IS NOT NULL",
            {"run": run_id},
        )["protocol"].to_list()
    )
    return [p.name for p in PROTOCOLS.values() if p.hash in used]


def _column(wh: Warehouse, run_id: str, p: EvalProtocol, model: str | None) -> ProtocolColumn:
    df = wh.sql(  # the protocol's latest judgment per trajectory and judge model
        with_relations(
            "SELECT j.traj_id, j.model, j.verdict FROM latest_protocol_judgments j "
            "JOIN trajectories t USING (traj_id) WHERE t.run_id = $run AND j.protocol = $hash "
            "AND j.error IS NULL AND j.verdict IN ('success', 'failure')"
        ),
        {"run": run_id, "hash": p.hash},
    )
    models = sorted({m for m in df["model"].to_list() if m is not None})
    if model is not None and "endpoint" in p.needs:
        df = df.filter(df["model"] == model)
    elif len(models) > 1:
        raise ConfigError(
            f"protocol {p.name} judged run {run_id} with several models ({', '.join(models)}): "
            "pick one with --model"
        )
    picked = model if model is not None and "endpoint" in p.needs else (models or [None])[0]
    verdicts = {t: v == "success" for t, v in zip(df["traj_id"], df["verdict"], strict=True)}
    return ProtocolColumn(p, picked, verdicts)


def _pair_row(
    run_id: str, a: ProtocolColumn, other: str, b: dict[str, bool], ids: list[str]
) -> ProtocolComparison:
    """``a``'s verdicts against ``b`` (another protocol's, or the human labels) on ``ids``."""
    pa, pb = [a.verdicts[t] for t in ids], [b[t] for t in ids]
    agreement = binary_agreement(pa, pb)
    only_a = sum(x and not y for x, y in zip(pa, pb, strict=True))
    only_b = sum(y and not x for x, y in zip(pa, pb, strict=True))
    p = a.protocol
    return ProtocolComparison(
        comparison_id=make_id("protocol-comparison", run_id, p.hash, a.model, other),
        run_id=run_id,
        protocol=p.name,
        protocol_hash=p.hash,
        n=len(ids),
        successes=sum(pa),
        other=other,
        model=a.model,
        rate=sum(pa) / len(ids) if ids else None,
        other_successes=sum(pb),
        agree=len(ids) - only_a - only_b,
        only_this=only_a,
        only_other=only_b,
        kappa=agreement.kappa,
        mcnemar_p=mcnemar_exact(only_a, only_b),
    )


def _own_row(run_id: str, c: ProtocolColumn, ids: list[str]) -> ProtocolComparison:
    k = sum(c.verdicts[t] for t in ids)
    low, high = wilson(k, len(ids))
    return ProtocolComparison(
        comparison_id=make_id("protocol-comparison", run_id, c.protocol.hash, c.model, None),
        run_id=run_id,
        protocol=c.protocol.name,
        protocol_hash=c.protocol.hash,
        n=len(ids),
        successes=k,
        model=c.model,
        rate=k / len(ids) if ids else None,
        ci_low=low,
        ci_high=high,
    )


def compare_protocols(
    wh: Warehouse, run_id: str, names: list[str], model: str | None = None, store: bool = True
) -> ProtocolTable:
    """The table of ``names`` (at least two protocols) on run ``run_id``'s trajectories;
    stored unless ``store`` is false. ``model``: the judge model to read for protocols that
    prompt one (required when a protocol judged the run with several)."""
    if not run_exists(wh, run_id):
        raise ConfigError(f"no run {run_id!r} in the warehouse (`webloop runs` lists them)")
    if len(names) < 2:
        raise ConfigError(
            f"compare at least two protocols (got {', '.join(names) or 'none'}); judge the "
            "run under more with `webloop judge --protocol NAME --run RUN`"
        )
    runs = wh.sql(
        "SELECT count(*) AS n FROM trajectories WHERE run_id = $run AND "
        "list_contains($statuses, status)",
        {"run": run_id, "statuses": list(JUDGED_STATUSES)},
    )
    columns = [_column(wh, run_id, get_protocol(n), model) for n in names]
    common = sorted(set.intersection(*(set(c.verdicts) for c in columns)))
    table = ProtocolTable(run_id, columns, int(runs["n"][0]), common)
    table.outdated = _outdated(wh, run_id)
    if common:
        table.rows += [_own_row(run_id, c, common) for c in columns]
        for a, b in combinations(columns, 2):
            table.rows.append(_pair_row(run_id, a, b.protocol.name, b.verdicts, common))
        human = reference_outcomes(wh, "human")
        labelled = [t for t in common if t in human]
        if labelled:
            table.rows += [_pair_row(run_id, c, "human", human, labelled) for c in columns]
    if store:  # the run's comparison replaces its earlier one (no rows of another set linger)
        wh.replace_where(ProtocolComparison, "run_id", run_id, table.rows)
    return table


def _outdated(wh: Warehouse, run_id: str) -> dict[str, int]:
    df = wh.sql(
        "SELECT j.protocol, count(*) AS n FROM judgments j JOIN trajectories t USING (traj_id) "
        "WHERE t.run_id = $run AND j.protocol IS NOT NULL AND NOT list_contains($now, "
        "j.protocol) GROUP BY j.protocol ORDER BY j.protocol",
        {"run": run_id, "now": [p.hash for p in PROTOCOLS.values()]},
    )
    return dict(zip(df["protocol"].to_list(), df["n"].to_list(), strict=True))
