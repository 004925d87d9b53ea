"""External task formats → warehouse tasks.

- Online-Mind2Web tasks: ``{task_id, confirmed_task, website, reference_length, level}``
  (``Online_Mind2Web.json``); forks also write ``id`` / ``annotation_id``, ``task`` /
  ``instruction``, ``start_url`` / ``web`` / ``url``, and a bare host for ``website``.
- WebVoyager: ``{web_name, id, ques, web}`` (``WebVoyager_data.jsonl``); ``id`` or ``web_name``
  may be missing, the question may be under ``question`` / ``task`` / ``instruction``.
- Rubric tasks: ``{instruction, start_url, rubric: [..], reference?, task_id?, site?, split?}``.

Any of them as a JSON array (one entry per task, a trailing comma tolerated), JSONL (one object
per line), one object, or ``{"tasks": [...]}``; a UTF-8 byte-order mark is ignored.

What can be derived is derived (the site from the start URL's host, a missing id from the file
name and the row's line or entry number, ``"7"`` → 7); a row that still lacks something is
reported with its line (or entry) number and the reason, and the rest imports. Storing goes
through :func:`warehouse.tasks.put_tasks`, so a changed task becomes a new version.

Start URLs go through :func:`warehouse.urls.parse_web_url`, the one URL policy: each is stored
as the browser will visit it (WHATWG serialisation; ``http://a.com\\@b.com/`` is ``a.com``'s
page ``/@b.com/``), its site is that parse's host, and a row whose URL is not http(s), does not
parse, or points at a link-local, metadata, loopback or private host is refused with the reason.
These files come from third parties: ``allow_private=True`` (for a file one wrote for a local
site) admits loopback and private hosts, never link-local or metadata ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warehouse.connection import WarehouseError
from warehouse.ids import stable_hash
from warehouse.records import Task
from warehouse.urls import NotAWebUrl, UrlRefused, WebUrl, parse_web_url


class RowError(ValueError):
    """One row cannot become a task; the message says why."""


@dataclass
class ParsedTasks:
    tasks: list[Task] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line or entry, reason)
    unit: str = "line"  # what the numbers count: "line" (JSONL) or "entry" (JSON array)


_WRAPPERS = ("tasks", "data", "examples", "items")


def read_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(number, parsed JSON or a :class:`RowError`) per row of a JSON array or JSONL file;
    numbers are entries of an array, else lines. :class:`WarehouseError` when the file cannot
    be read at all."""
    yield from _rows(_read_text(path))[1]


def _read_text(path: str | Path) -> str:
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8-sig")  # -sig: drops a byte-order mark
    except UnicodeDecodeError as exc:
        raise WarehouseError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise WarehouseError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _rows(text: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    stripped = text.lstrip()
    if stripped.startswith("[") and not _jsonl_of_arrays(stripped):
        return "entry", _array_rows(text, text.index("["))
    if stripped.startswith("{"):
        try:
            whole = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            whole = None
        if isinstance(whole, dict):
            inner = next((whole[k] for k in _WRAPPERS if isinstance(whole.get(k), list)), None)
            if inner is not None:
                return "entry", iter(enumerate(inner, start=1))
            line = text[: text.index("{")].count("\n") + 1
            return "line", iter([(line, whole)])
    return "line", _jsonl_rows(text)


def _jsonl_of_arrays(text: str) -> bool:
    """A JSONL file whose first row is an array (not one JSON array over many lines)."""
    first, _, rest = text.partition("\n")
    if not rest.strip():
        return False
    try:
        json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def _jsonl_rows(text: str) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            yield n, json.loads(line.removesuffix(",") if line.endswith("},") else line)
        except (json.JSONDecodeError, RecursionError) as exc:
            yield n, RowError(f"not valid JSON ({_why(exc)})")


def _array_rows(text: str, pos: int) -> Iterator[tuple[int, Any]]:
    """The entries of a JSON array one by one: the good ones before a broken entry still
    import, and a trailing comma (``[{…}, {…},]``) is tolerated."""
    dec = json.JSONDecoder()
    pos, n = pos + 1, 0
    while True:
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            yield n + 1, RowError(f"the JSON array is not closed ({_line_col(text, pos)})")
            return
        if text[pos] == "]":
            return
        n += 1
        try:
            value, pos = dec.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError) as exc:
            at = exc.pos if isinstance(exc, json.JSONDecodeError) else pos
            yield (
                n,
                RowError(
                    f"not valid JSON ({_why(exc)} at {_line_col(text, at)}); "
                    "this and the following entries were not read"
                ),
            )
            return
        yield n, value
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "]":
            return
        else:
            yield (
                n + 1,
                RowError(
                    f"expected ',' or ']' after entry {n} ({_line_col(text, pos)}); "
                    "the following entries were not read"
                ),
            )
            return


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line} column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _why(exc: Exception) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"


