"""``bench/learning_vlm.py --quick`` runs in the suite: expert turns of the short templates (a
screenshot and a focused tree in every prompt) → three datasets → a tokenizer trained on them
and an Idefics3 built from scratch → SFT with and without the screenshot (each loss must fall,
or the bench exits non-zero) → GRPO from the SFT checkpoint, served by serve-model → held-out
NLL and next-action accuracy → closed-loop evaluations in Chromium (free generation and the
candidates choice), paired → the final checkpoint served by serve-model, its greedy replies
against the in-process model's. No assertion on success: the quick size is far too small to
learn."""

from __future__ import annotations

import re

import pytest

from tests.bench.early import quick


@pytest.mark.long(
    reason=(
        "the VLM trained from scratch and evaluated at bench size; twin: "
        "tests/cli/test_train_cli.py::test_the_tiny_vlm_trains_on_the_dataset_screenshots"
    )
)
@pytest.mark.bench("learning_vlm.py")
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_learning_vlm_bench_quick_trains_a_vlm_from_scratch_and_evaluates_it():
    proc = quick("learning_vlm.py", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    sizes = dict(re.findall(r"dataset vlm-([\w-]+): \{'sft': (\d+)", out))
    assert set(sizes) == {"train", "train-a11y", "heldout"}
    assert int(sizes["train"]) == int(sizes["train-a11y"]) > 0  # the same turns, less the image
    model = re.search(
        r"model: Idefics3 64 wide x 2 layers, vocabulary 1024, random, ([\d.]+) M "
        r".*prompt (\d+) tok",
        out,
    )
    assert model and 0.1 < float(model[1]) < 5 and 100 < int(model[2]) < 2000
    losses = re.findall(r"sft (screenshot\+a11y|a11y only): .* loss ([\d.]+) -> ([\d.]+)", out)
    assert [m[0] for m in losses] == ["screenshot+a11y", "a11y only"]
    assert all(float(b) < float(a) for _, a, b in losses)
    rl = r"rl iteration \d \(grpo, candidates, served: in-process\): mean reward [\d.]+ over 4 "
    assert re.search(rl, out)
    held = dict(re.findall(r"^  ([\w +]+?) +held-out NLL ([\d.]+)/token", out, re.M))
    assert set(held) == {"untrained", "sft screenshot+a11y", "rl", "sft a11y only"}
    assert float(held["sft screenshot+a11y"]) < float(held["untrained"])  # it learned something
    # next-action accuracy by the expert's action type, which add up to the turns
    kinds = re.findall(r"held-out NLL .* accuracy [\d.]+% of (\d+) turns \(([^)]*)\)", out)
    assert len(kinds) == 4
    for n, listed in kinds:
        counts = re.findall(r"(\w+) (\d+)/(\d+)", listed)
        assert counts and sum(int(c[2]) for c in counts) == int(n), listed
        assert all(int(h) <= int(k) for _, h, k in counts)
    evals = re.findall(
        r"^  (untrained|rl(?: candidates)?|sft [\w+ ]+?) +test +(\d+)/(\d+) ", out, re.M
    )
    labels = ["untrained", "sft screenshot+a11y", "rl", "sft a11y only"]
    labels += ["sft candidates", "rl candidates"]
    assert [e[0] for e in evals] == labels
    assert {int(e[2]) for e in evals} == {2}  # the same 2 held-out tasks for each
    assert re.search(r"sft screenshot\+a11y - sft a11y only: .* paired on 2 tasks", out)
    assert re.search(r"rl - sft screenshot\+a11y: .* paired on 2 tasks", out)
    assert "protocols differ in prompt_mode" in out  # compared on purpose, and said
    # the candidates choice, paired with free generation (a decoding difference, said), and RL
    # against SFT acting so (the same protocol)
    choice = r"sft candidates - sft screenshot\+a11y: .* paired on 2 tasks.*differ in choose"
    assert re.search(choice, out)
    assert re.search(r"rl candidates - sft candidates: .* paired on 2 tasks.*p [\d.]+; Newc", out)
    served = re.search(
        r"served by hf: greedy replies equal the in-process model's on (\d) of 2", out
    )
    assert served and served[1] == "2"
    # the pixels-only template's own test tasks, screenshot against accessibility only, paired
    px = re.findall(r"^  px (screenshot\+a11y|a11y only) +test +\d+/(\d+) ", out, re.M)
    assert px == [("screenshot+a11y", "2"), ("a11y only", "2")]
    assert re.search(r"px screenshot\+a11y - px a11y only: .* paired on 2 tasks", out)
