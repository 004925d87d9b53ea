"""Help text as a terminal reader wants it: docstrings and field help are written for the code
(reStructuredText roles, hard-wrapped lines), so before Typer shows them they lose their markup
and their line breaks (paragraphs stay), each command gets a one-line summary, and each command
group a few examples (:data:`EXAMPLES`)."""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

import typer
from typer.models import ParameterInfo

_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.S)
_SENTENCE_END = re.compile(r"(?<=\.)\s")
_LITERAL_MARK = re.compile(r"(?<=\w)::(?=\s|$)")  # "Example::" introducing a literal block


def plain(text: str | None) -> str:
    """``text`` without reStructuredText markup (roles and ````literals````), each paragraph on
    one line; paragraphs (blank-line separated) kept; lines of a literal block (indented, or
    after ``::``) kept as they are."""
    if not text:
        return ""
    text = _ROLE.sub(
        lambda m: (
            m.group(1).rsplit(".", 1)[-1]
            + ("()" if "(" not in m.group(1) and m.group(0).startswith(":func") else "")
        ),
        text,
    )
    text = _LITERAL.sub(lambda m: m.group(1).replace("\n", " "), text)
    paragraphs = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        if (
            lines
            and all(ln.startswith((" ", "$", "webloop ")) for ln in lines[1:])
            and len(lines) > 1
            and lines[0].endswith(":")
        ):
            paragraphs.append(para)
        else:
            paragraphs.append(_join(ln.strip() for ln in lines))
    return _LITERAL_MARK.sub(":", "\n\n".join(p for p in paragraphs if p))


def _join(lines: typing.Iterable[str]) -> str:
    """Lines of one paragraph as one line (a line ending in a hyphen joins without a space)."""
    out = ""
    for ln in lines:
        out += ln if not out or out.endswith("-") else " " + ln
    return out


def summary(text: str | None, limit: int = 90) -> str:
    """The first sentence of ``text`` (see :func:`plain`), on one line, at most ``limit`` long."""
    first = plain(text).split("\n\n")[0]
    cut = _SENTENCE_END.split(first, maxsplit=1)[0].rstrip(".;:")
    if len(cut) <= limit:
        return cut
    clause = max(cut.rfind(sep, 0, limit) for sep in ("; ", ": ", " ("))
    if clause > limit // 3:
        return cut[:clause]
    return cut[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def polish(app: typer.Typer, path: tuple[str, ...] = ()) -> None:
    """Give every command of ``app`` (recursively) plain help, a one-line summary and plain
    option help, and every group its examples (see the module docstring). Idempotent."""
    for info in app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        info.help, info.short_help = plain(doc), summary(doc)
        _polish_options(info.callback)
    if app.registered_callback is not None:
        _polish_options(app.registered_callback.callback)
    group = app.info
    if path and isinstance(group.help, str):
        group.help = plain(group.help)
    examples = EXAMPLES.get(" ".join(path))
    if examples and not group.epilog:
        group.epilog = "Examples:\n\n" + "\n\n".join(f"  webloop {e}" for e in examples)
    for sub in app.registered_groups:
        if sub.typer_instance is None:
            continue
        name = sub.name or sub.typer_instance.info.name
        if isinstance(sub.help, str):
            sub.help = plain(sub.help)
        own = sub.typer_instance.info.help
        text = sub.help if isinstance(sub.help, str) else own if isinstance(own, str) else ""
        if text and not isinstance(sub.short_help, str):
            sub.short_help = summary(text)
        polish(sub.typer_instance, (*path, str(name)))


def _polish_options(callback: Any) -> None:
    if callback is None:
        return
    for param in inspect.signature(callback).parameters.values():
        metas = [param.default, *typing.get_args(param.annotation)[1:]]
        for meta in metas:
            if isinstance(meta, ParameterInfo) and isinstance(meta.help, str):
                meta.help = plain(meta.help)


#: A few examples per command group ('' is the top level), shown under the group's ``--help``.
EXAMPLES: dict[str, list[str]] = {
    "": [
        "demo                          # the main job at CPU scale",
        "collect --policy expert --n-tasks 20",
        'sql "SELECT status, count(*) FROM trajectories GROUP BY 1"',
        "dashboard",
    ],
    "warehouse": ["warehouse info", "warehouse maintain", "warehouse attach-sql"],
    "import": ["import om2w ./results/my-agent --labels human_label.json"],
    "export": ["export om2w ./out --run RUN --schema v2"],
    "sites": ["sites serve --base-port 8701", "sites check --n 40"],
    "tasks": [
        "tasks generate --n 2000 --seed 0 --ood-site travel",
        "tasks list --site shop --split test",
        "tasks import om2w tasks.json",
    ],
    "tasks import": [
        "tasks import webvoyager WebVoyager_data.jsonl",
        "tasks import rubric my.jsonl",
    ],
    "judge": [
        "judge --judge programmatic --run RUN",
        "judge agreement --judge rubric_vlm --reference human",
        "judge flips --judge rubric_vlm",
    ],
    "score-steps": [
        "score-steps --scorer exact --k 4 --run RUN",
        "score-steps agreement --scorer vlm --reference exact",
    ],
    "models": ["models build-tiny ./tiny-vlm"],
    "datasets": ["datasets list", "datasets show filtered-bc", "datasets diff A B"],
    "train": [
        "train sft --dataset filtered-bc --model ranker",
        "train rl --policy CHECKPOINT --estimator step_grpo --n-tasks 16",
    ],
    "eval": ["eval --checkpoint CHECKPOINT --split test --n 300", "eval compare EVAL_A EVAL_B"],
    "checkpoints": ["checkpoints list", "checkpoints lineage CHECKPOINT"],
}
