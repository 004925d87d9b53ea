"""Render the docs' benchmark page from the benches' results files (``bench/results/*.json``,
written by ``bench/results.py``): per bench, its newest run's every printed line with the run's
date, code version, duration, machine, load and package versions; its run-to-run spread (every
evaluation of the newest run beside the same evaluation in the other runs of the same settings,
and the range); then a table of every run kept. No figure on the page is typed by hand.

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
    "learning_vlm": "Does a generative vision-language policy learn here? A small Idefics3 from "
    "scratch (tokenizer and all) or the smol-idefics preset (a pretrained SmolLM2 backbone), SFT "
    "with and without the screenshot, GRPO, closed loop.",
    "curation_value": "Does curating a weak policy's own rollouts pay? All steps / successes / "
    "prefixes before the first error / + first-error corrections, equal steps, paired.",
    "demo_rounds": "`make demo` per seed: round 1 and round 2 on the same held-out tasks "
    "(paired), tasks lost and gained, the demo's wall time.",
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


def _settings(rec: dict[str, Any]) -> dict[str, Any]:
    """A run's settings, for grouping runs whose figures show the spread: its arguments but
    where it wrote and its seed."""
    left_out = ("home", "results", "seed")
    return {k: v for k, v in (rec.get("args") or {}).items() if k not in left_out}


def _column(rec: dict[str, Any]) -> str:
    seed = (rec.get("args") or {}).get("seed")
    where = f"`{rec.get('code_version', '?')}` {rec['started'][5:10]}"
    return where + (f" seed {seed}" if seed is not None else "")


def _cell(ev: dict[str, Any] | None) -> str:
    if not ev or not ev.get("n"):
        return "–"
    return f"{ev['n_success']}/{ev['n']} ({ev['n_success'] / ev['n']:.1%})"


def _diff(d: dict[str, Any] | None) -> str:
    if not d or d.get("diff") is None:
        return "–"
    p = d.get("mcnemar_p")
    return f"{d['diff'] * 100:+.1f} points" + (f", McNemar p {p:.2g}" if p is not None else "")


def spread(recs: list[dict[str, Any]]) -> list[str]:
    """The run-to-run spread of the newest run's evaluations and paired differences: the runs of
    the same settings (arguments other than ``--home``, ``--results`` and ``--seed``: runs of
    other seeds are what the spread is about), a column each, and the range of each across
    them. One run of those settings says so."""
    newest = recs[0]
    evals = (newest.get("figures") or {}).get("evaluations") or {}
    if not evals:
        return []
    same = [r for r in recs if _settings(r) == _settings(newest)]
    if len(same) < 2:
        return [
            "Run-to-run spread: one run of these settings so far (run the bench again to see "
            "how much its figures move between runs of the same code).",
            "",
        ]
    head = " | ".join(_column(r) for r in same)
    out = [
        f"Run-to-run spread: the {len(same)} runs of these settings.",
        "",
        f"| evaluation | {head} | range |",
        "|---" * (len(same) + 2) + "|",
    ]
    for key in evals:
        cells = [((r.get("figures") or {}).get("evaluations") or {}).get(key) for r in same]
        rates = [c["n_success"] / c["n"] for c in cells if c and c.get("n")]
        lo, hi = (min(rates), max(rates)) if rates else (None, None)
        span = f"{lo:.1%} – {hi:.1%} ({(hi - lo) * 100:.1f} points)" if rates else "–"
        out.append(f"| {key} | " + " | ".join(_cell(c) for c in cells) + f" | {span} |")
    diffs = (newest.get("figures") or {}).get("differences") or {}
    for key in diffs:
        cells = [((r.get("figures") or {}).get("differences") or {}).get(key) for r in same]
        points = [c["diff"] * 100 for c in cells if c and c.get("diff") is not None]
        span = f"{min(points):+.1f} – {max(points):+.1f} points" if points else "–"
        out.append(f"| {key} (paired) | " + " | ".join(_diff(c) for c in cells) + f" | {span} |")
    out.append("| duration | " + " | ".join(minutes(r) for r in same) + " | |")
    return [*out, ""]


def bench_section(name: str, about: str, recs: list[dict[str, Any]]) -> list[str]:
    out = [f"## `bench/{name}.py`", "", about, ""]
    if not recs:
        return [*out, f"No results file yet: run `python bench/{name}.py`.", ""]
    newest = recs[0]
    out += [f"Newest run: {_meta(newest)}.", ""]
    if _args(newest):
        out += [f"Settings: {_args(newest)}.", ""]
    out += ["```text", *newest.get("lines", []), "```", ""]
    out += spread(recs)
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
