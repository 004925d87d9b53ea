"""The ``ranker`` policy: MindAct-style candidate ranking over the accessibility tree.

The CPU-scale model path. At each step the prompt (exactly the text the shared prompt builder
writes, mode ``a11y`` or ``both``) is parsed back (:func:`parse_prompt`) into the instruction,
the previous actions, the page's title/URL and its accessibility tree; :func:`candidates` lists
the actions one could take there, in the shared grammar:

* ``click(ref)`` for every clickable element (buttons, links, checkboxes, ``[cursor=pointer]``…),
* ``type(ref, "v")`` for every text field × every value drawn from the instruction (quoted
  strings, the tail after a colon, e-mails, dates, numbers, capitalised name-like spans and their
  words, 3-letter prefixes of capitalised words),
* ``select(ref, "o")`` for every option of every combobox,
* ``answer("t")`` for text spans of the page (cells, ``key: value`` values, prices, numbers) and
  ``answer("done")``; and ``scroll(down)``.

Each candidate has two texts for the frozen MiniLM encoder (:mod:`rollouts.encoder`): the element
(role, name, surrounding text) and the value (typed text, option, answer), embedded separately so
that both repeat across steps and hit the text-hash cache, plus a vector of exact-match features
(:data:`FEATURES`). :class:`RankerModel` scores candidates with an MLP over the instruction,
page and last-action embeddings, the candidate's embeddings, their products, and the features;
the policy takes the top candidate (temperature 0) or samples softmax(scores / T).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rollouts.actions import (
    Action,
    Answer,
    Click,
    ParseError,
    Scroll,
    Select,
    Target,
    Type,
    format_action,
    parse_action,
)
from rollouts.batching import BatchWorker
from rollouts.encoder import DIM, MODEL_NAME, TextEncoder, default_encoder
from rollouts.policies import PolicyContext, PolicyOutput, register
from rollouts.prompts import SYSTEM_PROMPT, PromptConfig, build_messages

MODEL_TYPE = "webloop-ranker"
FEATURE_VERSION = 3
MAX_CANDIDATES = 400
MAX_ANSWERS = 80
MAX_VALUES = 40

# -- the prompt, parsed back ----------------------------------------------------------------------


class NotAWebloopPrompt(ValueError):
    """Text that is not a prompt of :func:`rollouts.prompts.build_messages`."""


@dataclass(frozen=True)
class RankerInput:
    """What the ranker reads from a prompt.

    ``instruction``: the task. ``history``: the previous action lines as written (``"click(e3)"``,
    a failure note stripped), ``failed``: whether each failed. ``title``/``url``: the current
    page. ``tree``: the accessibility-tree text (``""`` when the prompt has none)."""

    instruction: str
    history: tuple[str, ...]
    failed: tuple[bool, ...]
    title: str
    url: str
    tree: str

    @staticmethod
    def parse(prompt: str | Sequence[dict[str, Any]]) -> RankerInput:
        return parse_prompt(prompt)


_HISTORY = re.compile(r"^\d+\. (.*?)(  \(failed: .*\))?$")


def _user_text(messages: Sequence[dict[str, Any]]) -> str:
    if not messages or not all(isinstance(m, dict) for m in messages):
        raise NotAWebloopPrompt("a webloop prompt is a list of chat messages")
    system = next((m for m in messages if m.get("role") == "system"), None)
    if system is None or not str(system.get("content", "")).startswith(SYSTEM_PROMPT[:40]):
        raise NotAWebloopPrompt("the prompt has no webloop system message")
    user = next((m for m in messages if m.get("role") == "user"), None)
    content = user.get("content") if user else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        if texts:
            return texts[0]
    raise NotAWebloopPrompt("the prompt has no user text")


def parse_prompt(prompt: str | Sequence[dict[str, Any]]) -> RankerInput:
    """Parse the user message :func:`rollouts.prompts.build_messages` writes (messages, or their
    :func:`~rollouts.prompts.render` text). Raises :class:`NotAWebloopPrompt` otherwise."""
    if isinstance(prompt, str):
        try:
            prompt = json.loads(prompt)
        except json.JSONDecodeError as exc:
            raise NotAWebloopPrompt(f"the prompt is not rendered JSON messages ({exc})") from exc
        if not isinstance(prompt, list):
            raise NotAWebloopPrompt("the rendered prompt is not a list of messages")
    text = _user_text(prompt)
    if not text.startswith("Task: "):
        raise NotAWebloopPrompt("the user message does not start with 'Task: '")
    head, _, rest = text.partition("\n\nAccessibility tree of the current page")
    tree = ""
    if rest:
        m = re.search(r"<page>\n(.*)\n</page>", rest, re.S)
        tree = m.group(1) if m else ""
    lines = head.split("\n")
    instruction = lines[0][len("Task: ") :]
    history, failed = [], []
    title = url = ""
    for line in lines[1:]:
        if line.startswith("Current page: "):
            page = line[len("Current page: ") :]
            title, _, url = page.rpartition(" — ")
            continue
        m = _HISTORY.match(line)
        if m and not url:
            history.append(m.group(1))
            failed.append(m.group(2) is not None)
    return RankerInput(instruction, tuple(history), tuple(failed), title, url, tree)


# -- the accessibility tree -----------------------------------------------------------------------

_NODE = re.compile(
    r'^(?P<role>[a-z/][\w-]*)(?: "(?P<name>(?:[^"\\]|\\.)*)")?(?P<attrs>(?: \[[^\]]*\])*)'
    r"(?::(?: (?P<text>.*))?)?$"
)
_REF = re.compile(r"\[ref=((?:f\d+)?e\d+)\]")


@dataclass
class Node:
    """One line of the snapshot: ``role "name" [attrs]: text``, its children and parent."""

    role: str
    name: str
    attrs: tuple[str, ...]
    text: str
    depth: int
    ref: str | None
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    index: int = 0

    def all_text(self, limit: int = 200) -> str:
        """Name and text of the node and its descendants (``/url`` etc. left out)."""
        out: list[str] = []
        stack = [self]
        while stack and sum(len(s) for s in out) < limit:
            n = stack.pop(0)
            if not n.role.startswith("/"):
                out += [s for s in (n.name, n.text) if s]
            stack = n.children + stack
        return " ".join(out)[:limit]


def _unyaml(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] == "'":
        return s[1:-1].replace("''", "'")
    if len(s) >= 2 and s[0] == s[-1] == '"':
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s[1:-1]
    return s


def parse_tree(tree: str) -> list[Node]:
    """The nodes of an ``aria_snapshot(mode="ai")`` text, in document order."""
    nodes: list[Node] = []
    stack: list[Node] = []
    for raw in tree.split("\n"):
        stripped = raw.lstrip(" ")
        if not stripped.startswith("- "):
            continue
        depth = len(raw) - len(stripped)
        body = stripped[2:]
        if body.startswith("'") and ("':" in body or body.endswith("'")):
            end = body.rfind("'")
            body = body[1:end].replace("''", "'") + body[end + 1 :]
        m = _NODE.match(body)
        if m is None:
            continue
        name = m.group("name") or ""
        name = name.replace('\\"', '"')
        attrs = tuple(re.findall(r"\[([^\]]*)\]", m.group("attrs") or ""))
        ref = next((a[4:] for a in attrs if a.startswith("ref=")), None)
        node = Node(m.group("role"), name, attrs, _unyaml(m.group("text") or ""), depth, ref)
        while stack and stack[-1].depth >= depth:
            stack.pop()
        if stack:
            node.parent = stack[-1]
            stack[-1].children.append(node)
        node.index = len(nodes)
        nodes.append(node)
        stack.append(node)
    return nodes


CLICKABLE = {
    "button",
    "link",
    "checkbox",
    "radio",
    "tab",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "option",
    "switch",
    "treeitem",
    "combobox",
}
TEXT_FIELDS = {"textbox", "searchbox", "spinbutton"}
ANSWER_ROLES = {
    "cell",
    "gridcell",
    "rowheader",
    "paragraph",
    "generic",
    "text",
    "heading",
    "listitem",
    "definition",
    "term",
    "strong",
    "emphasis",
    "caption",
    "status",
}
CONTAINERS = {"row", "listitem", "article", "dialog", "form", "group", "region"}


def _context(node: Node) -> str:
    """Text around an element: its row / list item / a parent with some text, and the dialog it
    sits in."""
    ctx, p, hops = "", node.parent, 0
    while p is not None and hops < 4:
        if p.role in CONTAINERS or len(p.all_text(120)) > len(node.all_text(120)) + 8:
            ctx = p.all_text(160)
            break
        p, hops = p.parent, hops + 1
    dialog = node.parent
    while dialog is not None and dialog.role != "dialog":
        dialog = dialog.parent
    if dialog is not None:
        ctx = f"in dialog {dialog.name}; {ctx}"
    return ctx


def _current_value(node: Node) -> str:
    """A text field's current value (its ``: value`` or ``- text:`` child)."""
    if node.text:
        return node.text
    return " ".join(c.text for c in node.children if c.role == "text" and c.text)


