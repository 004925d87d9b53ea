"""The candidate actions at a prompt's page, in the shared grammar, and the reply's target.

:func:`candidates` lists ``click(ref)`` for every clickable element, ``type(ref, "v")`` for every
text field × every value drawn from the instruction, ``select(ref, "o")`` for every option of
every combobox, ``answer("t")`` for text spans of the page and ``answer("done")``, and
``scroll(down)``; each :class:`Candidate` carries its two encoder texts and its features.
:func:`target_index` finds a model reply's action among them (by parsed value), and
:func:`oracle_coverage` is the share of steps whose target is a candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
from rollouts.ranker.features import (
    FeatureContext,
    feature_vector,
    history_info,
    last_typed_end,
    links_followed,
    overlap,
    page_clause,
    page_name,
    progress_end,
    typed_values,
    values_on_page,
    word_stems,
)
from rollouts.ranker.prompt import RankerInput, parse_prompt
from rollouts.ranker.tree import (
    ANSWER_ROLES,
    CLICKABLE,
    TEXT_FIELDS,
    Node,
    current_value,
    element_context,
    field_label,
    parse_tree,
)
from rollouts.ranker.values import QUOTED, answer_kind, answer_spans, instruction_values

MAX_CANDIDATES = 400
MAX_ANSWERS = 80


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


def candidates(inp: RankerInput, max_candidates: int = MAX_CANDIDATES) -> list[Candidate]:
    """The candidate actions at the prompt's page (deduplicated by parsed action, capped at
    ``max_candidates``; ``answer("done")`` and ``scroll(down)`` always included)."""
    nodes = parse_tree(inp.tree)
    typed, refs, last_refs, actions, last_verb = history_info(inp)
    quoted = {next(g for g in m.groups() if g) for m in QUOTED.finditer(inp.instruction)}
    instr_low, in_order = inp.instruction.lower(), typed_values(inp)
    values = instruction_values(inp.instruction)
    tree_low = inp.tree.lower()
    c = FeatureContext(
        inp,
        instr_low,
        word_stems(inp.instruction),
        quoted,
        typed,
        refs,
        last_refs,
        actions,
        last_verb,
        len(nodes),
        last_typed_end(instr_low, in_order),
        overlap(inp.title.split(" — ")[0], word_stems(inp.instruction)),
        frozenset(t for t in inp.targets if t),
        inp.targets[-1] if inp.targets else "",
        progress_end(instr_low, in_order),
        frozenset(word_stems(in_order[-1] if in_order else "")),
        links_followed(inp),
        frozenset(page_name(p) for p in (*inp.pages, inp.title) if p),
        tree_low,
        values_on_page(values, tree_low),
        page_clause(inp.instruction, inp.title),
    )
    out: dict[Action, Candidate] = {}

    def add(
        verb: str, node: Node | None, action: Action, element: str, value: str, **kw: float
    ) -> None:
        if action in out:
            return
        context = element
        feats = feature_vector(c, verb, node, value, action, context, **kw)
        out[action] = Candidate(format_action(action), action, element, value, feats)

    seen_names: dict[tuple[str, str], int] = {}
    answers: list[tuple[Node, str, str, str]] = []
    for node in nodes:
        if node.ref is None:
            continue
        target = Target(ref=node.ref)
        ctx = element_context(node)
        if node.role in TEXT_FIELDS or (node.role == "combobox" and not node.children):
            cur = current_value(node)
            element = (
                f"{field_label(node)} = {cur}; {ctx}" if cur else f"{field_label(node)}; {ctx}"
            )
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
            for span, key in answer_spans(node):
                answers.append((node, span, key, ctx))
    n_answers = 0
    kinds: dict[str, int] = {}
    for node, span, key, ctx in answers:
        if n_answers >= MAX_ANSWERS:
            break
        before = len(out)
        row = ctx if node.role in ("cell", "gridcell") else f"{node.all_text(80)}; {ctx}"
        element = f"answer {key} from {node.role}: {row}"
        kov = overlap(key, c.instr_tokens)
        kind = answer_kind(span)
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
