"""VLM learning benchmark: does a generative vision-language policy, built and trained from
scratch on 2 cores, learn to act? Prints, in one run:

1. data: the scripted expert (no mistakes) on ``--train`` ``train`` tasks and ``--heldout``
   ``test`` tasks of short templates (:data:`TEMPLATES`: one to three steps, among them the
   pixels-only ``shop_photo_colour``), with a screenshot and the accessibility tree cut to
   ``--a11y-chars`` around the focused element in every prompt; judged; an SFT dataset of
   each (the ``test`` one is never trained on: held-out NLL and next-action accuracy);
2. the model (``--model tiny``): a byte-level BPE tokenizer trained on the training prompts
   and replies (``--vocab``) and an Idefics3 of ``--hidden`` × ``--layers`` (32-wide heads, a
   small SigLIP tower: the architecture vLLM serves here), random weights; ``--model smol``: the
   ``smol-idefics`` preset (SmolLM2-135M-Instruct, pretrained, as an Idefics3's text model);
   ``--system-prompt short``: the short system prompt; the mean prompt length in tokens;
3. SFT from scratch (``--epochs``, ``--lr``, ``--batch``) through the product's trainer, twice on
   the same turns: with the screenshot (``screenshot+a11y``) and without it (``a11y only``,
   the same prompts less their image);
4. for the untrained model and each SFT model: held-out NLL per reply token, next-action
   accuracy (greedy reply's action against the expert's, at the expert's states), and
   closed-loop success on ``--eval-n`` held-out ``test`` tasks in Chromium (greedy, the
   product's ``hf`` rollout policy; the untrained, accessibility-only and candidates arms on
   the first ``--secondary-n`` of them, paired on those), with 95% intervals; SFT vs
   untrained and screenshot vs accessibility-only paired on the same tasks, overall and on the
   pixels-only template's own ``test`` tasks (up to ``--pixels-n``);
5. RL (``--no-rl``: none): GRPO on token log-probs from the screenshot SFT checkpoint, its
   samples acting by ``--rl-choose`` (``candidates``: in-process, see 6; ``generate``: rolled
   out by the served model, ``--rl-serve hf``: serve-model, weights synced after each update),
   then the same held-out metrics and closed-loop evaluations, paired with SFT;
6. the ``candidates`` choice (:class:`rollouts.hf.HFPolicy`): a checkpoint keeps its generated
   thought and acts by the highest log-prob over the ranker's candidate actions at the page (a
   constrained decode); SFT and RL evaluated so on the same tasks, paired with SFT's free
   generation and with each other;
7. serving: the final checkpoint served by ``--serve-check`` (``auto``: vLLM where ``make vllm``
   built it, else serve-model; ``none``: skip), its greedy replies to ``--serve-check-n``
   held-out prompts against the in-process model's.
Everything runs the product's own code path in one process with one sites server and one
Chromium, into a fresh warehouse; the bench writes a results file like the others.

``--seed`` draws the training tasks, initialises the new weights and orders SFT's and RL's data
(the held-out turns and the evaluation tasks are the same for every seed: comparable across
seeds).

    python bench/learning_vlm.py [--quick] [--train 500] [--epochs 3] [--seed 0] [--home DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import learning  # (after the path and offline settings)

#: Short templates (1-3 reference steps), the pixels-only one among them.
TEMPLATES = ["mail_archive", "shop_photo_colour", "shop_product_fact", "wiki_fact", "wiki_on_page"]
PIXELS = "shop_photo_colour"

FULL = dict(
    model="tiny",  # tiny: a random Idefics3 of --hidden x --layers; smol: the smol-idefics preset
    tasks=1600,
    train=500,
    heldout=100,
    eval_n=60,
    secondary_n=60,  # untrained, a11y only and candidates: on the first N of the eval tasks
    eval_max_steps=5,
    a11y_chars=1200,
    system_prompt="full",  # full | short (rollouts.prompts.SYSTEM_PROMPTS)
    vocab=4096,
    hidden=128,
    layers=4,
    epochs=3,
    batch=8,
    lr=2e-3,
    max_new_tokens=64,
    rl=True,
    rl_iterations=2,
    rl_tasks=16,
    group=4,
    rl_lr=3e-4,
    reasoning_weight=0.5,
    rl_serve="hf",
    rl_choose="candidates",
    serve_check="auto",
    serve_check_n=16,
    pixels_n=30,
    seed=0,  # the training tasks' draw, the new weights' initialisation, SFT's and RL's order
)
QUICK = dict(
    FULL,
    tasks=200,
    train=12,
    heldout=4,
    eval_n=2,
    eval_max_steps=2,
    vocab=1024,
    hidden=64,
    layers=2,
    epochs=1,
    batch=4,
    rl_iterations=1,
    rl_tasks=2,
    group=2,
    serve_check="hf",
    serve_check_n=2,
    pixels_n=2,
)

DATA = """
name: vlm-{name}
description: "The expert's {split} turns on short templates, {k} screenshot(s) per prompt."
sources: {{splits: [{split}], runs: [{run}]}}
filters:
  - verdict: {{judges: [programmatic], verdict: success, min_agreement: 1.0}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: {k}}}
