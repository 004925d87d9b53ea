"""The values a candidate carries: texts drawn from the instruction, answers drawn from the page.

:func:`instruction_values` lists what a task may type or select (quoted strings, the tail after
a colon, e-mails, dates, numbers, capitalised name-like spans and their words, 3-letter prefixes
of capitalised words); :func:`answer_spans` lists what a page node may answer (its whole text,
``key: value`` values, ``·``-separated parts, prices and numbers), each with the key it answers.
The patterns are shared with the exact-match features (:mod:`rollouts.ranker.features`).
"""

from __future__ import annotations

import re

from rollouts.ranker.tree import Node, cell_headers

MAX_VALUES = 40

QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|\'([^\']{2,})\'(?!\w)')
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
NUMBER = re.compile(r"(?<![\w.-])\d+(?:[.,]\d+)*(?![\w@])")
WORD = re.compile(r"[A-Za-z0-9][\w'’&.-]*")
CAP = re.compile(r"[A-Z][\w'’-]*")


def instruction_values(instruction: str) -> list[str]:
    """Texts a task may type or select, drawn from its instruction, most specific first."""
    out: list[str] = []

    def add(v: str) -> None:
        v = v.strip().strip(",;")
        if v and v not in out and len(v) <= 200:
            out.append(v)

    for m in QUOTED.finditer(instruction):
        add(next(g for g in m.groups() if g))
    if ": " in instruction:
        tail = instruction.rsplit(": ", 1)[1].strip()
        add(tail)
        add(tail.rstrip("."))
    for m in EMAIL.finditer(instruction):
        add(m.group())
    for m in DATE.finditer(instruction):
        add(m.group())
    unquoted = QUOTED.sub(" , ", instruction)
    unquoted = EMAIL.sub(" , ", unquoted)
    for chunk in re.split(
        r",|\(|\)|:|\?|\.(?:\s|$)| and | to | from | with | for | in | on ", unquoted
    ):
        words = chunk.split()
        for run in _cap_runs(words):
            add(" ".join(run))
            if len(run) > 1:
                for w in run:
                    add(w)
            for w in run:
                if CAP.fullmatch(w) and len(w) > 3:
                    add(w[:3])
    for m in NUMBER.finditer(instruction):
        add(m.group())
    return out[:MAX_VALUES]


def _cap_runs(words: list[str]) -> list[list[str]]:
    """Maximal runs of capitalised words (a leading number joins: ``30 Hamilton Street``;
    ``&`` joins two capitalised words)."""
    runs, cur = [], []
    for i, w in enumerate(words):
        w = w.strip(".,;!?")
        cap = bool(CAP.match(w)) or (w == "&" and cur and i + 1 < len(words))
        num = w.isdigit() and not cur and i + 1 < len(words) and CAP.match(words[i + 1])
        if cap or num:
            cur.append(w)
        else:
            if cur:
                runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [r for r in runs if r and r[-1] != "&"]


PRICE = re.compile(r"\$\s?\d[\d,]*(?:\.\d+)?")


def answer_spans(node: Node) -> list[tuple[str, str]]:
    """``(answer, key)`` pairs from one node's own text: the whole (key: the cell's headers),
    ``key: value`` values, ``·``-separated parts, prices and numbers (key: their part)."""
    text = " ".join(s for s in (node.name, node.text) if s).strip()
    if not text or len(text) > 300:
        return []
    cell_key = cell_headers(node) if node.role in ("cell", "gridcell") else ""
    spans = [(text, cell_key or text)] if len(text) <= 60 else []
    for part in re.split(r" · |\|", text):
        part = part.strip()
        spans.append((part, cell_key or part))
        if ": " in part:
            k, v = part.split(": ", 1)
            spans.append((v.strip(), k.strip()))
        spans += [(m, cell_key or part) for m in PRICE.findall(part)]
        spans += [(m.group(), cell_key or part) for m in NUMBER.finditer(part)]
    out = []
    for span, key in spans:
        span = span.strip(" .")
        if 0 < len(span) <= 60:
            out.append((span, key))
    return out


def answer_kind(span: str) -> str:
    if PRICE.fullmatch(span):
        return "price"
    if re.fullmatch(r"[\d.,]+", span):
        return "number"
    return "text"
