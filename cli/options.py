"""CLI options derived from the stage configs (:mod:`stages.config`): one declaration per setting.

:func:`config_command` registers a Typer command whose options are the fields of a config class:
the flag (``--max-steps``, or the field's own ``flag``), the help text, the bounds of a number,
``Literal`` choices, ``--x/--no-x`` for booleans, a repeatable option for a tuple. Every such
command also takes ``--config FILE.yaml``: the file's settings first, then the options given on
the command line (only those: an option left at its default does not override the file).

Typer builds commands from function signatures; the command here is a function whose
``__signature__`` is made from the config's fields, so Typer (and its help, completion and
errors) sees ordinary options. Fields marked ``cli=False`` (mappings, task lists) come only from
a config file or a library caller.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from stages.config import ConfigError, check_config, fields_of, is_config, load_config

CONFIG_HELP = "A YAML file of this command's settings (options given here override it)."

#: Every command made by :func:`config_command`: its path (``("train", "rl")``) → config class.
REGISTERED: dict[tuple[str, ...], type] = {}


def run_body(body: Callable[..., Any], cfg: Any, **extra: Any) -> Any:
    """Run a config command's body with its config (one place: tests read the config here)."""
    return body(cfg, **extra)


def _option_type(tp: Any) -> Any:
    """The type Typer parses for a field of type ``tp`` (a tuple is a repeatable option)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        return list[args[0]] | None
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and typing.get_origin(inner[0]) is tuple:
            return list[typing.get_args(inner[0])[0]] | None
    return tp


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def config_parameters(
    cls: type, callbacks: dict[str, Callable[..., Any]] | None = None
) -> list[inspect.Parameter]:
    """Keyword-only parameters, one per CLI field of ``cls`` (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in fields_of(cls):
        tp = hints[f.name]
        if not f.metadata.get("cli", True) or is_config(tp):
            continue
        flag = _flag(f)
        decls = [flag]
        if tp in (bool, bool | None):  # --x / --no-x (a file's True can be turned off)
            decls = [f"{flag}/--no-{flag.removeprefix('--')}"]
        option = typer.Option(
            *decls,
            help=f.metadata.get("help", ""),
            min=f.metadata.get("min"),
            max=f.metadata.get("max"),
            callback=(callbacks or {}).get(f.name),
        )
        default = None if f.default is dataclasses.MISSING else f.default
        if isinstance(default, tuple):
            default = None  # a repeatable option: none given
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[_option_type(tp), option],
            )
        )
    return params


def build_config(cls: type, ctx: typer.Context, path: Path | None, values: dict[str, Any]) -> Any:
    """``cls`` from the YAML file at ``path`` (else the defaults), then the options the command
    line gave (:class:`ConfigError` for a bad value, naming the option)."""
    hints = typing.get_type_hints(cls)
    given: dict[str, Any] = {}
    for name, value in values.items():
        source = ctx.get_parameter_source(name)
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        given[name] = _field_value(hints[name], value)
    if path is not None:
        cfg = dataclasses.replace(load_config(cls, path), **given)
    else:
        missing = [f for f in fields_of(cls) if _required(f) and f.name not in given]
        if missing:
            flags = ", ".join(_flag(f) for f in missing)
            raise ConfigError(f"missing {flags} (or a --config file that sets it)")
        cfg = cls(**given)
    try:
        check_config(cfg)
    except ConfigError as exc:
        field = str(exc).split(":", 1)[0]
        flags = {f.name: _flag(f) for f in fields_of(cls)}
        raise ConfigError(f"{flags.get(field, field)}: {str(exc).split(': ', 1)[1]}") from None
    return cfg


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _field_value(tp: Any, value: Any) -> Any:
    """An option's value as the field holds it: a list as a tuple, an empty string for an
    optional text as None (``--split ''``: every split)."""
    if isinstance(value, list):
        return tuple(value)
    if value == "" and type(None) in typing.get_args(tp):
        return None
    return value


def config_command(
    app: typer.Typer,
    name: str,
    cls: type,
    body: Callable[..., Any],
    *,
    help: str | None = None,
    callbacks: dict[str, Callable[..., Any]] | None = None,
    extra: Sequence[inspect.Parameter] = (),
    group: bool = False,
) -> Callable[..., Any]:
    """Register command ``name`` whose options are ``cls``'s fields (plus ``--config`` and the
    ``extra`` parameters); ``body(cfg, **extra_values)`` runs it. ``group``: ``app`` is the
    command's own group (``webloop judge`` with subcommands ``judge agreement`` …): the options
    are the group's, and ``body`` runs when no subcommand is given."""
    fields = config_parameters(cls, callbacks)
    names = {p.name for p in fields}
    config_param = inspect.Parameter(
        "config",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)],
    )
    ctx_param = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
    )

    def command(ctx: typer.Context, **values: Any) -> Any:
        if getattr(ctx, "invoked_subcommand", None) is not None:
            return None
        path = values.pop("config", None)
        cfg = build_config(cls, ctx, path, {k: v for k, v in values.items() if k in names})
        return run_body(body, cfg, **{k: v for k, v in values.items() if k not in names})

    params = [ctx_param, config_param, *fields, *extra]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = help or (cls.__doc__ or "").split("\n\n")[0]
    command.__name__ = name.replace("-", "_")
    if group:
        app.callback(invoke_without_command=True)(command)
    else:
        app.command(name)(command)
    REGISTERED[(name,)] = cls
    return command
