"""Probe of the ``ranker`` policy on expert data: oracle coverage and a quick SFT.

1. ``collect``: expert trajectories of all four bundled sites, recorded in the ref action space
   with ``prompt_mode="a11y"`` (``flows.collect.run_collect`` in-process, real Chromium), into a
   temporary warehouse; each step's stored prompt blob and the expert's action are written to a
   JSONL file (``--rows``).
2. ``probe``: oracle coverage of :func:`rollouts.ranker.candidates` (overall and per site), then
   SFT of a fresh :class:`rollouts.ranker.RankerModel` (plain AdamW on ``-logprob`` through
   :class:`training.ranker.RankerTrainable`) on the ``train``-split rows, and step accuracy
   (greedy candidate == the expert's action) on the ``test``-split rows.

Run: ``.venv/bin/python scripts/ranker_probe.py --tasks 320 --epochs 12`` (collect is skipped when
the rows file exists; ``--recollect`` forces it; ``--show-errors N`` prints test mistakes,
``--save DIR`` writes the trained ranker).

Measured 2026-11-30 on the 2-core machine (shared, loaded), feature set v3:
320 tasks → 2,253 expert steps (collect 865 s). Oracle coverage 95.4% overall: shop, mail, wiki
100%, travel 82.4% — every miss is a click on an autocomplete suggestion that the observation
does not show yet (the snapshot is taken before the suggestions render). SFT (AdamW lr 2e-3,
batch 32, 12 epochs) on 1,395 train steps: embeddings 125-230 s once (then cached on disk),
training 46-50 s; test-split step accuracy 97.0% (untrained 2-5%): mail 100%, shop 96.7%,
wiki 89.2%; train 99.2%. With 140 tasks (612 train steps): 93.6%.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def _collect(home: Path, n_tasks: int, seed: int) -> list[dict[str, Any]]:
    from playwright.async_api import async_playwright

    from rollouts.browser import launch
    from sites.server import SiteServer
    from sites.tasks import generate
    from stages.collect import CollectConfig, run_collect
    from warehouse import Warehouse, WarehouseConfig
    from warehouse.tasks import put_tasks

    tasks = generate(n_tasks, seed)
    cfg = CollectConfig(
        split=None, n_tasks=n_tasks, concurrency=4, prompt_mode="a11y", run_name="ranker-probe"
    )
    with SiteServer(seed=0) as server, Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        put_tasks(wh, tasks)
        async with async_playwright() as pw:
            browser = await launch(pw)
            try:
                out = await run_collect(wh, cfg, server=server, browser=browser)
            finally:
                await browser.close()
        print("collect:", json.dumps(dataclasses.asdict(out)), flush=True)
        df = wh.sql(
            "SELECT s.traj_id, s.step_idx, s.prompt_hash, s.action_text, s.action_error,"
            " t.status, k.site, k.split, k.task_id"
            " FROM steps s JOIN trajectories t USING (traj_id) JOIN tasks k USING (task_id)"
            " ORDER BY s.traj_id, s.step_idx"
        )
        rows = []
        for r in df.iter_rows(named=True):
            if r["prompt_hash"] is None or r["action_text"] is None:
                continue
            prompt = wh.blobs.get(r["prompt_hash"]).decode()
            rows.append({**r, "prompt": prompt, "completion": f"Action: {r['action_text']}"})
    return rows


def collect(path: Path, n_tasks: int, seed: int) -> list[dict[str, Any]]:
    """Collect expert rows into ``path`` (JSONL) and return them."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ranker-probe-") as tmp:
        rows = asyncio.run(_collect(Path(tmp) / "home", n_tasks, seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"collected {len(rows)} steps in {time.perf_counter() - start:.1f}s", flush=True)
    return rows


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open()]


