"""mkdocs hooks: the pages' generated parts, so no table or figure in the docs is typed by hand.

A page says what it wants with a marker on a line of its own:

* ``<!-- config: stages.collect.CollectConfig -->`` — a table of the config's every field (its
  YAML key, command-line flag, type, default and help), from the ``setting(...)`` metadata the
  CLI and the YAML loader read too;
* ``<!-- options: rubric_vlm -->`` — a table of a judge's or advantage estimator's options
  (default and help, from its ``:param`` docstring entries, as ``webloop components NAME``);
* ``<!-- bench-results -->`` — the benchmark page, rendered from ``bench/results/*.json`` by
  ``bench/render.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- (config|options|bench-results)(?::\s*(.*?))? -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker of a page with what it names (see the module docstring)."""
    return MARKER.sub(lambda m: _render(m.group(1), (m.group(2) or "").strip()), markdown)


def _render(kind: str, arg: str) -> str:
    if kind == "config":
        from cli.reference import config_table

        return config_table(arg)
    if kind == "options":
        from cli.components import options_table

        return options_table(arg)
    # bench/ is a folder of scripts, not a package: load the renderer from its file
    spec = importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render_page(ROOT / "bench" / "results")
