"""``webloop eval protocols RUN``: one run's trajectories under several named evaluation
protocols, side by side (:mod:`stages.protocols`), with their paired agreement with each other
and with the human labels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cli.common import _open, console

if TYPE_CHECKING:
    from stages.protocols import ProtocolTable


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _kappa(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _agreement(r) -> str:
    """The share of a pair row's trajectories on which both sides agree."""
    return _pct(r.agree / r.n if r.n else None)


def print_table(table: ProtocolTable) -> None:
    """The stored rows of a :class:`stages.protocols.ProtocolTable`, as three tables."""
    judged = {c.protocol.name: len(c.verdicts) for c in table.columns}
    console.print(
        f"run {table.run_id}: {table.trajectories} judgeable trajectories; "
        + ", ".join(f"{n} judged {k}" for n, k in judged.items())
        + f"; {len(table.common)} judged under every protocol"
    )
    if not table.common:
        missing = [n for n, k in judged.items() if k == 0] or list(judged)
        console.print(
            "no trajectory has a verdict under every protocol: judge the run under "
            + ", ".join(missing)
            + f" first (`webloop judge --protocol NAME --run {table.run_id}`, with --base-url "
            "and --model for a model judge)"
        )
    for h, n in table.outdated.items():
        console.print(
            f"{n} judgments were made under protocol hash {h}, no current protocol's (an earlier "
            "version): they are not counted; re-judge with --protocol"
        )
    if not table.common:
        return
    own = Table(title="Success under each protocol (the same trajectories)")
    for col in ("protocol", "hash", "judge model", "success", "95% interval"):
        own.add_column(col)
    for r in table.own():
        own.add_row(
            r.protocol,
            r.protocol_hash,
            r.model or "-",
            f"{r.successes}/{r.n} ({_pct(r.rate)})",
            f"[{_pct(r.ci_low)}, {_pct(r.ci_high)}]",
        )
    console.print(own)
    pairs = Table(title="Paired agreement between protocols")
    for col in ("A", "B", "n", "agree", "A only", "B only", "kappa", "McNemar p"):
        pairs.add_column(col)
    for r in table.pairs():
        pairs.add_row(
            r.protocol,
            r.other,
            str(r.n),
            f"{r.agree} ({_agreement(r)})",
            str(r.only_this),
            str(r.only_other),
            _kappa(r.kappa),
            f"{r.mcnemar_p:.3g}",
        )
    console.print(pairs)
    human = table.human()
    if human:
        ht = Table(title="Agreement with the human labels (labelled trajectories among them)")
        for col in ("protocol", "n", "accuracy", "kappa", "protocol success", "human success"):
            ht.add_column(col)
        for r in human:
            ht.add_row(
                r.protocol,
                str(r.n),
                _agreement(r),
                _kappa(r.kappa),
                f"{r.successes}/{r.n}",
                f"{r.other_successes}/{r.n}",
            )
        console.print(ht)
    else:
        console.print("no human labels on these trajectories: no agreement with people to show")
    console.print(
        "Each rate belongs to its protocol (name and hash): rates of different protocols are "
        "compared only as above, paired on the same trajectories."
    )


def register(eval_app: typer.Typer) -> None:
    """Add ``eval protocols`` to the ``eval`` group."""

    @eval_app.command("protocols")
    def eval_protocols(
        run: Annotated[str, typer.Argument(help="The run whose trajectories to compare.")],
        protocols: Annotated[
            str | None,
            typer.Option(
                help="Protocols to compare, comma-separated (default: every protocol with "
                "verdicts on the run)."
            ),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(help="The judge model to read, where a protocol used several."),
        ] = None,
    ) -> None:
        """Success of one run's trajectories under each named evaluation protocol, side by
        side, with their paired agreement (each other, human labels); stored for the
        dashboard's Protocols page."""
        from stages.protocols import compare_protocols, protocol_names

        with _open() as wh:
            names = protocol_names(protocols, wh, run)
            table = compare_protocols(wh, run, names, model)
        print_table(table)
