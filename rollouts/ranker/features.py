"""The exact-match features of a candidate (:data:`FEATURES`, in order; :data:`FEATURE_VERSION`).

Beside the encoder's vectors, each candidate carries a vector of exact-match signals: its verb,
whether its value is in the instruction (quoted, typed before, into this element), what kind of
value it is, whether its element was acted on before, word overlap of the element, its context,
the answer's key and the page title with the instruction, where in the instruction the value
sits relative to the last typed one, whether the element (by role and name, which survive a
page change, unlike refs) was acted on before, whether the words before the value in the
instruction name the field (``from`` Paris → the "From" field: slot binding), and so on. Refs
are compared with history entries taken on the current page only (Playwright renumbers them on
every page). :func:`feature_vector` computes them from a
:class:`FeatureContext` (what the prompt's instruction and history say, computed once per
prompt). A checkpoint records the feature names and version; a change here means retraining.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from rollouts.actions import Action, Click, ParseError, Select, Type, parse_action
from rollouts.prompts import element_label
from rollouts.ranker.prompt import RankerInput
from rollouts.ranker.tree import TEXT_FIELDS, Node, current_value, field_label
from rollouts.ranker.values import DATE, EMAIL, PRICE, WORD

FEATURE_VERSION = 5
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
    "target_in_history",
    "target_in_last_action",
    "slot_binding",
    "value_after_progress",
    "progress",
    "name_matches_last_typed",
    "links_followed",
    "name_is_visited_page",
    "value_on_page",
    "values_on_page",
    "value_in_page_clause",
)
N_FEATURES = len(FEATURES)


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


def word_stems(s: str) -> set[str]:
    """Word stems (lowercase, first 5 characters), stop words left out."""
    return {w.lower()[:5] for w in WORD.findall(s) if w.lower() not in STOPWORDS}


def overlap(a: str, ref: set[str]) -> float:
    toks = word_stems(a)
    return len(toks & ref) / len(toks) if toks else 0.0


@dataclass
class FeatureContext:
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
    targets: frozenset[str] = frozenset()  # elements acted on before (role "name")
    last_target: str = ""
    progress_end: int = -1  # the furthest end of a typed value in the instruction (-1: none)
    last_value_stems: frozenset[str] = frozenset()  # word stems of the latest typed value
    links_followed: int = 0
    visited: frozenset[str] = frozenset()  # names of the pages seen (:func:`page_name`)
    tree_low: str = ""  # the page's tree text, lowercase
    values_on_page: float = 0.0  # share of the instruction's many-word values the page shows
    page_clause: str = ""  # the instruction's clause that names this page's subject (lowercase)


def history_info(
    inp: RankerInput,
) -> tuple[dict[str, set[str]], set[str], set[str], set[Action], str]:
    typed: dict[str, set[str]] = {}
    refs: set[str] = set()
    last_refs: set[str] = set()
    actions: set[Action] = set()
    last_verb = "none"
    for i, line in enumerate(inp.history):
        a = parse_action(line)
        here = inp.on_this_page(i)  # refs name this page's elements only if taken on it
        line_refs = set(re.findall(r"\b((?:f\d+)?e\d+)\b", line)) if here else set()
        refs |= line_refs
        if i == len(inp.history) - 1:
            last_refs = line_refs
            last_verb = (
                type(a).__name__.lower() if isinstance(a, Click | Type | Select) else "other"
            )
        if isinstance(a, ParseError):
            continue
        if isinstance(a, Type | Select):  # values count on every page, refs on this one only
            value = a.text if isinstance(a, Type) else a.value
            ref = a.target.ref if here and a.target is not None and a.target.ref else ""
            typed.setdefault(value, set()).add(ref)
        if here:
            actions.add(a)
    return typed, refs, last_refs, actions, last_verb


def typed_values(inp: RankerInput) -> list[str]:
    """The values typed or selected so far, oldest first, on every page (the prompt's history
    parsed once; :func:`last_typed_end` and :func:`progress_end` read it)."""
    out = []
    for line in inp.history:
        a = parse_action(line)
        if isinstance(a, Type | Select):
            out.append(a.text if isinstance(a, Type) else a.value)
    return out


def last_typed_end(instr_low: str, typed: list[str]) -> int:
    """Where in the instruction the most recently typed (or selected) value it contains ends;
    -1: none."""
    for v in reversed(typed):
        pos = instr_low.find(v.lower())
        if pos >= 0:
            return pos + len(v)
    return -1


def progress_end(instr_low: str, typed: list[str]) -> int:
    """How far through the instruction the work has got: the furthest end, in the instruction,
    of any value typed or selected so far (on any page); -1: none. Multi-item tasks ("add A,
    B and C") name their items in order, so the items after it are the ones still to do."""
    ends = [instr_low.find(v.lower()) + len(v) for v in typed if v and v.lower() in instr_low]
    return max(ends, default=-1)


def page_subject(title: str) -> str:
    """A page title without its site suffix (``"Paris — Openpedia"`` → ``"Paris"``)."""
    return re.split(r" [—|-] ", title, maxsplit=1)[0].strip()


def page_name(title: str) -> str:
    """:func:`page_subject`, lowercase: how pages are compared with element names."""
    return page_subject(title).lower()


def links_followed(inp: RankerInput) -> int:
    """How many earlier clicks opened a page named like the element clicked (``link "Lyon"``
    → the page "Lyon — Openpedia"): the hops of a chain of links followed so far."""
    if not inp.pages:
        return 0  # a format-1 prompt names no pages
    pages = [*inp.pages[1:], inp.title]
    hops = 0
    for i, target in enumerate(inp.targets):
        name = re.match(r'^[a-z][\w-]* "(.*)"$', target or "")
        after = pages[i] if i < len(pages) else None
        if (
            name is not None
            and after is not None
            and inp.history[i].startswith("click(")
            and name.group(1).strip().lower() == page_name(after)
        ):
            hops += 1
    return hops


_CLAUSE = re.compile(r",\s+|\s+and\s+|[.;:?!]\s+")


def page_clause(instruction: str, title: str) -> str:
    """The clause of the instruction (split at commas, "and", sentence ends) that names the
    current page's subject as a proper name (``"Blue Kettle — Shoply"`` → ``"2 × the blue
    kettle in red"``, lowercase): the values in it belong to the item this page is about.
    ``""``: the instruction does not name the page (a "Cart" page is not "shopping cart")."""
    name = page_subject(title)
    if len(name) < 3 or not name[0].isupper():
        return ""
    hit = next(
        (c for c in _CLAUSE.split(instruction) if re.search(rf"\b{re.escape(name)}\b", c)), ""
    )
    return hit.lower()


def has_words(text: str, value: str) -> bool:
    """Whether ``value`` occurs in ``text`` as whole words (size ``l`` is not in "blue")."""
    return bool(value) and re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def values_on_page(values: list[str], tree_low: str) -> float:
    """The share of the instruction's many-word values (items, names, addresses) the page's
    tree shows: how much of what the task names is already there (a cart holding every item)."""
    many = [v.lower() for v in values if " " in v.strip()]
    return sum(has_words(tree_low, v) for v in many) / len(many) if many else 0.0


def node_target(node: Node) -> str:
    """An element as a history line names it (:func:`rollouts.prompts.element_label`)."""
    return element_label(node.role, node.name)


_LEAD = re.compile(r"[A-Za-z]+")
_SKIP = frozenset(["the", "a", "an", "my", "your"])


def slot_binding(instr_low: str, value_low: str, label: str) -> float:
    """How closely the words just before the value in the instruction name the field: 1 when
    the nearest word (articles skipped) is a word of the field's label (``from`` Paris → the
    "From" field, ``to`` bob@x.org → "To"), 1/2 for the second nearest ("search for X"), else 0
    (further back, the words belong to the slot before: "from A to B" does not bind B to
    "From"); the best occurrence of the value counts. Stop words count: they are the binding."""
    words = {w.lower() for w in _LEAD.findall(label)}
    if not value_low or not words:
        return 0.0
    best = 0.0
    for m in re.finditer(re.escape(value_low), instr_low):
        before = [w for w in _LEAD.findall(instr_low[: m.start()])[-5:] if w not in _SKIP]
        for k, w in enumerate(reversed(before[-2:]), start=1):
            if w in words:
                best = max(best, 1 / k)
                break
    return best


def feature_vector(
    c: FeatureContext,
    verb: str,
    node: Node | None,
    value: str,
    action: Action,
    context: str,
    **kw: float,
) -> tuple[float, ...]:
    ref = node.ref if node is not None else None
    low = value.lower()
    current = current_value(node) if node is not None and node.role in TEXT_FIELDS else ""
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
        f["value_is_email"] = float(bool(EMAIL.fullmatch(value)))
        f["value_is_date"] = float(bool(DATE.fullmatch(value)))
        f["value_is_number"] = float(bool(re.fullmatch(r"[\d.,]+", value)))
        f["value_is_price"] = float(bool(PRICE.fullmatch(value)))
        f["element_holds_value"] = float(bool(current) and current.strip() == value)
    f["element_has_value"] = float(bool(current.strip()) and current.strip() != '"1"')
    if ref is not None:
        f["ref_in_history"] = float(ref in c.history_refs)
        f["ref_in_last_action"] = float(ref in c.last_refs)
    f["action_repeats_history"] = float(action in c.history_actions)
    if node is not None:
        f["name_overlap"] = overlap(node.name or node.all_text(80), c.instr_tokens)
        f["page_position"] = node.index / max(1, c.n_nodes)
    f["context_overlap"] = overlap(context, c.instr_tokens)
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
    if node is not None and (c.targets or c.last_target):
        target = node_target(node)
        f["target_in_history"] = float(target in c.targets)
        f["target_in_last_action"] = float(target == c.last_target)
    if value and node is not None and verb in ("type", "select"):
        label = " ".join(s for s in (node.name, field_label(node)) if s)
        f["slot_binding"] = slot_binding(c.instr_low, low, label.replace(node.role, ""))
    _progress_features(f, c, node, low)
    for k, v in kw.items():
        f[k] = v
    return tuple(f[name] for name in FEATURES)


def _progress_features(f: dict[str, float], c: FeatureContext, node: Node | None, low: str) -> None:
    """The features of progress through the task (all pages count): whether the value lies
    after the furthest typed value in the instruction, how far that is, whether the element
    is named like the latest typed value (the search result of the query), how many links
    were followed, whether the element is named like a page already visited, whether the page
    already shows the value (an item the cart lists) and how much of the instruction's values it
    shows, whether the value is in the clause naming this page's item (its quantity, colour)."""
    n = max(1, len(c.instr_low))
    f["progress"] = max(c.progress_end, 0) / n
    if low and c.progress_end >= 0:
        f["value_after_progress"] = float(c.instr_low.find(low, c.progress_end) >= 0)
    f["links_followed"] = min(c.links_followed, 5) / 5
    if node is not None:
        name = (node.name or "").strip()
        if name and c.last_value_stems:
            f["name_matches_last_typed"] = len(word_stems(name) & c.last_value_stems) / len(
                c.last_value_stems
            )
        f["name_is_visited_page"] = float(bool(name) and name.lower() in c.visited)
    f["values_on_page"] = c.values_on_page
    if low and f["verb_type"] + f["verb_select"]:
        f["value_on_page"] = float(has_words(c.tree_low, low))
        f["value_in_page_clause"] = float(has_words(c.page_clause, low))