# -- row fields ---------------------------------------------------------------------------------


def _first(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    """(key, value) of the first of ``keys`` with a non-empty value, else (keys[0], None)."""
    for k in keys:
        v = row.get(k)
        if v is not None and not (isinstance(v, str) and not v.strip()):
            return k, v
    return keys[0], None


def _text(row: dict[str, Any], keys: tuple[str, ...], *, required: bool = True) -> str | None:
    key, v = _first(row, keys)
    if v is None:
        if not required:
            return None
        also = f" (also looked for {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise RowError(f"'{keys[0]}' is missing or empty{also}")
    if not isinstance(v, str):
        raise RowError(f"'{key}' is not a string: {_short(v)}")
    return v.strip()


def _ident(row: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    key, v = _first(row, keys)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise RowError(f"'{key}' is not a string or an integer: {_short(v)}")
    return str(v).strip()


def _given_url(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, str]:
    """(key, the start URL as the row writes it); a bare host name (``www.booking.com``)
    becomes ``https://…``."""
    key, _ = _first(row, keys)
    v = _text(row, keys)
    assert v is not None
    if "://" not in v and re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?(/\S*)?", v):
        v = "https://" + v
    return key, v


def _start_url(row: dict[str, Any], keys: tuple[str, ...], ctx: _Row) -> WebUrl:
    """The start URL as the browser will visit it (:func:`warehouse.urls.parse_web_url`), or
    :class:`RowError` with the reason it is refused."""
    key, v = _given_url(row, keys)
    try:
        return parse_web_url(v, allow_private=ctx.allow_private)
    except NotAWebUrl as exc:
        raise RowError(
            f"'{key}' is not an http(s) URL or a host name: {_short(v)} ({exc})"
        ) from None
    except UrlRefused as exc:
        raise RowError(f"'{key}' is refused as a start URL: {exc} ({_short(v)})") from None


def _int(row: dict[str, Any], key: str) -> int | None:
    v = row.get(key)
    if v is None or v == "":
        return None
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise RowError(f"'{key}' must be an integer, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _derived_id(ctx: _Row) -> str:
    return f"{ctx.stem}-{ctx.n}"


@dataclass(frozen=True)
class _Row:
    n: int  # line or entry number
    stem: str  # the file's name without extension (for derived ids)
    allow_private: bool = False  # admit loopback / private start URLs (see parse_web_url)


# -- formats ------------------------------------------------------------------------------------

_INSTRUCTION = ("confirmed_task", "task", "instruction", "ques", "question", "intent")
_URL = ("website", "start_url", "web", "url", "start_page")
_RUBRIC_URL = ("start_url", "website", "web", "url")


def _om2w(row: dict[str, Any], ctx: _Row) -> Task:
    website = _start_url(row, _URL, ctx)
    instruction = _text(row, _INSTRUCTION)
    ref_len = _int(row, "reference_length")
    level = row.get("level")
    return Task(
        task_id=_ident(row, ("task_id", "id", "annotation_id")) or _derived_id(ctx),
        suite="om2w",
        site=website.host,
        instruction=instruction,
        start_url=website.href,
        split="test",
        difficulty=ref_len,
        source="online-mind2web",
        meta={"level": str(level)} if isinstance(level, str | int) and level != "" else None,
    )


def _webvoyager(row: dict[str, Any], ctx: _Row) -> Task:
    web = _start_url(row, ("web", "start_url", "website", "url"), ctx)
    question = _text(row, ("ques", "question", "task", "instruction", "confirmed_task"))
    tid = _ident(row, ("id", "task_id")) or _derived_id(ctx)
    return Task(
        task_id=f"webvoyager/{tid}",
        suite="webvoyager",
        site=_text(row, ("web_name",), required=False) or web.host,
        instruction=question,
        start_url=web.href,
        split="test",
        source="webvoyager",
    )


def _rubric(row: dict[str, Any], ctx: _Row) -> Task:
    instruction = _text(row, ("instruction", "task", "confirmed_task", "ques", "question"))
    start = _start_url(row, _RUBRIC_URL, ctx)
    rubric = row.get("rubric")
    if isinstance(rubric, str) and rubric.strip():
        rubric = [rubric]
    if (
        not isinstance(rubric, list)
        or not rubric
        or not all(isinstance(r, str) and r.strip() for r in rubric)
    ):
        raise RowError("'rubric' must be a non-empty list of strings")
    reference = row.get("reference")
    if reference is not None and not (
        isinstance(reference, list) and all(isinstance(r, str) for r in reference)
    ):
        raise RowError("'reference' must be a list of actions (strings)")
    # a derived id hashes the URL as written (not its serialisation): ids stay as they were
    given = _given_url(row, _RUBRIC_URL)[1]
    tid = _ident(row, ("task_id", "id")) or f"rubric/{stable_hash(instruction, given, length=12)}"
    return Task(
        task_id=tid,
        suite=_text(row, ("suite",), required=False) or "rubric",
        site=_text(row, ("site",), required=False) or start.host,
        instruction=instruction,
        start_url=start.href,
        rubric=[r.strip() for r in rubric],
        reference=reference,
        split=_text(row, ("split",), required=False) or "test",
        source="rubric-file",
    )


FORMATS: dict[str, Callable[[dict[str, Any], _Row], Task]] = {
    "om2w": _om2w,
    "webvoyager": _webvoyager,
    "rubric": _rubric,
}


def parse_task_file(fmt: str, path: str | Path, *, allow_private: bool = False) -> ParsedTasks:
    """Parse a task file of format ``fmt`` (om2w, webvoyager, rubric). Bad rows land in
    ``errors``; :class:`WarehouseError` only when the file cannot be read at all.

    ``allow_private`` admits start URLs on loopback and private hosts (``localhost``,
    ``[::1]``, 10.0.0.0/8 …): off for third-party files, on only for one's own file of tasks
    on a local site. Link-local and cloud metadata hosts are refused either way."""
    if fmt not in FORMATS:
        raise WarehouseError(f"unknown task format {fmt!r}; known: {sorted(FORMATS)}")
    unit, rows = _rows(_read_text(path))
    out = ParsedTasks(unit=unit)
    stem = Path(path).stem
    seen: set[str] = set()
    for n, row in rows:
        if isinstance(row, RowError):
            out.errors.append((n, str(row)))
            continue
        if not isinstance(row, dict):
            out.errors.append((n, "not a JSON object"))
            continue
        try:
            task = FORMATS[fmt](row, _Row(n, stem, allow_private))
        except RowError as exc:
            out.errors.append((n, str(exc)))
            continue
        if task.task_id in seen:
            out.errors.append((n, f"duplicate task id {task.task_id!r} in this file"))
            continue
        seen.add(task.task_id)
        out.tasks.append(task)
    if not out.tasks and not out.errors:
        out.errors.append((1, "the file has no tasks"))
    return out