def _label(node: Node) -> str:
    placeholder = next((c.text for c in node.children if c.role == "/placeholder"), "")
    return " ".join(s for s in (node.role, node.name, placeholder and f"({placeholder})") if s)


# -- values drawn from the instruction ------------------------------------------------------------

_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|\'([^\']{2,})\'(?!\w)')
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:[.,]\d+)*(?![\w@])")
_WORD = re.compile(r"[A-Za-z0-9][\w'’&.-]*")
_CAP = re.compile(r"[A-Z][\w'’-]*")


def instruction_values(instruction: str) -> list[str]:
    """Texts a task may type or select, drawn from its instruction, most specific first."""
    out: list[str] = []

    def add(v: str) -> None:
        v = v.strip().strip(",;")
        if v and v not in out and len(v) <= 200:
            out.append(v)

    for m in _QUOTED.finditer(instruction):
        add(next(g for g in m.groups() if g))
    if ": " in instruction:
        tail = instruction.rsplit(": ", 1)[1].strip()
        add(tail)
        add(tail.rstrip("."))
    for m in _EMAIL.finditer(instruction):
        add(m.group())
    for m in _DATE.finditer(instruction):
        add(m.group())
    unquoted = _QUOTED.sub(" , ", instruction)
    unquoted = _EMAIL.sub(" , ", unquoted)
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
                if _CAP.fullmatch(w) and len(w) > 3:
                    add(w[:3])
    for m in _NUMBER.finditer(instruction):
        add(m.group())
    return out[:MAX_VALUES]