gates: {{success_rate: [0.0, 1.0]}}
"""

say = learning.say


def collect_settings(a: argparse.Namespace, screenshots: bool = True) -> dict[str, Any]:
    """The prompt every turn of the bench is rendered with (expert data and evaluation)."""
    return {
        "prompt_mode": "both" if screenshots else "a11y",
        "screenshots": screenshots,
        "k_images": 1,
        "a11y_chars": a.a11y_chars,
        "a11y_focus": True,
        "system_prompt": a.system_prompt,
    }


def prompt_texts(turns: list[Any]) -> list[str]:
    """The text parts of the turns' prompts and their replies: the tokenizer's corpus."""
    out = []
    for t in turns:
        for m in json.loads(t.prompt):
            content = m.get("content")
            parts = content if isinstance(content, list) else [{"text": content}]
            out += [str(p.get("text")) for p in parts if p.get("text")]
        out.append(t.completion)
    return out


def target_visible(turns: list[Any]) -> float:
    """The share of turns whose action names a ref that the prompt's (cut) tree shows, among
    the turns whose action names a ref: what a text reader can ground at all."""
    from rollouts.prompts import action_ref

    named = [(t, action_ref(t.completion.rsplit("Action:", 1)[-1].strip())) for t in turns]
    named = [(t, ref) for t, ref in named if ref]
    return sum(f"[ref={ref}]" in t.prompt for t, ref in named) / max(len(named), 1)


def without_images(turn: Any) -> Any:
    """A turn's prompt less its screenshots (what a ``k_images: 0`` export renders)."""
    from rollouts.prompts import render

    messages = json.loads(turn.prompt)
    for m in messages:
        if isinstance(m.get("content"), list):
            m["content"] = [p for p in m["content"] if p.get("type") != "image_url"]
    return dataclasses.replace(turn, prompt=render(messages), images=())


def heldout_metrics(path: Path, turns: list[Any], a: argparse.Namespace) -> dict[str, Any]:
    """NLL per reply token (the trainer's own log-probs) and next-action accuracy (greedy reply
    parsed, against the expert's action; overall and by the expert's action type) of the model
    at ``path`` on held-out ``turns``."""
    import torch

    from rollouts.actions import ParseError, format_action, parse_action
    from rollouts.hf import HFGenerator
    from training.vlm import VLMTrainable, turn_messages

    model = VLMTrainable.load(str(path))
    model.train(False)
    nll, n_tok = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(turns), 8):
            lp = model.logprobs(turns[i : i + 8])
            nll -= float(lp.logprob.sum())
            n_tok += float(lp.n_tokens.sum())
    gen = HFGenerator(model.module, model.processor)
    by_type: dict[str, list[int]] = {}  # the expert's action type: [hits, n]
    for i in range(0, len(turns), 8):
        batch = turns[i : i + 8]
        outs = gen.run_batch([turn_messages(t) for t in batch], a.max_new_tokens)
        for t, out in zip(batch, outs, strict=True):
            want, got = parse_action(t.completion), parse_action(out.text)
            ok = not isinstance(got, ParseError) and not isinstance(want, ParseError)
            tally = by_type.setdefault(type(want).__name__.lower(), [0, 0])
            tally[0] += ok and format_action(got) == format_action(want)
            tally[1] += 1
    hits = sum(h for h, _ in by_type.values())
    return {
        "nll": nll / max(n_tok, 1.0),
        "accuracy": hits / max(len(turns), 1),
        "n": len(turns),
        "by_action": {k: {"hits": h, "n": n} for k, (h, n) in sorted(by_type.items())},
    }


def parameters(path: Path) -> int:
    from rollouts.hf import load_model

    return sum(p.numel() for p in load_model(path)[0].parameters())


