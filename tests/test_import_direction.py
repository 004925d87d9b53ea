"""The import direction of DESIGN.md, enforced by the import-linter contracts in pyproject.toml
(``[tool.importlinter]``): layers, site code only in flows, prefect only in flows, streamlit only
in dashboards, no duckdb or polars (no SQL) in flows and cli, and no import cycles inside a
package. ``lint-imports`` runs them here, so CI fails on a violation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("warehouse", "sites", "rollouts", "judging", "curation", "training", "flows")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contracts over the packages importable from ``cwd``."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_code_keeps_the_import_contracts():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_catch_violations(tmp_path: Path):
    """A stand-in tree of the eight packages, each module breaking one rule: every contract
    must report it."""
    bad = {
        "warehouse/up.py": "import sites\n",  # the bottom layer imports a layer above
        "sites/sibling.py": "import rollouts\n",  # sites and rollouts are independent
        "judging/grade.py": "import sites\n",  # only flows touch the sites
        "dashboards/page.py": "import rollouts\n",  # dashboards read the warehouse only
        "rollouts/flow.py": "import prefect\n",  # prefect only in flows
        "flows/ui.py": "import streamlit\n",  # streamlit only in dashboards
        "flows/query.py": "import duckdb\n",  # no SQL in flows (or cli)
        "training/a.py": "import training.b\n",  # a cycle inside a package
        "training/b.py": "import training.a\n",
    }
    for pkg in (*PACKAGES, "dashboards"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for path, text in bad.items():
        (tmp_path / path).write_text(text)
    result = lint_imports(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "Contracts: 0 kept, 7 broken." in out, out
    for line in (
        "warehouse is not allowed to import sites",
        "sites is not allowed to import rollouts",
        "judging is not allowed to import sites",
        "dashboards is not allowed to import rollouts",
        "rollouts is not allowed to import prefect",
        "flows is not allowed to import streamlit",
        "flows is not allowed to import duckdb",
        "No cycles are allowed in training",
    ):
        assert line in out, f"{line!r} not reported:\n{out}"