def _cap_runs(words: list[str]) -> list[list[str]]:
    """Maximal runs of capitalised words (a leading number joins: ``30 Hamilton Street``;
    ``&`` joins two capitalised words)."""
    runs, cur = [], []
    for i, w in enumerate(words):
        w = w.strip(".,;!?")
        cap = bool(_CAP.match(w)) or (w == "&" and cur and i + 1 < len(words))
        num = w.isdigit() and not cur and i + 1 < len(words) and _CAP.match(words[i + 1])
        if cap or num:
            cur.append(w)
        else:
            if cur:
                runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [r for r in runs if r and r[-1] != "&"]


# -- answers drawn from the page -------------------------------------------------------------------

_PRICE = re.compile(r"\$\s?\d[\d,]*(?:\.\d+)?")


def _cell_key(node: Node) -> str:
    """The header(s) of a table cell: its row's row headers and its column's header."""
    row = node.parent
    if row is None or row.role != "row":
        return ""
    keys = [c.name for c in row.children if c.role == "rowheader" and c is not node]
    col = row.children.index(node)
    table = row.parent
    while table is not None and table.role not in ("table", "grid"):
        table = table.parent
    if table is not None:
        for r in (n for n in _descendants(table) if n.role == "row"):
            heads = [c for c in r.children if c.role == "columnheader"]
            if heads and len(r.children) > col and r.children[col].role == "columnheader":
                keys.append(r.children[col].name)
                break
    return " ".join(k for k in keys if k)


def _descendants(node: Node) -> list[Node]:
    out, stack = [], list(node.children)
    while stack:
        n = stack.pop(0)
        out.append(n)
        stack = n.children + stack
    return out


def _answer_spans(node: Node) -> list[tuple[str, str]]:
    """``(answer, key)`` pairs from one node's own text: the whole (key: the cell's headers),
    ``key: value`` values, ``·``-separated parts, prices and numbers (key: their part)."""
    text = " ".join(s for s in (node.name, node.text) if s).strip()
    if not text or len(text) > 300:
        return []
    cell_key = _cell_key(node) if node.role in ("cell", "gridcell") else ""
    spans = [(text, cell_key or text)] if len(text) <= 60 else []
    for part in re.split(r" · |\|", text):
        part = part.strip()
        spans.append((part, cell_key or part))
        if ": " in part:
            k, v = part.split(": ", 1)
            spans.append((v.strip(), k.strip()))
        spans += [(m, cell_key or part) for m in _PRICE.findall(part)]
        spans += [(m.group(), cell_key or part) for m in _NUMBER.finditer(part)]
    out = []
    for span, key in spans:
        span = span.strip(" .")
        if 0 < len(span) <= 60:
            out.append((span, key))
    return out


# -- candidates ----------------------------------------------------------------------------------

VERBS = ("click", "type", "select", "answer", "scroll")
FEATURES = (
    *(f"verb_{v}" for v in VERBS),
    "value_in_instruction",
    "value_quoted_in_instruction",
    "value_typed_before",
    "value_typed_into_this_before",
    "element_holds_value",
    "element_has_value",
    "ref_in_history",
    "ref_in_last_action",
    "action_repeats_history",
    "name_overlap",
    "context_overlap",
    "value_words",
    "value_is_prefix",
    "value_is_email",
    "value_is_date",
    "value_is_number",
    "value_is_price",
    "step",
    *(f"last_{v}" for v in ("none", "click", "type", "select", "other")),
    "in_dialog",
    "same_name_rank",
    "page_position",
    "answer_done",
    "last_failed",
    "option_selected",
    "key_overlap",
    "title_overlap",
    "value_position",
    "value_near_last_typed",
    "answer_kind_rank",
    "value_inside_typed",
)
N_FEATURES = len(FEATURES)


