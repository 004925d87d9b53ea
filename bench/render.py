"""Render the docs' benchmark page from the benches' results files (``bench/results/*.json``,
written by ``bench/results.py``): per bench, its newest run's every printed line with the run's
date, code version, duration, machine, load and package versions, then a table of every run
kept. No figure on the page is typed by hand.

    python bench/render.py                 # the page's Markdown on stdout
    python bench/render.py --out FILE.md

The docs build calls :func:`render_page` (``scripts/docs_hooks.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

#: What each bench measures, in the order the page shows them (a bench without a results file
#: is listed as not yet run).
BENCHES: dict[str, str] = {
    "learning": "Does the flywheel make an agent better? Expert data → curated SFT → RL "
    "(variants chosen on `val`) → paired evaluation on `test`, with the ranker policy.",
    "learning_vlm": "Does a generative vision-language policy learn here, from scratch? "
    "Tokenizer + small Idefics3, SFT with and without the screenshot, GRPO, closed loop.",
    "curation_value": "Does curation make a better policy when demonstrations err in "
    "habits? Unfiltered / success-filtered / + interventions / step-filtered, equal steps.",
    "ood": "A few-shot curve on the held-out travel site (0 / 5 / 20 demonstrations).",
    "training": "The trainer on 1 against 2 processes (gloo), and the GPU check where there is "
    "one.",
    "warehouse": "Ingest into the DuckLake warehouse against plain DuckDB; analytic queries.",
    "sites": "The scripted expert on generated tasks in real Chromium: success and throughput.",
    "rollouts": "The rollout engine's throughput against a sequential baseline.",
    "judging": "Rubric-VLM judging against a local OpenAI-compatible server: concurrency gain.",
    "curation": "Building a dataset from a large warehouse: time and memory per stage.",
    "dashboard": "The review app's queries and pages on a large warehouse.",
    "serving": "serve-model and vLLM: throughput of served rollouts, weight sync.",
}


def load(results: Path = RESULTS) -> dict[str, list[dict[str, Any]]]:
    """Every readable results file under ``results``, by bench, newest first. A file that is
    not a results record is skipped with a line on stderr."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
            rec["file"], rec["bench"] = path.name, str(rec["bench"])
            rec["started"] = str(rec["started"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"render: skipping {path}: {exc}", file=sys.stderr)
            continue
        runs.setdefault(rec["bench"], []).append(rec)
    for recs in runs.values():
        recs.sort(key=lambda r: r["started"], reverse=True)
    return runs


def minutes(rec: dict[str, Any]) -> str:
    try:
        start = dt.datetime.fromisoformat(rec["started"])
        end = dt.datetime.fromisoformat(rec["finished"])
    except (KeyError, ValueError):
        return "?"
    return f"{(end - start).total_seconds() / 60:.1f} min"


def _meta(rec: dict[str, Any]) -> str:
    machine = rec.get("machine", {})
    load = rec.get("load", {}).get("start")
    versions = rec.get("versions", {})
    parts = [
        f"run {rec['started'][:16].replace('T', ' ')} UTC",
        f"code `{rec.get('code_version', '?')}`",
        minutes(rec),
        f"{machine.get('cpus', '?')} CPUs",
    ]
    if load:
        parts.append(f"load {load[0]} at start")
    if versions:
        parts.append(", ".join(f"{k} {v}" for k, v in versions.items()))
    return " · ".join(parts) + f" · file `{rec['file']}`"


def _args(rec: dict[str, Any]) -> str:
    args = rec.get("args") or {}
    shown = {k: v for k, v in args.items() if k not in ("home", "results") and v is not None}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def bench_section(name: str, about: str, recs: list[dict[str, Any]]) -> list[str]:
    out = [f"## `bench/{name}.py`", "", about, ""]
    if not recs:
        return [*out, f"No results file yet: run `python bench/{name}.py`.", ""]
    newest = recs[0]
    out += [f"Newest run: {_meta(newest)}.", ""]
    if _args(newest):
        out += [f"Settings: {_args(newest)}.", ""]
    out += ["```text", *newest.get("lines", []), "```", ""]
    if len(recs) > 1:
        out += ["| run (UTC) | code | duration | file |", "|---|---|---|---|"]
        out += [
            f"| {r['started'][:16].replace('T', ' ')} | `{r.get('code_version', '?')}` | "
            f"{minutes(r)} | `{r['file']}` |"
            for r in recs
        ]
        out.append("")
    return out


def render_page(results: Path = RESULTS) -> str:
    """The benchmark page's Markdown body (see the module docstring)."""
    runs = load(results)
    names = list(BENCHES) + sorted(set(runs) - set(BENCHES))
    out: list[str] = []
    for name in names:
        out += bench_section(name, BENCHES.get(name, ""), runs.get(name, []))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    ap.add_argument("--out", type=Path, help="write the page here (default: stdout)")
    args = ap.parse_args(argv)
    page = "# Benchmark results\n\n" + render_page(args.results)
    if args.out:
        args.out.write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