def mean_prompt_tokens(path: Path, turns: list[Any]) -> float:
    """Mean prompt length in tokens (images' tokens included) under the model's processor."""
    from rollouts.hf import load_model, prompt_text, split_messages
    from training.vlm import turn_messages

    _, proc = load_model(path)
    lengths = []
    for t in turns[:200]:
        msgs, images = split_messages(turn_messages(t))
        enc = proc(text=[prompt_text(proc, msgs)], images=[images] if images else None)
        lengths.append(len(enc["input_ids"][0]))
    return sum(lengths) / max(len(lengths), 1)


def sft_vlm(b: Any, ds: Any, start: Path, label: str, text_only: bool = False) -> Any:
    """SFT of the model at ``start`` on ``ds`` (the product's trainer); says the loss curve's
    ends and fails if the loss did not fall."""
    from stages.train import SFTConfig, run_sft

    a, t0 = b.a, time.perf_counter()
    cfg = SFTConfig(
        dataset=ds.dataset_id,
        model=str(start),
        epochs=a.epochs,
        lr=a.lr,
        batch_size=a.batch,
        save_every=1_000_000,
        text_only=text_only,
        seed=a.seed,
    )
    res = run_sft(b.wh, cfg)
    secs = time.perf_counter() - t0
    b.timed(f"sft {label}", t0)
    first, last = learning.loss_ends(b, res.training_run_id, most=10)
    say(
        f"sft {label}: {ds.counts['sft']} turns, {res.last_step} steps, loss {first:.3f} -> "
        f"{last:.3f}, {secs:.0f} s ({res.last_step * a.batch / secs:.1f} turns/s)"
    )
    if not last < first:
        raise SystemExit(f"sft {label}: the loss did not fall ({first} -> {last})")
    return res


async def rl_vlm(b: Any, start: str, anchor: str) -> Any:
    """GRPO on token log-probs from the SFT checkpoint ``start``: ``--group`` samples (T 1) of
    ``--rl-tasks`` ``train`` tasks per iteration, rolled out by the model served by
    ``--rl-serve`` (``hf``: serve-model, weights synced after every update) with the bench's
    prompt, rewarded by the tasks' checkers, normalised per task; PPO-clip; thought tokens
    weighted ``--reasoning-weight`` (RL4VLM); the SFT loss on ``anchor`` beside every update."""
    from stages.config import config_from_mapping
    from stages.train import RLConfig, run_rl

    a, t0 = b.a, time.perf_counter()
    rollout = {
        "policy": "hf",
        "samples": a.group,
        "n_tasks": a.rl_tasks,
        "max_steps": a.eval_max_steps,
        "temperature": 1.0,
        "choose": a.rl_choose,
        "seed": a.seed,
        **collect_settings(a),
    }
    cfg = config_from_mapping(
        RLConfig,
        {
            "policy": start,
            "estimator": "grpo",
            "iterations": a.rl_iterations,
            "lr": a.rl_lr,
            "batch_size": a.batch,
            "ppo_epochs": 1,
            "reasoning_weight": a.reasoning_weight,
            "anchor_dataset": anchor,
            "anchor_coef": 1.0,
            "rollout": rollout,
            "serve": a.rl_serve,
        },
    )
    res = await run_rl(b.wh, cfg, say, server=b.server, browser=b.browser)
    b.timed("rl", t0)
    for r in res.iterations:
        say(
            f"rl iteration {r.iteration} (grpo, {a.rl_choose}, served: "
            f"{a.rl_serve if r.served_from else 'in-process'}): mean reward "
            f"{r.mean_reward:.3f} over {r.trajectories} samples, {r.nonzero_advantage}/{r.turns} "
            f"turns with a learning signal, {r.steps_run} update(s)"
        )
    return res