def coverage_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Oracle coverage overall and per site, plus the uncovered actions (first few per site)."""
    from rollouts.ranker import RankerInput, candidates, oracle_coverage, target_index

    per_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per_site[r["site"]].append(r)
    report: dict[str, Any] = {"overall": round(oracle_coverage(rows), 4), "n": len(rows)}
    misses: dict[str, list[str]] = {}
    n_cands: list[int] = []
    for site, rs in sorted(per_site.items()):
        report[site] = round(oracle_coverage(rs), 4)
        for r in rs:
            inp = RankerInput.parse(r["prompt"])
            cands = candidates(inp)
            n_cands.append(len(cands))
            if target_index(cands, r["completion"]) is None:
                misses.setdefault(site, []).append(r["action_text"])
    report["candidates_mean"] = round(sum(n_cands) / max(1, len(n_cands)), 1)
    report["candidates_max"] = max(n_cands, default=0)
    report["misses"] = {s: Counter(m).most_common(8) for s, m in misses.items()}
    return report


def sft_probe(
    rows: list[dict[str, Any]],
    epochs: int,
    seed: int,
    batch: int,
    save: Path | None = None,
    show_errors: int = 0,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    """SFT on train-split rows, step accuracy on test-split rows (greedy top candidate)."""
    import torch

    from rollouts.encoder import TextEncoder
    from rollouts.ranker import RankerModel
    from training.interface import Turn
    from training.ranker import RankerTrainable

    torch.manual_seed(seed)
    train = [r for r in rows if r["split"] == "train"]
    test = [r for r in rows if r["split"] == "test"]
    to_turn = lambda r: Turn(prompt=r["prompt"], completion=r["completion"], key=r["traj_id"])  # noqa: E731
    tr = RankerTrainable(RankerModel(seed=seed), encoder=TextEncoder(cache_dir=cache_dir))
    train_turns, test_turns = [to_turn(r) for r in train], [to_turn(r) for r in test]
    tr.check_data(train_turns)
    t0 = time.perf_counter()
    tr.prepare(train_turns + test_turns)  # candidates + embeddings, cached per prompt hash
    tr.encoder.flush()
    prep_s = time.perf_counter() - t0
    before = step_accuracy(tr, test_turns)
    opt = torch.optim.AdamW(tr.parameters(), lr=2e-3, weight_decay=0.01)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    losses = []
    for _epoch in range(epochs):
        tr.train(True)
        order = list(range(len(train_turns)))
        rng.shuffle(order)
        total, n = 0.0, 0
        for i in range(0, len(order), batch):
            out = tr.logprobs([train_turns[j] for j in order[i : i + batch]])
            mask = out.covered
            if not bool(mask.any()):
                continue
            loss = -(out.logprob[mask]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + float(loss.detach()), n + 1
        losses.append(round(total / max(1, n), 4))
        print(f"epoch {_epoch + 1}: loss {losses[-1]}", flush=True)
    train_s = time.perf_counter() - t0
    if save is not None:
        tr.save(save)
    if show_errors:
        show_mistakes(tr, test_turns, show_errors)
    return {
        "train_steps": len(train_turns),
        "test_steps": len(test_turns),
        "prepare_s": round(prep_s, 1),
        "train_s": round(train_s, 1),
        "epoch_losses": losses,
        "test_step_acc_untrained": before,
        "test_step_acc": step_accuracy(tr, test_turns),
        "train_step_acc": step_accuracy(tr, train_turns),
        "test_acc_per_site": {
            s: step_accuracy(tr, [to_turn(r) for r in test if r["site"] == s])
            for s in sorted({r["site"] for r in test})
        },
    }


def show_mistakes(tr: Any, turns: list[Any], n: int) -> None:
    """Print up to ``n`` test steps whose greedy candidate is not the target."""
    import torch

    tr.train(False)
    shown = 0
    with torch.no_grad():
        for t in turns:
            best, target = tr.greedy_and_target(t)
            if target is None or best == target or shown >= n:
                continue
            shown += 1
            cands = tr.prepared(t.prompt).candidates
            from rollouts.ranker import parse_prompt

            inp = parse_prompt(t.prompt)
            print(f"- {inp.instruction[:90]!r} step {len(inp.history)} @ {inp.title[:40]!r}")
            print(f"    want {cands[target].text} [{cands[target].element[:70]}]")
            print(f"    got  {cands[best].text} [{cands[best].element[:70]}]")


def step_accuracy(tr: Any, turns: list[Any]) -> dict[str, float]:
    """Share of turns whose greedy (top-scored) candidate is the target action: over all turns,
    and over covered turns only."""
    import torch

    tr.train(False)
    hits, covered = 0, 0
    with torch.no_grad():
        for i in range(0, len(turns), 64):
            chunk = turns[i : i + 64]
            for t in chunk:
                best, target = tr.greedy_and_target(t)
                if target is not None:
                    covered += 1
                    hits += int(best == target)
    n = max(1, len(turns))
    return {"all": round(hits / n, 4), "covered": round(hits / max(1, covered), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=Path, default=Path(tempfile.gettempdir()) / "ranker_rows.jsonl")
    ap.add_argument("--tasks", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--recollect", action="store_true")
    ap.add_argument("--collect-only", action="store_true")
    ap.add_argument("--skip-coverage", action="store_true")
    ap.add_argument("--save", type=Path, default=None, help="write the trained ranker here")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "ranker_embeddings",
        help="on-disk embedding cache (reruns skip the encoder)",
    )
    ap.add_argument("--show-errors", type=int, default=0, help="print N test mistakes")
    args = ap.parse_args()
    if args.recollect or not args.rows.exists():
        rows = collect(args.rows, args.tasks, args.seed)
    else:
        rows = load_rows(args.rows)
    print("steps by site/split:", dict(Counter((r["site"], r["split"]) for r in rows)))
    if args.collect_only:
        return
    t0 = time.perf_counter()
    if not args.skip_coverage:
        print("coverage:", json.dumps(coverage_report(rows), indent=1), flush=True)
        print(f"coverage took {time.perf_counter() - t0:.1f}s", flush=True)
    print(
        "sft:",
        json.dumps(
            sft_probe(
                rows,
                args.epochs,
                args.seed,
                args.batch,
                args.save,
                args.show_errors,
                args.cache_dir,
            ),
            indent=1,
        ),
    )


if __name__ == "__main__":
    main()
