"""``webloop components``: the registered judges, evaluation protocols, PRM scorers and
advantage estimators, each with what it needs and its one-line summary (the built-in ones and
those of ``WEBLOOP_PLUGINS``' modules)."""

from __future__ import annotations

from typing import Any

import typer

from cli.common import Format, FormatOption, print_frame


def component_rows() -> list[dict[str, Any]]:
    """One row per registered judge, evaluation protocol, PRM scorer and estimator: kind,
    name, what it needs, its options (judges and estimators: every option, with its default;
    protocols: the judge and the options it fixes, its hash and the published protocol it
    follows), the hash of the prompts it asks a model with (none: it prompts no model), its
    summary."""
    from judging.base import SPECS as JUDGES
    from judging.prm import SPECS as SCORERS
    from judging.protocols import PROTOCOLS
    from training.advantages import SPECS as ESTIMATORS

    rows = [
        {
            "kind": "judge",
            "name": name,
            "needs": ", ".join(sorted(s.needs)),
            "options": _options(s.parameters),
            "prompts": s.prompts or "",
            "summary": s.summary,
        }
        for name, s in sorted(JUDGES.items())
    ]
    rows += [
        {
            "kind": "evaluation protocol",
            "name": f"{name} ({p.hash})",
            "needs": ", ".join(sorted(p.needs)),
            "options": ", ".join([p.judge, *(f"{k}={v!r}" for k, v in p.options.items())]),
            "prompts": p.prompts or "",
            "summary": f"{p.summary} Follows {p.follows}.",
        }
        for name, p in sorted(PROTOCOLS.items())
    ]
    rows += [
        {
            "kind": "advantage estimator",
            "name": name,
            "needs": f"level {s.level}, objective {s.objective}"
            + "".join(f", engine {flag}" for flag in s.engine),
            "options": _options(s.options),
            "prompts": "",
            "summary": s.summary,
        }
        for name, s in sorted(ESTIMATORS.items())
    ]
    rows += [
        {
            "kind": "PRM scorer",
            "name": name,
            "needs": ", ".join(sorted(s.needs))
            + (", expert candidate" if s.expert_candidate else ""),
            "options": "",
            "prompts": s.prompts or "",
            "summary": s.summary,
        }
        for name, s in sorted(SCORERS.items())
    ]
    return rows


def _options(params: dict[str, Any]) -> str:
    """``base_url, model, k=4, …``: required options by name, the others with their default."""
    from inspect import Parameter

    return ", ".join(k if v is Parameter.empty else f"{k}={v!r}" for k, v in params.items())


def components(fmt: FormatOption = Format.table) -> None:
    """The registered judges, evaluation protocols, PRM scorers and advantage estimators: what
    each needs, its options, its summary (yours too: name their modules in WEBLOOP_PLUGINS)."""
    from warehouse.frames import rows_frame

    print_frame(rows_frame(component_rows(), text=True), fmt)


def register(app: typer.Typer) -> None:
    """Add ``webloop components`` to the app."""
    app.command("components")(components)