@dataclass(frozen=True)
class Candidate:
    """One action the ranker can choose: its grammar ``text``, the parsed ``action``, the two
    encoder texts (``element``: what it acts on; ``value``: what it types / selects / answers,
    ``""`` for none) and the exact-match ``features`` (:data:`FEATURES`, in order)."""

    text: str
    action: Action
    element: str
    value: str
    features: tuple[float, ...]


STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "for",
        "from",
        "with",
        "and",
        "or",
        "is",
        "are",
        "was",
        "what",
        "which",
        "this",
        "that",
        "these",
        "your",
        "my",
        "you",
        "by",
        "at",
        "it",
        "its",
        "s",
        "as",
        "be",
        "do",
        "does",
        "how",
        "much",
        "many",
    ]
)


def _tokens(s: str) -> set[str]:
    """Word stems (lowercase, first 5 characters), stop words left out."""
    return {w.lower()[:5] for w in _WORD.findall(s) if w.lower() not in STOPWORDS}


def _overlap(a: str, ref: set[str]) -> float:
    toks = _tokens(a)
    return len(toks & ref) / len(toks) if toks else 0.0


@dataclass
class _Ctx:
    inp: RankerInput
    instr_low: str
    instr_tokens: set[str]
    quoted: set[str]
    typed: dict[str, set[str]]  # value → refs it was typed/selected into
    history_refs: set[str]
    last_refs: set[str]
    history_actions: set[Action]
    last_verb: str
    n_nodes: int
    last_typed_end: int  # where the last typed value ends in the instruction (-1: none)
    title_overlap: float


def _history_info(
    inp: RankerInput,
) -> tuple[dict[str, set[str]], set[str], set[str], set[Action], str]:
    typed: dict[str, set[str]] = {}
    refs: set[str] = set()
    last_refs: set[str] = set()
    actions: set[Action] = set()
    last_verb = "none"
    for i, line in enumerate(inp.history):
        a = parse_action(line)
        line_refs = set(re.findall(r"\b((?:f\d+)?e\d+)\b", line))
        refs |= line_refs
        if i == len(inp.history) - 1:
            last_refs = line_refs
            last_verb = (
                type(a).__name__.lower() if isinstance(a, Click | Type | Select) else "other"
            )
        if isinstance(a, ParseError):
            continue
        actions.add(a)
        if isinstance(a, Type | Select):
            value = a.text if isinstance(a, Type) else a.value
            ref = a.target.ref if a.target is not None and a.target.ref else ""
            typed.setdefault(value, set()).add(ref)
    return typed, refs, last_refs, actions, last_verb


def _answer_kind(span: str) -> str:
    if _PRICE.fullmatch(span):
        return "price"
    if re.fullmatch(r"[\d.,]+", span):
        return "number"
    return "text"


def _last_typed_end(inp: RankerInput) -> int:
    """Where in the instruction the most recently typed (or selected) value ends; -1: none."""
    low = inp.instruction.lower()
    for line in reversed(inp.history):
        a = parse_action(line)
        if isinstance(a, Type | Select):
            v = (a.text if isinstance(a, Type) else a.value).lower()
            pos = low.find(v)
            if pos >= 0:
                return pos + len(v)
    return -1


def _features(
    c: _Ctx, verb: str, node: Node | None, value: str, action: Action, context: str, **kw: float
) -> tuple[float, ...]:
    ref = node.ref if node is not None else None
    low = value.lower()
    current = _current_value(node) if node is not None and node.role in TEXT_FIELDS else ""
    f = {name: 0.0 for name in FEATURES}
    f[f"verb_{verb}"] = 1.0
    if value:
        f["value_in_instruction"] = float(low in c.instr_low)
        f["value_quoted_in_instruction"] = float(value in c.quoted)
        f["value_typed_before"] = float(value in c.typed)
        f["value_typed_into_this_before"] = float(ref is not None and ref in c.typed.get(value, ()))
        f["value_words"] = min(len(value.split()), 10) / 10
        f["value_is_prefix"] = float(
            len(value) == 3 and re.search(rf"\b{re.escape(value)}\w", c.inp.instruction) is not None
        )
        f["value_is_email"] = float(bool(_EMAIL.fullmatch(value)))
        f["value_is_date"] = float(bool(_DATE.fullmatch(value)))
        f["value_is_number"] = float(bool(re.fullmatch(r"[\d.,]+", value)))
        f["value_is_price"] = float(bool(_PRICE.fullmatch(value)))
        f["element_holds_value"] = float(bool(current) and current.strip() == value)
    f["element_has_value"] = float(bool(current.strip()) and current.strip() != '"1"')
    if ref is not None:
        f["ref_in_history"] = float(ref in c.history_refs)
        f["ref_in_last_action"] = float(ref in c.last_refs)
    f["action_repeats_history"] = float(action in c.history_actions)
    if node is not None:
        f["name_overlap"] = _overlap(node.name or node.all_text(80), c.instr_tokens)
        f["page_position"] = node.index / max(1, c.n_nodes)
    f["context_overlap"] = _overlap(context, c.instr_tokens)
    f["step"] = min(len(c.inp.history), 30) / 10
    f[f"last_{c.last_verb}"] = 1.0
    f["in_dialog"] = float("in dialog" in context)
    f["last_failed"] = float(bool(c.inp.failed) and c.inp.failed[-1])
    f["title_overlap"] = c.title_overlap
    if value:
        found = [m.start() for m in re.finditer(re.escape(low), c.instr_low)]
        if found:
            anchor = max(c.last_typed_end, 0)
            pos = min(found, key=lambda k: abs(k - anchor))  # the occurrence nearest the work
            f["value_position"] = pos / max(1, len(c.instr_low))
            if c.last_typed_end >= 0:
                f["value_near_last_typed"] = math.exp(-abs(pos - c.last_typed_end) / 30)
        f["value_inside_typed"] = float(any(value in t and value != t for t in c.typed))
    for k, v in kw.items():
        f[k] = v
    return tuple(f[name] for name in FEATURES)


