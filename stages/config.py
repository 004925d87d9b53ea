"""Stage configs: frozen dataclasses whose fields say what they mean.

Every field of a stage config is declared with :func:`setting`: its default, its help text, and
for numbers their bounds (TRL's ``field(metadata={"help": …})`` is the model). From that one
declaration come

* the CLI options of the stage's command (``cli/options.py``: ``--max-steps`` with its help and
  range, ``--config FILE``);
* the YAML loader (:func:`load_config`): a file holds any subset of the fields, and an error
  names the file, the line and the field, as recipes do;
* the checks (:func:`check_config`) that refuse a value out of range, for library callers too.

Configs compose: a field whose type is itself a config is a nested mapping in YAML.

YAML goes through :mod:`warehouse.yamlfile` (aliases refused before anything is built, line
numbers kept), values through pydantic's validation of dataclasses (types, ``Literal`` choices,
nested configs), bounds through the fields' metadata. :class:`ConfigError`
(:mod:`warehouse.config`'s) is the one error type for a bad option or a bad config file: the CLI
prints it on one line and exits 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from warehouse.config import ConfigError
from warehouse.yamlfile import YamlError, field_path, line_of, read_yaml

C = TypeVar("C")
_MISSING = dataclasses.MISSING


def setting(
    default: Any = _MISSING,
    *,
    help: str,
    factory: Any = _MISSING,
    min: float | None = None,
    max: float | None = None,
    flag: str | None = None,
    cli: bool = True,
    cli_fields: tuple[str, ...] | None = None,
    flags: Mapping[str, str] | None = None,
    prefix: str = "",
    helps: Mapping[str, str] | None = None,
) -> Any:
    """A config field: its default (or ``factory`` for a mutable one), its ``help`` text, the
    bounds of a number (``min``/``max``, inclusive), the CLI flag when it is not
    ``--field-name`` (kept as users know it, e.g. ``--run`` for ``run_name``), and ``cli=False``
    for a field only a config file or a library caller sets (a mapping, a task list).

    A field that holds another stage's config (an evaluation's rollouts are a collect config)
    defaults through ``factory`` to that config with the defaults this stage wants; its fields
    named in ``cli_fields`` become this command's options too, as ``--{prefix}{flag}`` unless
    ``flags`` renames them (``{"samples": "--group-size"}``) and ``helps`` says what they mean
    here when the nested config's own help does not."""
    meta = {"help": help, "min": min, "max": max, "flag": flag, "cli": cli}
    meta.update(cli_fields=cli_fields, flags=dict(flags or {}), prefix=prefix)
    meta.update(helps=dict(helps or {}))
    if factory is not _MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def fields_of(cls: type) -> list[dataclasses.Field]:
    """The fields of config class ``cls`` (each declared with :func:`setting`)."""
    return list(dataclasses.fields(cls))


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config class (``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def is_config(tp: Any) -> bool:
    """Whether ``tp`` is a config class (a dataclass), as opposed to a value type."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def default_of(f: dataclasses.Field) -> Any:
    """The default value of field ``f`` (its factory called), or ``MISSING``."""
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return f.default


def nested_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """The fields of ``cls`` that hold another config, with that config's class."""
    hints = type_hints(cls)
    return [(f, hints[f.name]) for f in fields_of(cls) if is_config(hints[f.name])]


def with_nested_defaults(cls: type, data: Any) -> Any:
    """``data`` (a mapping of ``cls``'s fields) with each nested config's mapping laid over that
    field's own default: ``rollout: {n_tasks: 4}`` in an RL file keeps the RL rollouts' other
    defaults (temperature 1), not the collect stage's."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for f, sub in nested_fields(cls):
        value = out.get(f.name)
        default = default_of(f)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(default):
            base = {k.name: getattr(default, k.name) for k in fields_of(sub)}
            out[f.name] = {**base, **with_nested_defaults(sub, value)}
    return out


# -- checks -----------------------------------------------------------------------------------


def check_config(cfg: Any, prefix: str = "") -> None:
    """Refuse a field outside its bounds or its ``Literal`` choices (:class:`ConfigError`
    naming the field); nested configs are checked too. Stages call it on the configs they
    are given, so a library caller's mistake is refused as a command line's would be."""
    hints = type_hints(type(cfg))
    for f in fields_of(type(cfg)):
        value = getattr(cfg, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_config(value, f"{name}.")
            continue
        problem = bound_problem(f, value) or choice_problem(hints[f.name], value)
        if problem:
            raise ConfigError(f"{name}: {problem}")


def choice_problem(tp: Any, value: Any) -> str | None:
    """Why ``value`` is not one of a ``Literal`` type's choices (None when it is, or when the
    type is no ``Literal``; ``None`` passes an optional one)."""
    args = typing.get_args(tp)
    literal = next((a for a in args if typing.get_origin(a) is typing.Literal), None)
    if typing.get_origin(tp) is typing.Literal:
        literal = tp
    if literal is None or (value is None and type(None) in args):
        return None
    choices = typing.get_args(literal)
    if value in choices:
        return None
    return f"{value!r} is not one of {', '.join(repr(c) for c in choices)}"


def bound_problem(f: dataclasses.Field, value: Any) -> str | None:
    """Why ``value`` is out of ``f``'s bounds (None when it is within them, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if lo is not None and value < lo:
        return f"{value!r} is below the minimum {lo:g}"
    if hi is not None and value > hi:
        return f"{value!r} is above the maximum {hi:g}"
    return None


