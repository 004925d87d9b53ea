"""Reading YAML that people write (recipes, stage configs): safely, with line numbers.

* Anchors and aliases are refused before anything is built: a 600-byte "billion laughs" file
  (nested aliases) would otherwise expand to gigabytes; hand-written configs need neither.
* Every field path is mapped to its 1-based line, so an error can say ``file:line: field``.
* A syntax error names the line, its text, and where an unclosed construct started.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

Loc = tuple[str | int, ...]


class YamlError(ValueError):
    """YAML that cannot be read; the message starts with ``source:line:``."""


def read_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    """The data of YAML ``text`` and the line of each field path in it (see :func:`line_of`).
    ``source`` (a file path) starts every error message."""
    refuse_aliases(text, source)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise YamlError(syntax_error(exc, text, source)) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _index(node, (), lines)
    return data, lines


def refuse_aliases(text: str, source: str) -> None:
    """:class:`YamlError` at the first anchor or alias (the event stream is read lazily: one
    pass over the text, nothing expanded)."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            alias = isinstance(event, yaml.AliasEvent)
            if alias or getattr(event, "anchor", None) is not None:
                line = event.start_mark.line + 1
                what = "an alias (*)" if alias else "an anchor (&)"
                raise YamlError(
                    f"{source}:{line}: {what}: this file may not use YAML anchors or aliases "
                    "(write the values out)"
                )
    except yaml.YAMLError as exc:
        raise YamlError(syntax_error(exc, text, source)) from None


def _index(node: yaml.Node, loc: Loc, out: dict[Loc, int]) -> None:
    """Map each field path to its 1-based YAML line (keys: the key's line)."""
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*loc, key.value)
            out[sub] = key.start_mark.line + 1
            _index(value, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, (*loc, i), out)


def line_of(lines: dict[Loc, int], loc: Sequence[str | int]) -> int:
    """The line of field path ``loc``, else of its nearest enclosing path (1 if none)."""
    for n in range(len(loc), -1, -1):
        if tuple(loc[:n]) in lines:
            return lines[tuple(loc[:n])]
    return 1


def field_path(loc: Sequence[str | int]) -> str:
    """``("filters", 0, "min")`` → ``filters[0].min``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def syntax_error(exc: yaml.YAMLError, text: str, source: str) -> str:
    """``source:line: YAML syntax error: …`` with the text of the offending line, and where the
    construct it was inside started (an unclosed ``{`` is found lines later)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and cmark is not None and cmark.line + 1 != line:
        problem = f"{problem} ({context} that started at line {cmark.line + 1})"
    rows = text.splitlines()
    near = rows[line - 1].strip() if 0 < line <= len(rows) else ""
    return f"{source}:{line}: YAML syntax error: {problem} (at {near!r})"