def candidates(inp: RankerInput, max_candidates: int = MAX_CANDIDATES) -> list[Candidate]:
    """The candidate actions at the prompt's page (deduplicated by parsed action, capped at
    ``max_candidates``; ``answer("done")`` and ``scroll(down)`` always included)."""
    nodes = parse_tree(inp.tree)
    typed, refs, last_refs, actions, last_verb = _history_info(inp)
    quoted = {next(g for g in m.groups() if g) for m in _QUOTED.finditer(inp.instruction)}
    c = _Ctx(
        inp,
        inp.instruction.lower(),
        _tokens(inp.instruction),
        quoted,
        typed,
        refs,
        last_refs,
        actions,
        last_verb,
        len(nodes),
        _last_typed_end(inp),
        _overlap(inp.title.split(" — ")[0], _tokens(inp.instruction)),
    )
    values = instruction_values(inp.instruction)
    out: dict[Action, Candidate] = {}

    def add(
        verb: str, node: Node | None, action: Action, element: str, value: str, **kw: float
    ) -> None:
        if action in out:
            return
        context = element
        feats = _features(c, verb, node, value, action, context, **kw)
        out[action] = Candidate(format_action(action), action, element, value, feats)

    seen_names: dict[tuple[str, str], int] = {}
    answers: list[tuple[Node, str, str, str]] = []
    for node in nodes:
        if node.ref is None:
            continue
        target = Target(ref=node.ref)
        ctx = _context(node)
        if node.role in TEXT_FIELDS or (node.role == "combobox" and not node.children):
            cur = _current_value(node)
            element = f"{_label(node)} = {cur}; {ctx}" if cur else f"{_label(node)}; {ctx}"
            for v in values:
                add("type", node, Type(v, target), element, v)
        elif node.role == "combobox":
            element = f"{node.role} {node.name}; {ctx}"
            for opt in node.children:
                if opt.role == "option" and opt.name:
                    sel = float("selected" in opt.attrs)
                    add(
                        "select",
                        node,
                        Select(target, opt.name),
                        element,
                        opt.name,
                        option_selected=sel,
                    )
        if node.role in CLICKABLE or "cursor=pointer" in node.attrs:
            if node.role == "combobox" and node.children:
                continue
            key = (node.role, node.name or node.all_text(60))
            rank = seen_names.get(key, 0)
            seen_names[key] = rank + 1
            state = " checked" if "checked" in node.attrs else ""
            element = f"{node.role}{state} {node.name or node.all_text(80)}; {ctx}"
            add("click", node, Click(target), element, "", same_name_rank=min(rank, 10) / 10)
        if node.role in ANSWER_ROLES or node.role in TEXT_FIELDS:
            for span, key in _answer_spans(node):
                answers.append((node, span, key, ctx))
    n_answers = 0
    kinds: dict[str, int] = {}
    for node, span, key, ctx in answers:
        if n_answers >= MAX_ANSWERS:
            break
        before = len(out)
        row = ctx if node.role in ("cell", "gridcell") else f"{node.all_text(80)}; {ctx}"
        element = f"answer {key} from {node.role}: {row}"
        kov = _overlap(key, c.instr_tokens)
        kind = _answer_kind(span)
        rank = kinds.get(kind, 0)
        if Answer(span) not in out:
            kinds[kind] = rank + 1
        add(
            "answer",
            node,
            Answer(span),
            element,
            span,
            key_overlap=kov,
            answer_kind_rank=min(rank, 10) / 10,
        )
        n_answers += len(out) - before
    add("answer", None, Answer("done"), "finish: the task is done", "done", answer_done=1.0)
    add("scroll", None, Scroll(0, 600), "scroll down the page", "")
    cands = list(out.values())
    if len(cands) > max_candidates:
        keep = cands[: max_candidates - 2] + cands[-2:]
        cands = keep
    return cands


