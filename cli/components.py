"""``webloop components``: the registered judges, evaluation protocols, PRM scorers and
advantage estimators, each with what it needs and its one-line summary (the built-in ones and
those of ``WEBLOOP_PLUGINS``' modules)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.common import ConfigError, Format, FormatOption, print_frame


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


def option_rows(name: str) -> tuple[str, list[dict[str, str]]]:
    """A judge's or estimator's options: (its kind, one row per option: name, default, help —
    the ``:param`` entries of its docstring). ValueError naming the known ones otherwise."""
    from judging.base import SPECS as JUDGES
    from training.advantages import SPECS as ESTIMATORS
    from warehouse.registry import option_help

    if name in JUDGES:
        kind, fn, params = "judge", JUDGES[name].factory, JUDGES[name].parameters
    elif name in ESTIMATORS:
        kind, fn, params = "advantage estimator", ESTIMATORS[name].fn, ESTIMATORS[name].options
    else:
        known = sorted({*JUDGES, *ESTIMATORS})
        raise ValueError(f"no judge or advantage estimator {name!r}; known: {known}")
    helps = option_help(fn)
    rows = [
        {"option": k, "default": _options({k: v}).partition("=")[2] or "(required)",
         "help": helps.get(k, "")}
        for k, v in params.items()
    ]  # fmt: skip
    return kind, rows


def options_table(name: str) -> str:
    """A Markdown table of the options of the judge or estimator ``name`` (the docs' marker
    ``<!-- options: NAME -->``)."""
    _, rows = option_rows(name)
    lines = ["| option | default | what it does |", "|---|---|---|"]
    for r in rows:
        text = r["help"].replace("|", "\\|")
        default = f"`{r['default']}`" if r["default"] != "(required)" else "(required)"
        lines.append(f"| `{r['option']}` | {default} | {text} |")
    return "\n".join(lines)


def components(
    name: Annotated[
        str | None,
        typer.Argument(help="A judge or estimator: its options with their defaults and help."),
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """The registered judges, evaluation protocols, PRM scorers and advantage estimators: what
    each needs, its options, its summary (yours too: name their modules in WEBLOOP_PLUGINS);
    with a NAME, that judge's or estimator's options, their defaults and what they do."""
    from warehouse.frames import rows_frame

    if name is None:
        print_frame(rows_frame(component_rows(), text=True), fmt)
        return
    try:
        kind, rows = option_rows(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print_frame(rows_frame(rows, text=True), fmt, title=f"{kind} {name}: options")


def register(app: typer.Typer) -> None:
    """Add ``webloop components`` to the app."""
    app.command("components")(components)
