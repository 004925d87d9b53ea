"""The accessibility tree of a prompt: ``aria_snapshot(mode="ai")`` lines as :class:`Node` s.

:func:`parse_tree` turns the snapshot text into nodes (role, name, attributes, text, ref,
parent and children); the role sets say which nodes the ranker clicks (:data:`CLICKABLE`),
types into (:data:`TEXT_FIELDS`), answers from (:data:`ANSWER_ROLES`) and reads context from
(:data:`CONTAINERS`). The helpers describe an element for the encoder: the text around it, a
text field's current value and label, a table cell's headers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

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


def element_context(node: Node) -> str:
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


def current_value(node: Node) -> str:
    """A text field's current value (its ``: value`` or ``- text:`` child)."""
    if node.text:
        return node.text
    return " ".join(c.text for c in node.children if c.role == "text" and c.text)


def field_label(node: Node) -> str:
    placeholder = next((c.text for c in node.children if c.role == "/placeholder"), "")
    return " ".join(s for s in (node.role, node.name, placeholder and f"({placeholder})") if s)


def cell_headers(node: Node) -> str:
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
        for r in (n for n in descendants(table) if n.role == "row"):
            heads = [c for c in r.children if c.role == "columnheader"]
            if heads and len(r.children) > col and r.children[col].role == "columnheader":
                keys.append(r.children[col].name)
                break
    return " ".join(k for k in keys if k)


def descendants(node: Node) -> list[Node]:
    out, stack = [], list(node.children)
    while stack:
        n = stack.pop(0)
        out.append(n)
        stack = n.children + stack
    return out