def same_action(a: Action | ParseError, b: Action | ParseError) -> bool:
    """Two actions are the same by parsed value (not by string)."""
    return not isinstance(a, ParseError) and a == b


def target_action(completion: str) -> Action | ParseError:
    """The action of a reply: the last ``Action:`` line (the shared parser)."""
    return parse_action(completion)


def target_index(cands: Sequence[Candidate], completion: str) -> int | None:
    """The index of the reply's action among ``cands``, or None when it is not a candidate."""
    target = target_action(completion)
    if isinstance(target, ParseError):
        return None
    return next((i for i, c in enumerate(cands) if c.action == target), None)


def oracle_coverage(rows: Sequence[Any]) -> float:
    """Share of steps whose target action is among the candidates. A row is a mapping with
    ``prompt`` (rendered messages) and ``completion`` (or ``action_text``), or an object with
    those attributes (a training :class:`~training.interface.Turn`)."""
    if not rows:
        raise ValueError("oracle_coverage of no rows")
    hits = 0
    for r in rows:
        get = r.get if isinstance(r, dict) else (lambda k, d=None, r=r: getattr(r, k, d))
        completion = get("completion") or f"Action: {get('action_text')}"
        hits += target_index(candidates(parse_prompt(get("prompt"))), completion) is not None
    return hits / len(rows)


# -- encoding ------------------------------------------------------------------------------------


def context_texts(inp: RankerInput) -> tuple[str, str, str]:
    """The three context texts: instruction, page (title and URL path), last action."""
    path = re.sub(r"^\w+://[^/]+", "", inp.url)
    page = f"{inp.title} — {path}"
    last = inp.history[-1] if inp.history else "no previous action"
    last = re.sub(r"\b(?:f\d+)?e\d+\b", "element", last)
    return inp.instruction, page, f"last action: {last}"


@dataclass
class Encoded:
    """A prompt made ready for the scorer: context vectors ``ctx [3, D]``, candidate element and
    value vectors ``elem``/``value [C, D]`` and ``features [C, F]`` (numpy float32)."""

    candidates: list[Candidate]
    ctx: np.ndarray
    elem: np.ndarray
    value: np.ndarray
    features: np.ndarray


def encode_input(
    inp: RankerInput, encoder: TextEncoder | None = None, cands: list[Candidate] | None = None
) -> Encoded:
    """Candidates of a prompt (``cands``: already listed) and their embeddings (one encoder
    call, cached by text)."""
    enc = encoder or default_encoder()
    cands = candidates(inp) if cands is None else cands
    return encoded(cands, enc.encode(encoder_texts(inp, cands)))


def encoded(cands: list[Candidate], vec: np.ndarray) -> Encoded:
    """A prompt's :class:`Encoded` from its candidates and the vectors of its
    :func:`encoder_texts` (in that order)."""
    n = len(cands)
    value = vec[3 + n :].copy()
    value[[i for i, c in enumerate(cands) if not c.value]] = 0.0
    feats = np.array([c.features for c in cands], np.float32).reshape(n, N_FEATURES)
    return Encoded(cands, vec[:3], vec[3 : 3 + n], value, feats)


def encoder_texts(inp: RankerInput, cands: Sequence[Candidate]) -> list[str]:
    """The texts :func:`encode_input` embeds: 3 context texts, then each candidate's element,
    then each candidate's value."""
    return [
        *context_texts(inp),
        *(c.element for c in cands),
        *(c.value or "none" for c in cands),
    ]