# -- YAML ---------------------------------------------------------------------------------------


def load_config(cls: type[C], path: str | Path) -> C:
    """Read a ``cls`` from a YAML file (any subset of its fields; the rest keep their defaults).
    :class:`ConfigError` names the file, the line and the field of the first problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    return parse_config(cls, text, str(path))


def parse_config(cls: type[C], text: str, source: str) -> C:
    """:func:`load_config` of YAML ``text``; ``source`` names it in errors."""
    try:
        data, lines = read_yaml(text, source)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        data = {}
    return config_from_mapping(cls, data, lambda loc: f"{source}:{line_of(lines, loc)}")


def config_from_mapping(cls: type[C], data: Any, where: Any = None) -> C:
    """A ``cls`` from a mapping of its fields (nested configs as nested mappings). ``where``:
    a function from a field path to the location errors start with."""
    where = where or (lambda loc: "config")

    def fail(loc: tuple, problem: str) -> ConfigError:
        return ConfigError(f"{where(loc)}: {field_path(loc) or '<config>'}: {problem}")

    _check_keys(cls, data, (), fail)
    try:
        cfg = TypeAdapter(cls).validate_python(with_nested_defaults(cls, data))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        raise fail(loc, _pydantic_problem(first)) from None
    try:
        check_config(cfg)
    except ConfigError as exc:
        name, _, problem = str(exc).partition(": ")
        raise fail(tuple(name.split(".")), problem) from None
    return cfg


def _check_keys(cls: type, data: Any, loc: tuple, fail: Any) -> None:
    """Unknown keys, with the nearest known ones suggested (pydantic ignores them silently)."""
    if not isinstance(data, Mapping):
        raise fail(loc, f"expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    hints = type_hints(cls)
    known = [f.name for f in fields_of(cls)]
    for key, value in data.items():
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=2)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            raise fail((*loc, key), f"unknown field{hint}; known: {', '.join(known)}")
        if is_config(hints[key]) and isinstance(value, Mapping):
            _check_keys(hints[key], value, (*loc, key), fail)


def _pydantic_problem(error: dict[str, Any]) -> str:
    msg = error["msg"]
    if "input" in error and error.get("type") != "missing":
        return f"{msg} (got {error['input']!r})"
    return msg


def with_settings(cfg: C, changes: Mapping[str, Any]) -> C:
    """``cfg`` with ``changes`` (field → value; for a field holding a config, a mapping of that
    config's changes, as in a YAML file), checked (:class:`ConfigError` naming the field)."""
    hints = type_hints(type(cfg))
    known = {f.name for f in fields_of(type(cfg))}
    updates: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in known:
            raise ConfigError(f"{key}: unknown field of {type(cfg).__name__}")
        nested = is_config(hints[key]) and isinstance(value, Mapping)
        updates[key] = with_settings(getattr(cfg, key), value) if nested else value
    out = dataclasses.replace(cfg, **updates)  # type: ignore[type-var]
    check_config(out)
    return out


def where_in_file(path: str | Path, error: str) -> str:
    """``error`` (``"rollout.policy: …"``, a check naming a field path) prefixed with the file
    and the line that sets that field (or its nearest enclosing one): ``"run.yaml:4: …"``."""
    field = error.split(": ", 1)[0]
    if not field or " " in field:
        return f"{path}: {error}"
    try:
        _data, lines = read_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, YamlError):
        return f"{path}: {error}"
    return f"{path}:{line_of(lines, tuple(field.split('.')))}: {error}"


def dump_config(cfg: Any) -> str:
    """``cfg`` as YAML that :func:`load_config` reads back to an equal config."""
    return yaml.safe_dump(_plain(dataclasses.asdict(cfg)), sort_keys=False, allow_unicode=True)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
