"""The test tiers and their rules (``docs/testing.md``).

- The default tier (``make test``): every test not marked ``long`` or ``vllm``. Its measured
  seconds per file (``tests/weights.txt``) must sum under :data:`DEFAULT_BUDGET_S`;
  ``tests/test_tiers.py`` fails when they do not, naming the heaviest files.
- The long tier (``make test-long``): ``long`` and ``vllm`` tests, and every Hypothesis test
  again at its full example count (``HYPOTHESIS_PROFILE=full``). Measured seconds in
  ``tests/weights-long.txt``.

A ``long`` test says in its marker's reason which default-tier test checks the same behaviour at
small size (its twin), as ``tests/<path>.py::test_<name>``; ``tests/conftest.py`` refuses the
session when a ``long`` marker names none, or a twin that does not exist or is itself long::

    @pytest.mark.long(reason="bench size of tests/flows/test_collect.py::test_collect_resumes")

Both weights files come from a ``--durations=0`` log of a two-worker run of that tier
(``scripts/test_weights.py``); they also order the files handed to pytest-xdist workers.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
WEIGHTS = {"default": ROOT / "tests" / "weights.txt", "long": ROOT / "tests" / "weights-long.txt"}

#: The default tier's measured seconds per file, summed, must stay under this: two workers
#: share them, so the budget is about 2 x 11 minutes of pytest wall (measured runs: see
#: docs/testing.md); with setup, lint and the session's start that keeps `make test` under 15.
DEFAULT_BUDGET_S = 1320

TWIN = re.compile(r"(tests/[\w/.-]+\.py)::(\w+)")
#: What marks a test or a module as outside the default tier, in its decorators' source.
_OUTSIDE_DEFAULT = re.compile(r"\bmark\.(long|vllm)\b|\bVLLM\b")


def read_weights(tier: str) -> dict[str, float]:
    """Seconds per unit of work (a test file; the serving folder is one) of ``tier``'s run."""
    path = WEIGHTS[tier]
    weights: dict[str, float] = {}
    if not path.exists():
        return weights
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            seconds, unit = line.split(maxsplit=1)
            weights[unit] = float(seconds)
    return weights


def long_marker_problem(item: Any) -> str | None:
    """Why ``item``'s ``long`` marker is refused (None when it has none, or a valid one)."""
    mark = item.get_closest_marker("long")
    if mark is None:
        return None
    reason = str(mark.kwargs.get("reason") or (mark.args[0] if mark.args else ""))
    return twin_problem(reason, where=item.nodeid)


def twin_problem(reason: str, *, where: str, root: Path = ROOT) -> str | None:
    """Why a ``long`` marker's ``reason`` does not name a valid default-tier twin, or None."""
    twins = TWIN.findall(reason)
    if not twins:
        return (
            f"{where}: a `long` marker's reason must name the default-tier test that checks "
            f"the same behaviour at small size (tests/<path>.py::test_<name>); it says {reason!r}"
        )
    for path, name in twins:
        problem = _twin_state(root / path, name)
        if problem:
            return f"{where}: its twin {path}::{name} {problem}"
    return None


def _twin_state(path: Path, name: str) -> str | None:
    if not path.is_file():
        return "names a file that does not exist"
    module_marks, tests, aliases = _marks_of(path)
    if name not in tests:
        return f"does not exist (no test function {name} in that file)"
    alias = re.compile(r"\b(" + "|".join(map(re.escape, aliases)) + r")\b") if aliases else None
    marks = module_marks + " " + tests[name]
    if _OUTSIDE_DEFAULT.search(marks) or (alias and alias.search(marks)):
        return "is itself outside the default tier (long or vllm): name a default-tier test"
    return None


@cache
def _marks_of(path: Path) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """The module's ``pytestmark`` source, each test function's decorators' source, and the
    names the module gives to a ``long`` or ``vllm`` marker (``SLOW = pytest.mark.long(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = ""
    tests: dict[str, str] = {}
    aliases: list[str] = []
    for node in ast.walk(tree):
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.Assign) and "pytestmark" in names:
            module += ast.unparse(node.value)
        elif isinstance(node, ast.Assign) and _OUTSIDE_DEFAULT.search(ast.unparse(node.value)):
            aliases += names
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            tests[node.name] = " ".join(ast.unparse(d) for d in node.decorator_list)
    return module, tests, tuple(aliases)
