"""SFT throughput of the VLM training path (training.vlm) with the tiny offline Qwen2-VL.

Trains on the SFT split of an exported curation dataset: ``--dataset DIR`` (an export folder
holding ``parquet/sft.parquet``), or by default one built here from the hand-countable curation
fixture warehouse (tests/curation/fixture.py; real PNG screenshots, expert and model replies)
with a filtered-BC recipe. Plain AdamW on the mean per-token NLL through
``VLMTrainable.logprobs``; prints examples/s, tokens/s (prompt + reply tokens) and the loss at
the first and last step.

    python scripts/vlm_sft_probe.py [--quick] [--dataset DIR] [--batch 8] [--steps 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPE = """
name: vlm-sft-probe
sources: {splits: [train]}
filters: [{drop_invalid_steps: {noop: false}}]
output: {sft: true, k_images: 2}
"""


def fixture_dataset(base: Path) -> Path:
    """Build and export a dataset from the curation fixture warehouse; its export folder."""
    from curation.build import build_dataset
    from curation.recipe import parse_recipe
    from tests.curation.fixture import build_fixture_warehouse
    from warehouse import Warehouse, WarehouseConfig

    with Warehouse.open(WarehouseConfig.from_env(home=base / "home", warehouse="")) as wh:
        build_fixture_warehouse(wh)
        ds = build_dataset(
            wh, parse_recipe(RECIPE, "probe.yaml"), out_dir=base / "out", blobs=wh.blobs
        )
    return Path(ds.export_path)


def read_turns(export: Path) -> list[Any]:
    """The SFT rows of an export folder as training Turns."""
    import pyarrow.parquet as pq

    from training.interface import Turn

    path = export / "parquet" / "sft.parquet"
    if not path.exists():
        raise SystemExit(f"no SFT split at {path} (is {export} a curation export folder?)")
    return [
        Turn(
            prompt=r["prompt"],
            completion=r["completion"],
            images=tuple(img["bytes"] for img in r["images"]),
            weight=float(r["weight"]),
            key=f"{r['traj_id']}/{r['step_idx']}",
        )
        for r in pq.read_table(path).to_pylist()
    ]


def run(turns: list[Any], model_dir: Path, batch: int, steps: int) -> dict[str, float]:
    """Train ``steps`` steps of ``batch`` turns (cycling through the data); the figures."""
    import torch

    from training.vlm import VLMTrainable

    torch.manual_seed(0)
    pol = VLMTrainable.load(model_dir).train()
    pol.check_data(turns)
    opt = torch.optim.AdamW(pol.parameters(), lr=3e-3)
    losses, tokens, seconds = [], 0, 0.0
    for step in range(steps + 1):  # step 0 warms up, untimed
        chunk = [turns[(step * batch + i) % len(turns)] for i in range(batch)]
        start = time.perf_counter()
        out = pol.logprobs(chunk)
        loss = (-out.logprob / out.n_tokens).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step:
            seconds += time.perf_counter() - start
            tokens += sum(len(e.prompt_ids) + len(e.reply_ids) for e in map(pol.encode, chunk))
        losses.append(loss.item())
    return {
        "examples_per_s": steps * batch / seconds,
        "tokens_per_s": tokens / seconds,
        "s_per_step": seconds / steps,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 steps of 4 (seconds)")
    ap.add_argument("--dataset", type=Path, help="a curation export folder (default: built here)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    batch, steps = (4, 3) if args.quick else (args.batch, args.steps)
    from training.models import build_tiny_vlm

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        t0 = time.perf_counter()
        export = args.dataset or fixture_dataset(base)
        turns = read_turns(export)
        model_dir = build_tiny_vlm(base / "tiny-vlm")
        setup = time.perf_counter() - t0
        print(f"data: {len(turns)} SFT turns from {export} (setup {setup:.1f} s)")
        r = run(turns, model_dir, batch, steps)
    print(
        f"vlm sft (tiny Qwen2-VL, batch {batch}, {steps} steps): "
        f"{r['examples_per_s']:.2f} examples/s, {r['tokens_per_s']:.0f} tokens/s, "
        f"{r['s_per_step']:.3f} s/step, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}"
    )


if __name__ == "__main__":
    main()
