"""A benchmark's results file: every line it printed, its structured figures, its arguments and
the code version, as JSON, so a figure quoted in the docs can be traced to a run.

    rec = Results("learning", args)      # records every line `rec.say` prints
    rec.say("sft curated: ...")
    rec.figures["evaluations"] = {...}
    rec.write()                          # bench/results/learning-<code>-<UTC time>.json

A bench that only prints wraps its main in :func:`capture`: every line it prints is recorded.

    with capture("warehouse", args):     # tees stdout; writes the file at the end
        ...

``--quick`` runs (the test suite's) write nothing unless ``--results PATH`` is given.
``bench/render.py`` renders the docs' benchmark page from these files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Results:
    """One run's record. The code version is the checkout's commit when the run started: a
    commit made while a long bench runs does not relabel its figures."""

    def __init__(self, name: str, args: Any) -> None:
        from stages.runs import code_version

        self.name = name
        self.code_version = code_version()
        self.args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        self.lines: list[str] = []
        self.figures: dict[str, Any] = {}
        self.started = dt.datetime.now(dt.UTC)
        self.load_start = _load()

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def path(self, given: Path | None, quick: bool) -> Path | None:
        if given is not None:
            return given
        if quick:
            return None
        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        return ROOT / "bench" / "results" / f"{self.name}-{self.code_version}-{stamp}.json"

    def write(self, given: Path | None = None, quick: bool = False) -> Path | None:
        """Write the file (see the module docstring); its path, or None when none is due."""
        path = self.path(given, quick)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "bench": self.name,
            "code_version": self.code_version,
            "started": self.started.isoformat(),
            "finished": dt.datetime.now(dt.UTC).isoformat(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "load": {"start": self.load_start, "end": _load()},
            "versions": versions(),
            "args": self.args,
            "figures": self.figures,
            "lines": self.lines,
        }
        path.write_text(json.dumps(record, indent=2, default=str))
        print(f"results: {path}", flush=True)
        return path


#: The packages whose versions a results file records.
PACKAGES = ("torch", "transformers", "duckdb", "polars", "playwright", "prefect", "datasets")


def versions() -> dict[str, str]:
    """Python's and the main packages' versions (those installed)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class _Tee:
    """A stdout that also records each whole line it is given into ``results``."""

    def __init__(self, stream: TextIO, results: Results) -> None:
        self.stream, self.results, self.partial = stream, results, ""

    def write(self, text: str) -> int:
        self.partial += text
        *whole, self.partial = self.partial.split("\n")
        self.results.lines.extend(whole)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def capture(name: str, args: Any) -> Iterator[Results]:
    """Record every line printed inside the block, then write the results file (``args.quick``
    and ``args.results`` decide whether and where, as :meth:`Results.write`). A bench that
    fails writes nothing."""
    rec = Results(name, args)
    tee = _Tee(sys.stdout, rec)
    with contextlib.redirect_stdout(tee):
        yield rec
    if tee.partial:
        rec.lines.append(tee.partial)
    rec.write(getattr(args, "results", None), bool(getattr(args, "quick", False)))


def run_main(name: str, main: Any, children: tuple[str, ...] = ()) -> Any:
    """Run a bench's ``main()`` under :func:`capture`, its settings read from ``sys.argv``
    (``--quick``, ``--results PATH``); a child process of the bench (a flag in ``children`` is
    given) runs without."""
    argv = sys.argv[1:]
    if any(flag in argv for flag in children):
        return main()
    given = argv[argv.index("--results") + 1] if "--results" in argv[:-1] else None
    args = SimpleNamespace(
        argv=argv, quick="--quick" in argv, results=Path(given) if given else None
    )
    with capture(name, args):
        return main()