# -- the scorer ----------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``RankerModel`` is built on first access, so importing this module does not import
    torch (1-2 s): the policy registry and the CLI's ``--policy`` check need only the names."""
    if name == "RankerModel":
        return _ranker_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _ranker_model_class() -> type:
    """The :class:`RankerModel` class (a ``torch.nn.Module``), defined once, on first use."""
    import torch

    class RankerModel(torch.nn.Module):
        """The scorer over frozen MiniLM vectors and exact-match features.

        ``q``/``p``/``h``: the instruction, page and last-action vectors; ``e``/``v``: the
        candidate's element and value vectors (384 wide). Context vectors go through a learnt
        projection ``Wc`` and candidate vectors through ``Wk`` (``proj`` wide), so the products
        ``q'·e'``, ``q'·v'``, ``e'·v'``, ``h'·e'``, ``p'·e'`` are learnt bilinear interactions;
        the raw cosine similarities of those pairs and the features join them in an MLP → one
        score.

        A HF-like folder: :meth:`save_pretrained` writes ``config.json`` (``model_type``
        ``webloop-ranker``, the encoder's name, the feature set and its version) and
        ``model.safetensors``; :meth:`from_pretrained` reads it back."""

        PAIRS = ((0, 3), (0, 4), (3, 4), (2, 3), (1, 3))  # (q,e) (q,v) (e,v) (h,e) (p,e)

        def __init__(
            self,
            hidden: int = 256,
            dim: int = DIM,
            n_features: int = N_FEATURES,
            dropout: float = 0.1,
            seed: int = 0,
            proj: int = 128,
        ) -> None:
            super().__init__()
            self.config = {
                "model_type": MODEL_TYPE,
                "encoder": MODEL_NAME,
                "feature_version": FEATURE_VERSION,
                "features": list(FEATURES),
                "hidden": hidden,
                "dim": dim,
                "n_features": n_features,
                "dropout": dropout,
                "seed": seed,
                "proj": proj,
            }
            gen = torch.Generator().manual_seed(seed)
            self.ctx_proj = torch.nn.Linear(dim, proj)
            self.cand_proj = torch.nn.Linear(dim, proj)
            n_in = 5 * proj + len(self.PAIRS) * (proj + 1) + n_features
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(n_in, hidden),
                torch.nn.GELU(),
                torch.nn.Dropout(dropout),
                torch.nn.Linear(hidden, hidden),
                torch.nn.GELU(),
                torch.nn.Linear(hidden, 1),
            )
            with torch.no_grad():
                for p in self.parameters():
                    if p.dim() == 2:
                        bound = 1 / math.sqrt(p.shape[1])
                        p.copy_(torch.empty_like(p).uniform_(-bound, bound, generator=gen))
                    else:
                        p.zero_()

        def forward(self, ctx: Any, elem: Any, value: Any, features: Any, seg: Any) -> Any:
            """Scores ``[N]`` of ``N`` candidates; ``ctx [B, 3, D]``, ``elem``/``value [N, D]``,
            ``features [N, F]``, ``seg [N]``: each candidate's prompt index in the batch."""
            raw = [ctx[seg, 0], ctx[seg, 1], ctx[seg, 2], elem, value]
            c = self.ctx_proj(ctx)
            vecs = [c[seg, 0], c[seg, 1], c[seg, 2], self.cand_proj(elem), self.cand_proj(value)]
            parts = list(vecs)
            for i, j in self.PAIRS:
                parts.append(vecs[i] * vecs[j])
                parts.append((raw[i] * raw[j]).sum(-1, keepdim=True))
            parts.append(features)
            return self.mlp(torch.cat(parts, dim=-1)).squeeze(-1)

        def save_pretrained(self, path: str | Path) -> None:
            from safetensors.torch import save_file

            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
            state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

        @classmethod
        def from_pretrained(cls, path: str | Path) -> Any:
            from safetensors.torch import load_file

            folder = Path(path)
            cfg_file = folder / "config.json"
            if not cfg_file.exists():
                raise FileNotFoundError(f"{folder}: no config.json (not a ranker checkpoint)")
            cfg = json.loads(cfg_file.read_text())
            if cfg.get("model_type") != MODEL_TYPE:
                raise ValueError(
                    f"{cfg_file}: model_type is {cfg.get('model_type')!r}, not {MODEL_TYPE!r}"
                )
            version, features = cfg.get("feature_version"), cfg.get("features")
            if version != FEATURE_VERSION or features != list(FEATURES):
                raise ValueError(
                    f"{cfg_file}: feature set version {cfg.get('feature_version')} does not match "
                    f"this code's {FEATURE_VERSION}: retrain the ranker"
                )
            if cfg.get("encoder") != MODEL_NAME:
                raise ValueError(
                    f"{cfg_file}: encoder {cfg.get('encoder')!r} is not {MODEL_NAME!r}"
                )
            keys = ("hidden", "dim", "n_features", "dropout", "seed", "proj")
            model = cls(*(cfg[k] for k in keys))
            model.load_state_dict(load_file(str(folder / "model.safetensors")))
            return model.eval()

    RankerModel.__qualname__ = "RankerModel"
    RankerModel.__module__ = __name__
    return RankerModel


def batch_tensors(items: Sequence[Encoded]) -> tuple[Any, ...]:
    """``(ctx, elem, value, features, seg)`` tensors of a batch of encoded prompts."""
    import torch

    ctx = torch.from_numpy(np.stack([e.ctx for e in items]))
    elem = torch.from_numpy(np.concatenate([e.elem for e in items]))
    value = torch.from_numpy(np.concatenate([e.value for e in items]))
    feats = torch.from_numpy(np.concatenate([e.features for e in items]))
    seg = torch.cat(
        [torch.full((len(e.candidates),), i, dtype=torch.long) for i, e in enumerate(items)]
    )
    return ctx, elem, value, feats, seg


