"""Online-Mind2Web interop: its per-task trajectory folders and human labels.

Two layouts, told apart per folder by ``result.json``'s ``schema_version``:

* v1 (no ``schema_version``)::

    DIR/<task_id>/result.json      {"task_id", "task", "final_result_response",
                                    "action_history": [str], "thoughts": [str]}
    DIR/<task_id>/trajectory/*.png screenshots, ordered by the first number in the file name

* v2 (``"online-mind2web-v2"``, what the upstream judge reads today and current harnesses
  write): one object per step with its action, thought, URL, status and screenshot (a file
  under ``trajectory/``, a data URI, bare base64 or a URL); the last step is the answer
  (``TASK_COMPLETE -> ANSWER: …``). Its rules and reader: :mod:`warehouse.interop.om2w_v2`.
  The answer step is stored as webloop stores its own answers (an ``answer`` action, the text
  in the trajectory's ``answer``), so judges never take it for an action on the page.

Human labels (``human_label.json``): 0 failure, 1 success, 2 not executable. Accepted shapes:
``{task_id: label}``, ``[{"task_id": …, "label": …}]``, ``[{"task_id": …, "<agent>": label, …}]``
(pick the column with ``agent=``) and ``{"<agent>": {task_id: label}}``.

Import keeps going past malformed folders: each is reported with the reason, the rest imports.
Nothing outside a task folder is read: a ``result.json``, ``trajectory/`` or task folder that is
a symbolic link leaving it makes the folder malformed; such a screenshot link is rejected. Every
screenshot is checked to be a whole image (:func:`warehouse.images.validate_image`): a rejected
file (a git-lfs pointer, a zero-byte or truncated file, a link leaving the folder) leaves its
step without a screenshot, the trajectory is kept, and the report lists it per folder.
Export writes v2 (or v1) from a webloop run, plus a ``webloop`` key in ``result.json`` (ignored
by the evaluators) that lets a re-import recover the sample index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from warehouse import images
from warehouse.connection import WarehouseError
from warehouse.ids import make_id, traj_id_for
from warehouse.interop import om2w_v2
from warehouse.interop.om2w_v2 import StepProblem, V2Steps
from warehouse.outdir import check_out_dir
from warehouse.records import FINISHED, Blob, HumanLabel, Run, Step, Task, Trajectory, utcnow
from warehouse.relations import with_relations
from warehouse.store import Warehouse
from warehouse.tasks import latest_tasks, put_tasks
from warehouse.urls import UrlRefused, parse_web_url

SUITE = "om2w"
LABEL_NAMES = {0: "failure", 1: "success", 2: "not_executable"}
LABEL_CODES = {v: k for k, v in LABEL_NAMES.items()}
_IMAGE_EXT = {".png", ".jpg", ".jpeg", ".webp"}
_BATCH = 50
MAX_RESULT_BYTES = 64 * 1024 * 1024


MAX_TASK_ID_CHARS = 1000
MAX_SAMPLE_IDX = 2**31 - 1


def display_name(name: str) -> str:
    """A file or folder name as reports show it: as it is when it is printable UTF-8, else the
    ``repr`` of its bytes (``b'bad\\xff'``, ``b'a\\nb'``), so that no name fails to print or
    writes control characters to a terminal."""
    if name.isprintable() and _is_utf8(name):
        return name
    return repr(os.fsencode(name))


def _is_utf8(text: str) -> bool:
    """True when ``text`` can be stored as UTF-8 (no lone surrogates from bytes or JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Screenshot:
    """One file of a folder's ``trajectory/``: the file to read, or why it is not read."""

    name: str  # as reports show it (display_name)
    path: Path | None  # resolved, inside the task folder; None when rejected or inline
    problem: str | None = None
    data: bytes | None = None  # v2: decoded from a data URI or base64 in result.json
    url: str | None = None  # v2: a URL reference (not fetched; an export writes it back)


@dataclass
class ResultFields:
    """What a ``result.json`` says, checked by :func:`read_result`: every string can be stored,
    the task id is printable, the sample index is in range."""

    task_id: str
    task: str
    answer: str | None
    actions: list[str]
    thoughts: list[str]
    website: str | None
    sample_idx: int
    v2: V2Steps | None = None  # the steps of a v2 result.json (None: v1)


@dataclass
class ParsedFolder(ResultFields):
    """One valid Online-Mind2Web task folder: its ``result.json`` and its screenshots."""

    folder: Path = Path()
    screenshots: list[Screenshot] = field(default_factory=list)  # in step order; a rejected
    # one keeps its step, unread

    @property
    def name(self) -> str:
        """The folder's name as reports show it."""
        return display_name(self.folder.name)


@dataclass
class ImportReport:
    """Outcome of :func:`import_om2w`."""

    run_id: str
    imported: list[str] = field(default_factory=list)  # trajectory ids
    # Folders not imported: (folder as display_name shows it, reason). A folder whose task id
    # and sample index another folder (earlier by name) already has is one of them.
    malformed: list[tuple[str, str]] = field(default_factory=list)
    # Screenshots not stored (their step keeps no screenshot): (folder, file, reason).
    rejected: list[tuple[str, str, str]] = field(default_factory=list)
    labels_written: int = 0
    label_problems: list[str] = field(default_factory=list)

    def rejected_by_folder(self) -> dict[str, list[tuple[str, str]]]:
        """``{folder: [(file, reason), …]}`` of the rejected screenshots."""
        out: dict[str, list[tuple[str, str]]] = {}
        for folder, name, reason in self.rejected:
            out.setdefault(folder, []).append((name, reason))
        return out


class MalformedFolder(ValueError):
    """A task folder that cannot be imported; the message says why."""


# -- reading one folder: every check of a folder's files and values is here ---------------------


def parse_folder(folder: Path, root: Path | None = None) -> ParsedFolder:
    """Validate and read one task folder, or raise :class:`MalformedFolder` with the reason.

    Nothing outside the task folder is read: ``result.json``, ``trajectory/`` or a screenshot
    that is a symbolic link leaving the folder (or, with ``root``, a task folder that is a link
    leaving ``root``) is refused. Links that stay inside the folder are followed. A folder name
    that is not UTF-8, or a file that cannot be read (permissions, a link loop), is a reason too:
    this raises nothing else.
    """
    try:
        return _parse_folder(folder, root)
    except OSError as exc:
        raise MalformedFolder(f"cannot read the folder ({exc.strerror or exc})") from None
    except RuntimeError as exc:  # Path.resolve() on a link loop (Python 3.11), deep recursion
        raise MalformedFolder(f"cannot read the folder ({exc})") from None


def _parse_folder(folder: Path, root: Path | None) -> ParsedFolder:
    if not _is_utf8(folder.name):
        raise MalformedFolder("the folder name is not valid UTF-8")
    base = folder.resolve()
    if root is not None and root.resolve() not in base.parents:
        raise MalformedFolder("the task folder is a link that leaves the import folder")
    fields = read_result(_load_result(folder, base))
    if fields.v2 is not None:
        shots = [_v2_screenshot(base, ref, i) for i, ref in enumerate(fields.v2.shots)]
        return ParsedFolder(**vars(fields), folder=folder, screenshots=shots)
    shots_dir = folder / "trajectory"
    if not shots_dir.is_dir():
        raise MalformedFolder("no trajectory/ folder of screenshots")
    real_dir = shots_dir.resolve()
    if real_dir != base and base not in real_dir.parents:
        raise MalformedFolder("trajectory/ is a link that leaves the task folder")
    files = [p for p in shots_dir.iterdir() if p.suffix.lower() in _IMAGE_EXT]
    unnumbered = [display_name(p.name) for p in files if not re.search(r"\d+", p.name)]
    if unnumbered:
        raise MalformedFolder(f"screenshot names without a step number: {unnumbered[:3]}")
    files.sort(key=lambda p: (int(re.findall(r"\d+", p.name)[0]), p.name))
    shots = [_screenshot(base, p) for p in files]
    return ParsedFolder(**vars(fields), folder=folder, screenshots=shots)


def _v2_screenshot(base: Path, ref: str, i: int) -> Screenshot:
    src = om2w_v2.shot_source(base, ref, i)
    return Screenshot(display_name(src.name), src.path, src.problem, src.data, src.url)


def _load_result(folder: Path, base: Path) -> Any:
    """The parsed ``result.json`` of ``folder`` (resolved: ``base``), never read from outside."""
    result_path = folder / "result.json"
    if not result_path.exists() and not result_path.is_symlink():
        raise MalformedFolder("no result.json")
    resolved = result_path.resolve()
    if base not in resolved.parents:
        raise MalformedFolder("result.json is a link that leaves the task folder")
    if not resolved.is_file():
        raise MalformedFolder("result.json is not a regular file")
    if resolved.stat().st_size > MAX_RESULT_BYTES:
        raise MalformedFolder(f"result.json is larger than {MAX_RESULT_BYTES // 2**20} MiB")
    try:
        return json.loads(resolved.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, >4300 digits
        raise MalformedFolder(f"result.json is not valid JSON ({exc})") from None
    except OSError as exc:
        raise MalformedFolder(f"cannot read result.json ({exc.strerror})") from None


def read_result(result: Any) -> ResultFields:
    """Check a parsed ``result.json`` and take what is imported from it, or raise
    :class:`MalformedFolder` naming the key: the one place where its values are validated.

    ``task_id`` and ``task`` are non-empty strings, the id printable (no NUL, no control
    character) and at most :data:`MAX_TASK_ID_CHARS` long; ``webloop.sample_idx`` is an integer
    from 0 to :data:`MAX_SAMPLE_IDX`; every string kept is valid Unicode (a JSON ``\\ud800``
    escape is not), whatever its nesting.
    """
    if not isinstance(result, dict):
        raise MalformedFolder("result.json is not a JSON object")
    schema = result.get("schema_version")
    if schema == om2w_v2.SCHEMA:
        return _read_v2(result)
    if schema is not None:
        raise MalformedFolder(
            f"result.json: unknown 'schema_version' {str(schema)[:60]!r} (known: "
            f"{om2w_v2.SCHEMA!r}, or none for the first layout)"
        )
    answer = result.get("final_result_response")
    if answer is not None and not isinstance(answer, str):
        answer = _dumps(answer, "final_result_response")
    website = result.get("website")
    if isinstance(website, str):
        _storable(website, "website")
    return ResultFields(
        task_id=_task_id(result),
        task=_storable(_require_str(result, "task"), "task"),
        answer=None if answer is None else _storable(answer, "final_result_response"),
        actions=_str_list(result, "action_history"),
        thoughts=_str_list(result, "thoughts"),
        website=_web_url(website),
        sample_idx=_sample_idx(result),
    )


def _read_v2(result: dict[str, Any]) -> ResultFields:
    """A v2 ``result.json``'s fields: its steps checked by the schema's rules
    (:func:`om2w_v2.read_steps`), every string kept checked to be storable."""
    try:
        steps = om2w_v2.read_steps(result)
    except StepProblem as exc:
        raise MalformedFolder(f"result.json: {exc}") from None
    for key in ("actions", "thoughts", "urls", "statuses", "shots"):
        for i, text in enumerate(getattr(steps, key)):
            if text is not None:
                _storable(text, f"action_history[{i}] ({key})")
    if steps.answer is not None:
        _storable(steps.answer, "agent_final_answer")
    website = result.get("website")
    return ResultFields(
        task_id=_task_id(result),
        task=_storable(_require_str(result, "task"), "task"),
        answer=steps.answer,
        actions=steps.actions,
        thoughts=[t or "" for t in steps.thoughts],
        website=_web_url(website) if isinstance(website, str) and _is_utf8(website) else None,
        sample_idx=_sample_idx(result),
        v2=steps,
    )


def _task_id(result: dict[str, Any]) -> str:
    value = _require_str(result, "task_id")
    if len(value) > MAX_TASK_ID_CHARS:
        raise MalformedFolder(
            f"result.json: 'task_id' is longer than {MAX_TASK_ID_CHARS} characters"
        )
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise MalformedFolder(f"result.json: 'task_id' holds {bad!a}, not a printable character")
    return value


def _sample_idx(result: dict[str, Any]) -> int:
    meta = result.get("webloop")
    value = meta.get("sample_idx", 0) if isinstance(meta, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAMPLE_IDX:
        raise MalformedFolder(
            f"result.json: 'webloop.sample_idx' must be an integer from 0 to {MAX_SAMPLE_IDX}"
        )
    return value


def _web_url(value: Any) -> str | None:
    """The start URL as the browser will visit it, or None when the policy of
    :func:`warehouse.urls.parse_web_url` refuses it (not http(s), unparsable, a link-local,
    metadata, loopback or private host: a result.json is a third party's) or it is no string.
    The folder still imports, without a start URL: the trajectory does not need one."""
    if not isinstance(value, str):
        return None
    try:
        return parse_web_url(value).href
    except UrlRefused:
        return None


def _screenshot(base: Path, path: Path) -> Screenshot:
    """Where to read a screenshot from, or why not: never outside the task folder ``base``."""
    name = display_name(path.name)
    real = path.resolve()
    if base not in real.parents:
        return Screenshot(name, None, "a link that leaves the task folder")
    if not real.exists():
        return Screenshot(name, None, "a broken link")
    if not real.is_file():
        return Screenshot(name, None, "not a regular file")
    if real.stat().st_size > images.MAX_BYTES:
        return Screenshot(name, None, f"larger than {images.MAX_BYTES // 2**20} MiB")
    return Screenshot(name, real)


def _require_str(result: dict[str, Any], key: str) -> str:
    value = result.get(key)
    if not isinstance(value, str) or not value.strip():
        raise MalformedFolder(f"result.json: '{key}' is missing or not a non-empty string")
    return value


def _storable(value: str, key: str) -> str:
    """``value`` if it can be stored (UTF-8), else the folder is malformed at ``key``."""
    if not _is_utf8(value):
        raise MalformedFolder(f"result.json: '{key}' holds text that is not valid Unicode")
    return value


def _dumps(value: Any, key: str) -> str:
    """A non-string JSON value as JSON text (for a text column)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):
        raise MalformedFolder(f"result.json: '{key}' is nested too deeply") from None


def _str_list(result: dict[str, Any], key: str) -> list[str]:
    value = result.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedFolder(f"result.json: '{key}' must be a list of strings")
    items = ["" if v is None else v if isinstance(v, str) else _dumps(v, key) for v in value]
    return [_storable(v, f"{key}[{i}]") for i, v in enumerate(items)]


# -- importing a folder set -------------------------------------------------------------------


def import_om2w(
    wh: Warehouse,
    root: str | Path,
    *,
    labels: str | Path | None = None,
    run_name: str | None = None,
    agent: str | None = None,
    reviewer: str = "om2w-human",
) -> ImportReport:
    """Import every task folder under ``root`` (and optional human labels) into ``wh``.

    A folder that cannot be imported is reported with its reason (:class:`ImportReport`) and the
    rest imports; so is a second folder with the task id and sample index of an earlier one (by
    name), or with the id of an earlier one but another task text or website. The run ends
    ``completed``, or ``failed`` with the error when the import stops (the error is raised). The
    import is idempotent: running it again, also after a crash half-way, stores each row once,
    and a task already stored with the folder's task text keeps its version.
    """
    root = Path(root)
    folders = _task_folders(root)
    label_map = read_labels(labels, agent) if labels else {}
    shown = display_name(root.resolve().name)
    run = Run(
        run_id=run_name or make_id("om2w-import", shown, agent),
        kind="import",
        name=run_name or f"om2w import of {display_name(root.name)}",
        config={"source": "online-mind2web", "folder": display_name(root.name), "agent": agent},
        status="running",
    )
    wh.write([run])
    rep = ImportReport(run_id=run.run_id)
    try:
        parsed = _parse_all(folders, root, rep)
        for start in range(0, len(parsed), _BATCH):
            _import_batch(wh, run, parsed[start : start + _BATCH], rep)
        if labels:
            source = display_name(Path(labels).name)
            _write_labels(wh, run.run_id, parsed, label_map, reviewer, source, rep)
    except BaseException as exc:
        _end_run(wh, run, f"{type(exc).__name__}: {exc}")
        raise
    _end_run(wh, run, None)
    return rep


def _task_folders(root: Path) -> list[Path]:
    """The folders directly under ``root``, in name order; a clear error if it cannot be listed."""
    if not root.is_dir():
        raise WarehouseError(f"{root}: not a folder of Online-Mind2Web task folders")
    try:
        return sorted(p for p in root.iterdir() if p.is_dir())
    except OSError as exc:
        raise WarehouseError(f"{root}: cannot list its task folders ({exc.strerror})") from None


def _parse_all(folders: list[Path], root: Path, rep: ImportReport) -> list[ParsedFolder]:
    """The importable folders; each other one goes to ``rep.malformed`` with its reason."""
    parsed: list[ParsedFolder] = []
    by_sample: dict[tuple[str, int], ParsedFolder] = {}
    by_task: dict[str, ParsedFolder] = {}
    for folder in folders:
        try:
            p = parse_folder(folder, root)
            _check_unique(p, by_sample, by_task)
        except MalformedFolder as exc:
            rep.malformed.append((display_name(folder.name), str(exc)))
            continue
        by_sample[(p.task_id, p.sample_idx)] = p
        by_task.setdefault(p.task_id, p)
        parsed.append(p)
    return parsed


def _check_unique(
    p: ParsedFolder,
    by_sample: dict[tuple[str, int], ParsedFolder],
    by_task: dict[str, ParsedFolder],
) -> None:
    """Refuse a folder that an earlier one already imports: the same trajectory (task id and
    sample index), or the same task id with another task (which would make task versions flip
    back and forth on every import)."""
    first = by_sample.get((p.task_id, p.sample_idx))
    if first is not None:
        raise MalformedFolder(
            f"task id {p.task_id!r} (sample {p.sample_idx}) is already imported "
            f"from the folder {first.name}"
        )
    first = by_task.get(p.task_id)
    if first is not None and (first.task, first.website) != (p.task, p.website):
        raise MalformedFolder(
            f"task id {p.task_id!r} has another task text or website in the folder {first.name}"
        )


def _end_run(wh: Warehouse, run: Run, error: str | None) -> None:
    """Mark the run completed, or failed with ``error`` (then a failure to record it is not
    raised: the import's own error is)."""
    status = "completed" if error is None else "failed"
    if error is not None:
        error = error.encode("utf-8", "backslashreplace").decode("utf-8")[:500]
    try:
        wh.write([replace(run, status=status, error=error, ended_at=utcnow())])
    except Exception:
        if error is None:
            raise


def _import_batch(wh: Warehouse, run: Run, batch: list[ParsedFolder], rep: ImportReport) -> None:
    steps, trajs, blobs = [], [], {}
    for p in batch:
        shot_hashes: list[str | None] = []
        for shot in p.screenshots:
            problem, data = shot.problem, shot.data or b""
            if problem is None and shot.data is not None:
                problem = images.validate_image(data)
            elif problem is None and shot.path is not None:
                try:
                    data = shot.path.read_bytes()
                except OSError as exc:
                    problem = f"unreadable ({exc.strerror})"
                else:
                    problem = images.validate_image(data)
            if problem is not None:  # the step stays, without a screenshot
                rep.rejected.append((p.name, shot.name, problem))
                shot_hashes.append(None)
                continue
            put = wh.blobs.put(data)
            shot_hashes.append(put.hash)
            blobs[put.hash] = Blob(put.hash, put.size, images.media_type(data))
        tid = traj_id_for(run.run_id, p.task_id, p.sample_idx)
        if p.v2 is not None:
            n = len(p.v2.shots)
            steps += _v2_steps(tid, p, p.v2, shot_hashes)
            trajs.append((tid, p, n))
            rep.imported.append(tid)
            continue
        n = max(len(shot_hashes), len(p.actions))
        for i in range(n):
            action = p.actions[i] if i < len(p.actions) else None
            steps.append(
                Step(
                    traj_id=tid,
                    step_idx=i,
                    screenshot_hash=shot_hashes[i] if i < len(shot_hashes) else None,
                    thought=(p.thoughts[i] or None) if i < len(p.thoughts) else None,
                    action={"raw": action} if action is not None else None,
                    action_text=action,
                )
            )
        trajs.append((tid, p, n))
        rep.imported.append(tid)
    versions = _task_versions(wh, batch)
    traj_rows = [
        Trajectory(
            traj_id=tid,
            run_id=run.run_id,
            task_id=p.task_id,
            task_version=versions[p.task_id],
            policy=run.config.get("agent") or "om2w-import",
            status=FINISHED,
            group_id=make_id("group", run.run_id, p.task_id),
            sample_idx=p.sample_idx,
            n_steps=n,
            answer=p.answer,
            meta={"folder": p.folder.name, **({"schema": om2w_v2.SCHEMA} if p.v2 else {})},
        )
        for tid, p, n in trajs
    ]
    wh.write_trajectories(traj_rows, steps, extra=[(list(blobs.values()), Blob)])


def _v2_steps(tid: str, p: ParsedFolder, v2: V2Steps, shots: list[str | None]) -> list[Step]:
    """A v2 folder's steps: its actions (with their status, and a screenshot URL that was not
    fetched), then the final step as an ``answer`` action, as webloop stores its own answers."""
    out = []
    last = len(v2.shots) - 1
    for i in range(last + 1):
        if i < last:
            action: dict[str, Any] = {"raw": v2.actions[i]}
            if v2.statuses[i] is not None:
                action["status"] = v2.statuses[i]
            text = v2.actions[i]
        else:
            action = {"type": "answer", "text": p.answer or ""}
            text = "answer(" + json.dumps(p.answer or "", ensure_ascii=False) + ")"
        url = p.screenshots[i].url
        if url is not None:
            action["screenshot_url"] = url
        out.append(
            Step(
                traj_id=tid,
                step_idx=i,
                url=v2.urls[i],
                screenshot_hash=shots[i],
                thought=v2.thoughts[i] or None,
                action=action,
                action_text=text,
            )
        )
    return out


def _task_versions(wh: Warehouse, batch: list[ParsedFolder]) -> dict[str, int]:
    """The task version each folder's trajectory refers to, storing tasks where needed.

    A task already stored with the folder's task text (and its start URL, when the folder names
    one) keeps its latest version: a ``result.json`` says less than a task file (no split, no
    difficulty), so importing it, or importing it again, must not make a new version. An unknown
    or changed task is stored by :func:`put_tasks` (a new version when it changed).
    """
    first: dict[str, ParsedFolder] = {}
    for p in batch:
        first.setdefault(p.task_id, p)
    latest = latest_tasks(wh, "task_id IN (SELECT unnest($ids))", {"ids": sorted(first)})
    known = {r["task_id"]: r for r in latest.iter_rows(named=True)}
    versions: dict[str, int] = {}
    to_store = []
    for task_id, p in first.items():
        row = known.get(task_id)
        if (
            row is not None
            and row["instruction"] == p.task
            and p.website in (None, row["start_url"])
        ):
            versions[task_id] = row["version"]
        else:
            to_store.append(_task(p))
    for task in put_tasks(wh, to_store).stored:
        versions[task.task_id] = task.version
    return versions


def _task(p: ParsedFolder) -> Task:
    return Task(
        task_id=p.task_id,
        suite=SUITE,
        site=p.website,
        instruction=p.task,
        start_url=p.website or "",
        # the human reference's step count, where the om2w task files keep it (task_formats)
        difficulty=p.v2.reference_length if p.v2 is not None else None,
        source="online-mind2web",
    )


def read_labels(path: str | Path, agent: str | None = None) -> dict[str, int]:
    """Read a human-label file into ``{task_id: 0|1|2}``; raise with the reason if malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WarehouseError(f"{path}: cannot read human labels ({exc})") from None
    return dict(_label_pairs(data, agent, path))


def _label_pairs(data: Any, agent: str | None, path: Path) -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        if agent is None:
            raise WarehouseError(f"{path}: labels for several agents {sorted(data)}: pick --agent")
        if agent not in data:
            raise WarehouseError(f"{path}: no labels for agent {agent!r} (have {sorted(data)})")
        yield from data[agent].items()
    elif isinstance(data, dict):
        yield from data.items()
    elif isinstance(data, list):
        for i, row in enumerate(data):
            if not isinstance(row, dict) or not isinstance(row.get("task_id"), str):
                raise WarehouseError(f"{path}: entry {i} is not an object with a task_id string")
            yield row["task_id"], _row_label(row, agent, path, i)
    else:
        raise WarehouseError(f"{path}: expected a JSON object or list of labels")


def _row_label(row: dict[str, Any], agent: str | None, path: Path, i: int) -> Any:
    if agent is not None:
        if agent not in row:
            raise WarehouseError(f"{path}: entry {i} has no label for agent {agent!r}")
        return row[agent]
    if "label" in row:
        return row["label"]
    cols = [k for k, v in row.items() if k not in ("task_id", "task") and isinstance(v, int)]
    if len(cols) == 1:
        return row[cols[0]]
    raise WarehouseError(f"{path}: entry {i} has labels for {cols}: pick --agent")


def _write_labels(
    wh: Warehouse,
    run_id: str,
    parsed: list[ParsedFolder],
    label_map: dict[str, Any],
    reviewer: str,
    source: str,
    rep: ImportReport,
) -> None:
    by_task = {}
    for p in parsed:
        by_task.setdefault(p.task_id, []).append(traj_id_for(run_id, p.task_id, p.sample_idx))
    rows = []
    for task_id, code in label_map.items():
        if isinstance(code, bool) or not isinstance(code, int) or code not in LABEL_NAMES:
            rep.label_problems.append(f"task {task_id!r}: label {code!r} is not 0, 1 or 2")
            continue
        if task_id not in by_task:
            rep.label_problems.append(f"task {task_id!r}: labelled but not among the imported")
            continue
        for tid in by_task[task_id]:
            rows.append(
                HumanLabel(
                    label_id=make_id("label", tid, None, reviewer),
                    traj_id=tid,
                    label=LABEL_NAMES[code],
                    reviewer=reviewer,
                    source=source,
                )
            )
    if rows:
        wh.write(rows)
    rep.labels_written = len(rows)


# ---------------------------------------------------------------------------------------------
# Export


SCHEMAS = ("v2", "v1")


@dataclass
class ExportReport:
    """What an export wrote: a folder per trajectory, and the trajectories it could not write
    in the schema asked for, with the reason."""

    schema: str = "v2"
    folders: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (traj_id, reason)


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MAX_NAME = 100


def folder_name(task_id: str, *, salt: str = "") -> str:
    """A file-system-safe folder name for a task id: ``[A-Za-z0-9._-]``, no leading dot, short.

    An id that is already such a name is kept as it is. Otherwise (``..``, ``a/b``, a very long
    id) the sanitized name gets a short hash of the original id, so two ids that sanitize alike
    (``a/b`` and ``a_b``) still get different folders. ``salt`` forces the hash (collisions).
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_id).lstrip(".") or "task"
    if safe == task_id and len(safe) <= _MAX_NAME and not salt:
        return safe
    digest = hashlib.sha256((task_id + "\0" + salt).encode("utf-8")).hexdigest()[:10]
    return f"{safe[:_MAX_NAME].rstrip('.')}-{digest}"


def export_om2w(wh: Warehouse, run_id: str, out: str | Path, *, schema: str = "v2") -> ExportReport:
    """Write a run's trajectories as Online-Mind2Web task folders under ``out``, in ``schema``
    ``v2`` (the default: what the upstream judge reads today) or ``v1``.

    v2 needs a screenshot at every step: a trajectory with a step that has none (a text-only
    policy's) is skipped with the reason (``ExportReport.skipped``), the rest are written.
    ``reference_length`` is the task's reference step count (an Online-Mind2Web task's
    ``reference_length``, a bundled task's reference solution), never the trajectory's own.

    Folder names come from task ids (see :func:`folder_name`), are unique within the export
    (case-insensitively, for macOS and Windows file systems) and always land directly in
    ``out``: nothing is written outside it, and a symlink found inside it is refused, not
    followed. ``out`` itself may not be a filesystem root nor a symlink
    (:func:`warehouse.outdir.check_out_dir`): refused before anything is written.
    """
    if schema not in SCHEMAS:
        raise WarehouseError(f"unknown Online-Mind2Web schema {schema!r}; known: v2, v1")
    out = check_out_dir(out)
    trajs = wh.sql(
        with_relations(
            "SELECT t.*, k.instruction, k.suite AS task_suite, k.difficulty AS task_difficulty, "
            "k.reference AS task_reference FROM trajectories t "
            "LEFT JOIN trajectory_tasks k USING (traj_id) "
            "WHERE t.run_id = ? ORDER BY t.task_id, t.sample_idx"
        ),
        [run_id],
    )
    if trajs.is_empty():
        raise WarehouseError(f"run {run_id!r} has no trajectories to export")
    per_task = trajs.group_by("task_id").len()
    multi = {r[0] for r in per_task.iter_rows() if r[1] > 1}
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    used: set[str] = set()
    rep = ExportReport(schema=schema)
    for t in trajs.iter_rows(named=True):
        steps = wh.sql("SELECT * FROM steps WHERE traj_id = ? ORDER BY step_idx", [t["traj_id"]])
        if schema == "v2":
            problem = _v2_problem(steps.to_dicts())
            if problem is not None:
                rep.skipped.append((t["traj_id"], problem))
                continue
        suffix = f"__s{t['sample_idx']}" if t["task_id"] in multi else ""
        name = folder_name(t["task_id"]) + suffix
        n = 0
        while name.casefold() in used:  # two ids sanitized alike: the hash tells them apart
            n += 1
            name = folder_name(t["task_id"], salt=str(n)) + suffix
        used.add(name.casefold())
        write = _export_v2 if schema == "v2" else _export_one
        rep.folders.append(write(wh, t, steps.to_dicts(), _inside(root, out / name)))
    return rep


def _inside(root: Path, path: Path) -> Path:
    """``path`` if writing there stays inside ``root`` (no ``..``, no symlink), else raise."""
    if path.is_symlink():
        raise WarehouseError(f"refusing to write through the symbolic link {path}")
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise WarehouseError(f"refusing to write {path}: it is outside the export folder {root}")
    return path


def _write_file(root: Path, path: Path, data: bytes) -> None:
    """Create or truncate a regular file inside ``root``, never following a symlink."""
    _inside(root, path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise WarehouseError(f"refusing to write through the symbolic link {path}") from None
        raise WarehouseError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _export_one(
    wh: Warehouse, t: dict[str, Any], steps: list[dict[str, Any]], folder: Path
) -> Path:
    """A v1 folder: action and thought lists, screenshots numbered by step."""
    root = folder.parent.resolve()
    shots = _trajectory_dir(root, folder)
    actions, thoughts = [], []
    for s in steps:
        if s["action_text"] is not None or s["step_idx"] < t["n_steps"] - 1:
            actions.append(s["action_text"] or "")
            thoughts.append(s["thought"] or "")
        if s["screenshot_hash"]:
            data = wh.blobs.get(s["screenshot_hash"])
            name = f"{int(s['step_idx'])}_full_screenshot{_ext(data)}"
            _write_file(root, shots / name, data)
    result = {
        "task_id": t["task_id"],
        "task": t["instruction"] or "",
        "final_result_response": t["answer"],
        "action_history": actions,
        "thoughts": thoughts,
        "webloop": _webloop_key(t),
    }
    text = json.dumps(result, indent=2, ensure_ascii=False)
    _write_file(root, folder / "result.json", text.encode("utf-8"))
    return folder


def _trajectory_dir(root: Path, folder: Path) -> Path:
    shots = _inside(root, folder / "trajectory")
    shots.mkdir(parents=True, exist_ok=True)
    return _inside(root, shots)


def _v2_problem(steps: list[dict[str, Any]]) -> str | None:
    """Why a trajectory cannot be written as v2 (None: it can)."""
    if not steps:
        return "no steps (v2 needs at least the final answer step with a screenshot)"
    for s in steps:
        if not s["screenshot_hash"] and not _action(s).get("screenshot_url"):
            return (
                f"step {s['step_idx']} has no screenshot (v2 needs one per step; "
                "--schema v1 writes screenshot-less steps)"
            )
    return None


def _export_v2(wh: Warehouse, t: dict[str, Any], steps: list[dict[str, Any]], folder: Path) -> Path:
    """A v2 folder: one object per step, the last the ``TASK_COMPLETE`` answer (a stored
    ``answer`` action, or one added after the last step when the trajectory has none)."""
    root = folder.parent.resolve()
    shots = _trajectory_dir(root, folder)
    history = []
    answered = _action(steps[-1]).get("type") == "answer"
    for i, s in enumerate(steps):
        action = _action(s)
        ref = action.get("screenshot_url")
        if s["screenshot_hash"]:
            data = wh.blobs.get(s["screenshot_hash"])
            ref = f"{i:04d}{_ext(data)}"
            _write_file(root, shots / ref, data)
        is_answer = answered and i == len(steps) - 1
        history.append(
            {
                "step": i,
                "screenshot": ref,
                "url": s["url"],
                "action": om2w_v2.final_action(t["answer"])
                if is_answer
                else (s["action_text"] or action.get("raw") or ""),
                "action_status": action.get("status")
                or ("FAILED" if s["action_error"] and not is_answer else None),
                "thought": s["thought"],
            }
        )
    if not answered:
        last = history[-1]
        history.append(
            {
                "step": len(history),
                "screenshot": last["screenshot"],  # the page the answer was given on
                "url": last["url"],
                "action": om2w_v2.final_action(t["answer"]),
                "action_status": None,
                "thought": None,
            }
        )
    text = om2w_v2.result_json(
        task_id=t["task_id"],
        task=t["instruction"] or "",
        reference_length=_reference_length(t),
        answer=t["answer"],
        steps=history,
        webloop=_webloop_key(t),
    )
    _write_file(root, folder / "result.json", text.encode("utf-8"))
    return folder


def _action(step: dict[str, Any]) -> dict[str, Any]:
    """A stored step's ``action`` as a dict (JSON text as the warehouse returns it, or None)."""
    value = step.get("action")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _reference_length(t: dict[str, Any]) -> int | None:
    """The task's reference step count: an Online-Mind2Web task's ``reference_length`` (kept as
    its difficulty, see ``task_formats``), a task's reference solution's length; else None."""
    if t.get("task_suite") == SUITE:
        return t.get("task_difficulty")
    ref = t.get("task_reference")
    if isinstance(ref, str):
        try:
            ref = json.loads(ref)
        except ValueError:
            return None
    return len(ref) if isinstance(ref, list) else None


def _webloop_key(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "traj_id": t["traj_id"],
        "run_id": t["run_id"],
        "policy": t["policy"],
        "sample_idx": t["sample_idx"],
        "status": t["status"],
    }


def _ext(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return ".png"
    if data.startswith(b"\xff\xd8"):
        return ".jpg"
    if data[8:12] == b"WEBP":
        return ".webp"
    return ".png"
