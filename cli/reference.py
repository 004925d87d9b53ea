"""The generated parts of the documentation: a stage config's fields as a table (from the same
``setting(...)`` metadata the CLI options and the YAML loader read) and a command's ``--help``
as the terminal shows it. ``scripts/docs_hooks.py`` puts them into the docs pages."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import types
import typing
from typing import Any

from cli.help import plain
from cli.options import _flag, _nested_flag
from stages.config import default_of, fields_of, help_of, is_config, type_hints


def config_class(dotted: str) -> type:
    """The config class a dotted path names (``stages.collect.CollectConfig``)."""
    module, _, name = dotted.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"no config class {dotted!r}: {exc}") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{dotted!r} is not a config class")
    return cls


def config_rows(cls: type, prefix: str = "", outer: dataclasses.Field | None = None) -> list[dict]:
    """One row per field of ``cls`` (nested configs' fields follow as ``outer.field``): its YAML
    key, its command-line flag ('' when only a file sets it), type, default and help."""
    hints, rows = type_hints(cls), []
    cli_fields = outer.metadata.get("cli_fields") if outer is not None else None
    for f in fields_of(cls):
        tp, key = hints[f.name], prefix + f.name
        if is_config(tp):
            rows.append(_row(key, "", f"a `{tp.__name__}` (below)", "", help_of(f)))
            rows.extend(config_rows(tp, key + ".", f))
            continue
        rows.append(_row(key, _flag_of(f, outer, cli_fields), _type(tp), _default(f), help_of(f)))
    return rows


def _flag_of(f: dataclasses.Field, outer: dataclasses.Field | None, only: Any) -> str:
    if not f.metadata.get("cli", True):
        return ""
    if outer is None:
        return _flag(f)
    if not outer.metadata.get("cli", True) or only is None or f.name not in only:
        return ""
    return _nested_flag(outer, f)


def _row(key: str, flag: str, tp: str, default: str, text: str) -> dict:
    return {"key": key, "flag": flag, "type": tp, "default": default, "help": plain(text)}


def _type(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(str(m.value) for m in tp)
    if origin in (types.UnionType, typing.Union):
        return " \\| ".join(_type(a) for a in args)
    if args:
        inner = ", ".join(_type(a) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    value = default_of(f)
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`" if value not in ("", None) else ("`''`" if value == "" else "–")


def config_table(dotted: str) -> str:
    """A Markdown table of the config class ``dotted``'s fields (see :func:`config_rows`)."""
    cls = config_class(dotted)
    lines = [
        "| key | flag | type | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for r in config_rows(cls):
        flag = f"`{r['flag']}`" if r["flag"] else "file only"
        text = r["help"].replace("|", "\\|")  # a pipe in help text would end the cell
        lines.append(f"| `{r['key']}` | {flag} | {r['type']} | {r['default']} | {text} |")
    return "\n".join(lines)


def help_text(argv: list[str], width: int = 100) -> str:
    """``webloop ARGV --help`` as the terminal prints it (no colour, ``width`` columns)."""
    from typer.testing import CliRunner

    from cli.app import app

    env = {"COLUMNS": str(width), "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(app, [*argv, "--help"], env=env, prog_name="webloop")
    if result.exit_code != 0:
        raise ValueError(f"webloop {' '.join(argv)} --help failed: {result.output.strip()}")
    return result.output.rstrip()