def segment_log_softmax(scores: Any, seg: Any, n: int) -> Any:
    """Log-softmax of ``scores [N]`` within each segment (``seg [N]`` in ``0..n-1``)."""
    import torch

    big = torch.full((n,), -torch.inf, dtype=scores.dtype)
    mx = big.scatter_reduce(0, seg, scores, reduce="amax", include_self=True).detach()
    ex = torch.exp(scores - mx[seg])
    tot = torch.zeros(n, dtype=scores.dtype).index_add(0, seg, ex)
    return scores - mx[seg] - torch.log(tot)[seg]


# -- the policy ----------------------------------------------------------------------------------


@register("ranker")
class RankerPolicy:
    """The candidate ranker as a rollout policy.

    ``model_path``: a folder written by :meth:`RankerModel.save_pretrained` (None: a random,
    ``seed``-initialised model — a valid, untrained policy). ``temperature`` 0: the top-scored
    candidate; above 0: a sample of softmax(scores / T) drawn with the episode's ``ctx.rng``.
    ``logprob``: the chosen candidate's log-probability under softmax(scores) (T = 1).
    ``prompt``: the prompt config; its mode must include the accessibility tree."""

    name = "ranker"

    def __init__(
        self,
        model_path: str | Path | None = None,
        temperature: float = 0.0,
        prompt: PromptConfig | None = None,
        seed: int = 0,
        model: Any = None,
        encoder: TextEncoder | None = None,
    ) -> None:
        self.prompt = prompt or PromptConfig(mode="a11y")
        if self.prompt.mode not in ("a11y", "both"):
            raise ValueError(
                f"the ranker reads the accessibility tree: prompt mode "
                f"{self.prompt.mode!r} has none (use a11y or both)"
            )
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if model is None:
            cls = _ranker_model_class()
            model = cls.from_pretrained(model_path) if model_path else cls(seed=seed)
        self.model = model.eval()
        self.temperature = float(temperature)
        self.encoder = encoder or default_encoder()
        # concurrent episodes' prompts are ranked together (one encoder call for their new texts)
        self._worker = BatchWorker(self.rank_many, max_batch=64, name="ranker")

    def rank(self, messages: list[dict[str, Any]]) -> tuple[list[Candidate], np.ndarray]:
        """Candidates of the prompt and their scores (no sampling)."""
        return self.rank_many([messages])[0]

    def rank_many(
        self, prompts: Sequence[list[dict[str, Any]]]
    ) -> list[tuple[list[Candidate], np.ndarray]]:
        """:meth:`rank` of several prompts: their new texts in one encoder call (the expensive
        part), then each prompt through the scorer on its own. A prompt's scores are the same
        bits whatever it was ranked with (the encodings are a function of the text alone), so
        batching never changes what a run does."""
        import torch

        inputs = [parse_prompt(m) for m in prompts]
        listed = [candidates(inp) for inp in inputs]
        self.encoder.encode(
            [t for inp, c in zip(inputs, listed, strict=True) for t in encoder_texts(inp, c)]
        )
        out = []
        for inp, cands in zip(inputs, listed, strict=True):
            enc = encode_input(inp, self.encoder, cands)
            with torch.no_grad():
                scores = self.model(*batch_tensors([enc]))
            out.append((enc.candidates, scores.numpy().astype(np.float64)))
        return out

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        messages = build_messages(
            ctx.instruction, ctx.turns, self.prompt, ctx.memory.get("summary")
        )
        start = time.perf_counter()
        cands, scores = await self._worker.submit(messages)
        logp = _log_softmax(scores)
        if self.temperature == 0.0:
            i = int(np.argmax(scores))
        else:
            z = scores / self.temperature
            p = np.exp(z - z.max())
            p /= p.sum()
            i = int(np.searchsorted(np.cumsum(p), ctx.rng.random() * p.sum(), side="right"))
            i = min(i, len(cands) - 1)
        text = f"Action: {cands[i].text}"
        return PolicyOutput(
            text, parse_action(text), float(logp[i]), time.perf_counter() - start, messages
        )

    async def aclose(self) -> None:
        """Stop the ranking thread (a later call starts it again)."""
        self._worker.close()

    async def top_k(self, ctx: PolicyContext, k: int) -> list[PolicyOutput]:
        """The ``k`` most likely distinct actions at the context's state, best first (the
        process reward model's candidates: the policy's choice and its runners-up, where
        samples of a confident policy would all be the same action)."""
        messages = build_messages(
            ctx.instruction, ctx.turns, self.prompt, ctx.memory.get("summary")
        )
        start = time.perf_counter()
        cands, scores = await self._worker.submit(messages)
        logp, took = _log_softmax(scores), time.perf_counter() - start
        out = []
        for i in np.argsort(-scores, kind="stable")[:k]:
            text = f"Action: {cands[i].text}"
            out.append(PolicyOutput(text, parse_action(text), float(logp[i]), took, messages))
        return out


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    logp = scores - scores.max()
    return logp - np.log(np.exp(logp).sum())


def prompt_key(prompt: str) -> str:
    """The cache key of a rendered prompt."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()
