"""``webloop components``: the registered judges, PRM scorers and advantage estimators, each
with what it needs and its one-line summary (the built-in ones and those of
``WEBLOOP_PLUGINS``' modules)."""

from __future__ import annotations

from typing import Any

import typer

from cli.common import Format, FormatOption, print_frame


def component_rows() -> list[dict[str, Any]]:
    """One row per registered judge, PRM scorer and estimator: kind, name, what it needs, its
    options (judges: the config fields it takes; estimators: keyword options), its summary."""
    from judging.base import SPECS as JUDGES
    from judging.prm import SPECS as SCORERS
    from training.advantages import SPECS as ESTIMATORS

    rows = [
        {
            "kind": "judge",
            "name": name,
            "needs": ", ".join(sorted(s.needs)),
            "options": ", ".join(s.options),
            "summary": s.summary,
        }
        for name, s in sorted(JUDGES.items())
    ]
    rows += [
        {
            "kind": "advantage estimator",
            "name": name,
            "needs": f"level {s.level}, objective {s.objective}"
            + "".join(f", engine {flag}" for flag in s.engine),
            "options": ", ".join(f"{k}={v!r}" for k, v in s.options.items()),
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
            "summary": s.summary,
        }
        for name, s in sorted(SCORERS.items())
    ]
    return rows


def components(fmt: FormatOption = Format.table) -> None:
    """The registered judges, PRM scorers and advantage estimators: what each needs, its
    options, its summary (yours too: name their modules in WEBLOOP_PLUGINS)."""
    from warehouse.frames import rows_frame

    print_frame(rows_frame(component_rows(), text=True), fmt)


def register(app: typer.Typer) -> None:
    """Add ``webloop components`` to the app."""
    app.command("components")(components)
