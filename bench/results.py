"""A benchmark's results file: every line it printed, its structured figures, its arguments and
the code version, as JSON, so a figure quoted in the docs can be traced to a run.

    rec = Results("learning", args)      # records every line `rec.say` prints
    rec.say("sft curated: ...")
    rec.figures["evaluations"] = {...}
    rec.write()                          # bench/results/learning-<code>-<UTC time>.json

``--quick`` runs (the test suite's) write nothing unless ``--results PATH`` is given.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Results:
    def __init__(self, name: str, args: Any) -> None:
        self.name = name
        self.args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        self.lines: list[str] = []
        self.figures: dict[str, Any] = {}
        self.started = dt.datetime.now(dt.UTC)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def path(self, given: Path | None, quick: bool) -> Path | None:
        if given is not None:
            return given
        if quick:
            return None
        from stages.runs import code_version

        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        return ROOT / "bench" / "results" / f"{self.name}-{code_version()}-{stamp}.json"

    def write(self, given: Path | None = None, quick: bool = False) -> Path | None:
        """Write the file (see the module docstring); its path, or None when none is due."""
        from stages.runs import code_version

        path = self.path(given, quick)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "bench": self.name,
            "code_version": code_version(),
            "started": self.started.isoformat(),
            "finished": dt.datetime.now(dt.UTC).isoformat(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "args": self.args,
            "figures": self.figures,
            "lines": self.lines,
        }
        path.write_text(json.dumps(record, indent=2, default=str))
        print(f"results: {path}", flush=True)
        return path
