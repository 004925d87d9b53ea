"""The accessibility tree as nodes (:mod:`rollouts.ranker.tree`)."""

from __future__ import annotations

from rollouts.ranker.tree import parse_tree
from tests.rollouts.ranker.fixture import TREE


def test_tree_parsing_unquotes_yaml_lines_and_nests() -> None:
    nodes = {n.ref: n for n in parse_tree(TREE) if n.ref}
    assert nodes["e40"].role == "link" and nodes["e40"].name == "Budget review #31"
    assert nodes["e16"].text.startswith("★ 3.6")
    assert [c.name for c in nodes["e13"].children] == ["Any", "Nonstop only"]
    assert nodes["e35"].parent is not None and nodes["e35"].parent.ref == "e34"
