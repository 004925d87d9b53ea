"""The import direction of DESIGN.md, enforced over every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = (
    "warehouse",
    "sites",
    "rollouts",
    "judging",
    "curation",
    "training",
    "flows",
    "dashboards",
)
ALLOWED = {
    "warehouse": set(),
    "sites": {"warehouse"},
    "rollouts": {"warehouse"},
    "judging": {"warehouse", "rollouts"},
    "curation": {"warehouse", "rollouts"},
    "training": {"warehouse", "rollouts"},
    "flows": set(PACKAGES),
    "dashboards": {"warehouse"},
}
ONLY_IN = {"prefect": "flows", "streamlit": "dashboards"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


@pytest.mark.parametrize(("pkg", "path"), list(modules()), ids=lambda v: str(v))
def test_imports_follow_the_design(pkg: str, path: Path):
    found = imports_of(path)
    bad = {m for m in found & set(PACKAGES) if m != pkg and m not in ALLOWED[pkg]}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    for lib, home in ONLY_IN.items():
        assert lib not in found or pkg == home, f"{path.relative_to(ROOT)} imports {lib}"


def test_the_checker_catches_a_violation(tmp_path: Path):
    p = tmp_path / "m.py"
    p.write_text("import prefect\nfrom flows.cli import app\nfrom . import sibling\n")
    assert imports_of(p) == {"prefect", "flows"}
