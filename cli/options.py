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

from stages.config import (
    ConfigError,
    check_config,
    default_of,
    fields_of,
    is_config,
    load_config,
    nested_fields,
    where_in_file,
)

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
    """Keyword-only parameters, one per CLI field of ``cls`` (see the module docstring), then
    one per CLI field of each nested config (named ``outer__inner``)."""
    params = [
        _parameter(f.name, f, tp, _flag(f), default_of(f), (callbacks or {}).get(f.name))
        for f, tp in _cli_fields(cls)
    ]
    for outer, sub in nested_fields(cls):
        if not outer.metadata.get("cli", True):
            continue
        nested = default_of(outer)
        for f, tp in _cli_fields(sub, outer.metadata.get("cli_fields")):
            name = f"{outer.name}{NESTED}{f.name}"
            default = getattr(nested, f.name) if dataclasses.is_dataclass(nested) else default_of(f)
            callback = (callbacks or {}).get(name)
            flag = _nested_flag(outer, f)
            text = outer.metadata.get("helps", {}).get(f.name)
            params.append(_parameter(name, f, tp, flag, default, callback, outer.name, text))
    return params


NESTED = "__"  # parameter name of a nested config's option: ``rollout__n_tasks``


def _cli_fields(cls: type, only: Sequence[str] | None = None) -> list[tuple[Any, Any]]:
    """(field, type) of ``cls``'s plain CLI fields (``only``: just these, in this order)."""
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in fields_of(cls)}
    names = list(only) if only is not None else list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {unknown} (cli_fields)")
    picked = [(by_name[n], hints[n]) for n in names]
    return [(f, tp) for f, tp in picked if f.metadata.get("cli", True) and not is_config(tp)]


def _nested_flag(outer: dataclasses.Field, f: dataclasses.Field) -> str:
    renamed = outer.metadata.get("flags", {}).get(f.name)
    return renamed or "--" + outer.metadata.get("prefix", "") + _flag(f).removeprefix("--")


def _parameter(
    name: str,
    f: dataclasses.Field,
    tp: Any,
    flag: str,
    default: Any,
    callback: Callable[..., Any] | None,
    within: str | None = None,
    text: str | None = None,
) -> inspect.Parameter:
    decls = [flag]
    if tp in (bool, bool | None):  # --x / --no-x (a file's True can be turned off)
        decls = [f"{flag}/--no-{flag.removeprefix('--')}"]
    text = text or f.metadata.get("help", "")
    option = typer.Option(
        *decls,
        help=f"{within}: {text}" if within else text,
        min=f.metadata.get("min"),
        max=f.metadata.get("max"),
        callback=callback,
    )
    if default is dataclasses.MISSING or isinstance(default, tuple | dict):
        default = None  # required, or a repeatable option with none given
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[_option_type(tp), option],
    )


def build_config(cls: type, ctx: typer.Context, path: Path | None, values: dict[str, Any]) -> Any:
    """``cls`` from the YAML file at ``path`` (else the defaults), then the options the command
    line gave (:class:`ConfigError` for a bad value, naming the option)."""
    given: dict[str, Any] = {}
    inner: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        source = ctx.get_parameter_source(name)
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        outer, _, field = name.rpartition(NESTED)
        owner = _nested_class(cls, outer) if outer else cls
        held = _field_value(typing.get_type_hints(owner)[field], value)
        if outer:
            inner.setdefault(outer, {})[field] = held
        else:
            given[field] = held
    if path is not None:
        cfg = dataclasses.replace(load_config(cls, path), **given)
    else:
        missing = [f for f in fields_of(cls) if _required(f) and f.name not in given]
        if missing:
            flags = ", ".join(_flag(f) for f in missing)
            raise ConfigError(f"missing {flags} (or a --config file that sets it)")
        cfg = cls(**given)
    for outer, changes in inner.items():
        cfg = dataclasses.replace(
            cfg, **{outer: dataclasses.replace(getattr(cfg, outer), **changes)}
        )
    try:
        check_config(cfg)
    except ConfigError as exc:
        field, _, problem = str(exc).partition(": ")
        raise ConfigError(f"{_flag_of_path(cls, field)}: {problem}") from None
    return cfg


def _check(cfg: Any, path: Path | None) -> None:
    """The config's own check of settings that cannot work together (``cfg.check()``, where it
    has one), before the command runs; an error naming a field names the file's line too."""
    check = getattr(cfg, "check", None)
    if not callable(check):
        return
    try:
        check()
    except ValueError as exc:
        from curation.recipe import RecipeError
        from training.interface import DataMismatch

        if not isinstance(exc, ConfigError | RecipeError | DataMismatch):
            raise
        if path is None:  # flags only: an error naming a field names its flag
            field, _, problem = str(exc).partition(": ")
            if problem and field and " " not in field:
                raise ConfigError(f"{_flag_of_path(type(cfg), field)}: {problem}") from None
            raise ConfigError(str(exc)) from None
        raise ConfigError(where_in_file(path, str(exc))) from None


def _nested_class(cls: type, outer: str) -> type:
    return dict((f.name, tp) for f, tp in nested_fields(cls))[outer]


def _flag_of_path(cls: type, path: str) -> str:
    """The option of a field path (``rollout.n_tasks`` → ``--n``), else the path itself."""
    outer, _, name = path.rpartition(".")
    fields = {f.name: f for f in fields_of(cls)}
    if not outer:
        return _flag(fields[name]) if name in fields else path
    nested = dict((f.name, tp) for f, tp in nested_fields(cls))
    if outer not in nested:
        return path
    inner = {f.name: f for f in fields_of(nested[outer])}
    only = fields[outer].metadata.get("cli_fields")
    if name not in inner or (only is not None and name not in only):
        return path
    return _nested_flag(fields[outer], inner[name])


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
        _check(cfg, path)
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