def metrics_line(b: Any, label: str, path: Path, turns: list[Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    m = heldout_metrics(path, turns, b.a)
    b.timed("held-out metrics", t0)
    kinds = ", ".join(f"{k} {v['hits']}/{v['n']}" for k, v in m["by_action"].items())
    say(
        f"  {label:<24} held-out NLL {m['nll']:.3f}/token, next-action accuracy "
        f"{m['accuracy']:.1%} of {m['n']} turns ({kinds})"
    )
    if learning.RESULTS is not None:
        learning.RESULTS.figures.setdefault("heldout", {})[label] = m
    return m


async def run_all(b: Any, home: Path) -> None:
    from sites.tasks import generate
    from training.data import find_dataset, sft_turns
    from training.models import IdeficsSize, build_idefics, build_smol_idefics
    from warehouse.tasks import put_tasks

    a = b.a
    tasks = generate(a.tasks, seed=0, version="4", templates=TEMPLATES)
    put_tasks(b.wh, tasks)
    say(f"tasks: {len(tasks)} of {', '.join(TEMPLATES)} (suite version 4)")
    seen = collect_settings(a)
    train_run = await learning.expert_run(
        b, "vlm-train", n=a.train, collect={**seen, "seed": a.seed}
    )
    held_run = await learning.expert_run(b, "vlm-heldout", split="test", n=a.heldout, collect=seen)
    sets = {  # name: (split, run, screenshots per prompt)
        "train": ("train", train_run, 1),
        "train-a11y": ("train", train_run, 0),
        "heldout": ("test", held_run, 1),
    }
    ds = {
        name: learning.build(
            b, DATA.format(name=name, split=sp, run=json.dumps(run), k=k), home / "datasets"
        )
        for name, (sp, run, k) in sets.items()
    }
    turns = {
        name: sft_turns(find_dataset(b.wh, ds[name].dataset_id).export_path, (sets[name][0],))
        for name in ("train", "heldout")
    }
    turns["heldout-a11y"] = [without_images(t) for t in turns["heldout"]]

    t0 = time.perf_counter()
    if a.model == "smol":
        start = build_smol_idefics(home / "models" / "smol-idefics", seed=a.seed)
        shape = "smol-idefics (SmolLM2-135M-Instruct, pretrained; random vision tower)"
    else:
        size = IdeficsSize(hidden=a.hidden, layers=a.layers, vocab_size=a.vocab)
        corpus = prompt_texts(turns["train"])
        start = build_idefics(
            home / "models" / "vlm-untrained", seed=a.seed, size=size, corpus=corpus
        )
        shape = f"Idefics3 {a.hidden} wide x {a.layers} layers, vocabulary {a.vocab}, random"
    b.timed("build", t0)
    n_params, tokens = parameters(start), mean_prompt_tokens(start, turns["heldout"])
    visible = target_visible(turns["train"])
    say(
        f"model: {shape}, {n_params / 1e6:.2f} M parameters; mean prompt {tokens:.0f} tokens; "
        "the expert's "
        f"target is in the cut tree in {visible:.0%} of its ref actions"
    )
    if learning.RESULTS is not None:
        learning.RESULTS.figures["model"] = {
            "parameters": n_params,
            "mean_prompt_tokens": tokens,
            "target_visible": visible,
        }

    seeing = sft_vlm(b, ds["train"], start, "screenshot+a11y")
    blind_res = sft_vlm(b, ds["train-a11y"], start, "a11y only", text_only=True)

    rl_res = await rl_vlm(b, seeing.checkpoint, ds["train"].dataset_id) if a.rl else None

    say("held-out expert turns (test split, never trained on):")
    metrics_line(b, "untrained", start, turns["heldout"])
    metrics_line(b, "sft screenshot+a11y", Path(seeing.checkpoint), turns["heldout"])
    if rl_res is not None:
        metrics_line(b, "rl", Path(rl_res.checkpoint), turns["heldout"])
    metrics_line(b, "sft a11y only", Path(blind_res.checkpoint), turns["heldout-a11y"])

    ids = sorted(t.task_id for t in tasks if t.split == "test")
    random.Random(0).shuffle(ids)  # (sorted ids are grouped by template)
    ids, few = tuple(sorted(ids[: a.eval_n])), tuple(sorted(ids[: min(a.secondary_n, a.eval_n)]))
    say(
        f"closed loop (greedy, max {a.eval_max_steps} steps): SFT and RL on {len(ids)} test "
        f"tasks, untrained, a11y only and candidates on the first {len(few)} of them:"
    )
    roll = {"policy": "hf", **collect_settings(a)}
    blind_roll = {"policy": "hf", **collect_settings(a, screenshots=False)}
    await learning.evaluate(b, "untrained", str(start), "test", few, roll)
    await learning.evaluate(b, "sft screenshot+a11y", seeing.checkpoint, "test", ids, roll)
    if rl_res is not None:
        await learning.evaluate(b, "rl", rl_res.checkpoint, "test", ids, roll)
    await learning.evaluate(b, "sft a11y only", blind_res.checkpoint, "test", few, blind_roll)
    pixel_ids = tuple(sorted(t.task_id for t in tasks if t.split == "test" and PIXELS in t.task_id))
    pixel_ids = pixel_ids[: a.pixels_n]
    say(f"pixels only ({PIXELS}, all {len(pixel_ids)} of its test tasks, greedy):")
    await learning.evaluate(b, "px screenshot+a11y", seeing.checkpoint, "test", pixel_ids, roll)
    await learning.evaluate(b, "px a11y only", blind_res.checkpoint, "test", pixel_ids, blind_roll)
    choosing = {**roll, "choose": "candidates"}
    await learning.evaluate(b, "sft candidates", seeing.checkpoint, "test", few, choosing)
    if rl_res is not None:
        await learning.evaluate(b, "rl candidates", rl_res.checkpoint, "test", few, choosing)
    labels = ["sft screenshot+a11y", "sft a11y only", "sft candidates"]
    for label in labels + ["rl candidates"] * (rl_res is not None):
        learning.by_template(b, label, "test")
    report(b)
    if a.serve_check != "none":
        final = rl_res.checkpoint if rl_res is not None else seeing.checkpoint
        await served_greedy(b, final, turns["heldout"][: a.serve_check_n])


async def served_greedy(b: Any, checkpoint: str, turns: list[Any]) -> None:
    """The checkpoint served by ``--serve-check`` (vLLM or serve-model): its greedy replies to
    held-out prompts against the in-process model's, reply by reply."""
    from rollouts.chat import ChatClient
    from rollouts.hf import HFGenerator, load_model
    from stages.served import ServedCheckpoints
    from training.vlm import turn_messages

    a, t0 = b.a, time.perf_counter()
    prompts = [turn_messages(t) for t in turns]
    model, proc = load_model(checkpoint)
    local = [g.text for g in HFGenerator(model, proc).run_batch(prompts, a.max_new_tokens)]
    served = ServedCheckpoints(engine=a.serve_check, max_model_len=4096)
    try:
        url, name = await asyncio.to_thread(served.endpoint, checkpoint)
        client = ChatClient(url, name, timeout_s=300, retries=1)
        try:
            remote = [
                await client.text(m, temperature=0, max_tokens=a.max_new_tokens) for m in prompts
            ]
        finally:
            await client.aclose()
    finally:
        served.stop()
    b.timed("serve check", t0)
    same = sum(x == y for x, y in zip(local, remote, strict=True))
    say(
        f"served by {served.engine_name}: greedy replies equal the in-process model's on "
        f"{same} of {len(prompts)} held-out prompts ({time.perf_counter() - t0:.0f} s, start "
        "included)"
    )
    for x, y in zip(local, remote, strict=True):
        if x != y:
            say(f"  differs: in-process {x!r}, served {y!r}")
    if learning.RESULTS is not None:
        learning.RESULTS.figures["served"] = {
            "engine": served.engine_name,
            "equal": same,
            "n": len(prompts),
        }


def report(b: Any) -> None:
    """SFT vs untrained, screenshot vs accessibility-only, the candidates choice vs free
    generation and RL vs SFT (each way of acting), paired, with the pixels-only template's own
    line."""
    pairs = [("untrained", "sft screenshot+a11y"), ("sft a11y only", "sft screenshot+a11y")]
    choice, pixels = (
        ("sft screenshot+a11y", "sft candidates"),
        ("px a11y only", "px screenshot+a11y"),
    )
    rl = [("sft screenshot+a11y", "rl"), ("sft candidates", "rl candidates")]
    learning.differences(
        b,
        [*pairs, choice, *rl, pixels],
        force=frozenset({pairs[1], choice, pixels}),
        common_tasks=b.a.secondary_n < b.a.eval_n,  # (paired on the tasks both ran)
    )
    tables = {k: learning.solved_by_template(b, k, "test") for k in (pairs[1][0], pairs[1][1])}
    blind, seeing = (tables[k].get(PIXELS, (0, 0)) for k in pairs[1])
    say(
        f"pixels only ({PIXELS}) among those tasks: screenshot+a11y {seeing[0]} of {seeing[1]}, "
        f"a11y only {blind[0]} of {blind[1]} (chance: 1 in 6 colours; all its tasks: above)"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return learning.sized_args(__doc__, FULL, QUICK, argv)


def main() -> None:
    learning.run_bench("learning_vlm", parse_args(), run_all)


if __name__ == "__main__":
    main()
