"""The ``ranker`` policy: prompt parsing, candidate generation (on real snapshots of the bundled
sites, against the expert's actions), the scorer's checkpoint round trip, and acting on a live
page through the engine."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rollouts.actions import Answer, Click, ParseError, Select, Target, Type, parse_action
from rollouts.encoder import DIM, TextEncoder
from rollouts.engine import Finished
from rollouts.policies import POLICIES, ExpertPolicy, PolicyContext, make_policy
from rollouts.prompts import PromptConfig, Turn, build_messages, render
from rollouts.ranker import (
    FEATURES,
    NotAWebloopPrompt,
    RankerModel,
    RankerPolicy,
    batch_tensors,
    candidates,
    encode_input,
    instruction_values,
    oracle_coverage,
    parse_prompt,
    parse_tree,
    target_index,
)
from sites.tasks import generate
from tests.rollouts.engine_runner import run_on_chromium

TREE = """- generic [active] [ref=e1]:
  - main [ref=e6]:
    - heading "Search flights" [level=1] [ref=e7]
    - textbox "From" [ref=e11]:
      - /placeholder: City or airport
      - text: Mias (MIA)
    - textbox "Departure date" [ref=e19]
    - combobox "Stops" [ref=e13]:
      - option "Any" [selected]
      - option "Nonstop only"
    - table [ref=e17]:
      - row [ref=e27]:
        - cell "Skyline" [ref=e28]
        - cell "$69" [ref=e33]
        - cell [ref=e34]:
          - link "Select" [ref=e35] [cursor=pointer]:
            - /url: /book/1
    - paragraph [ref=e16]: "★ 3.6 (3 reviews) · Brand: Brightwell · Category: Outdoor"
    - 'link "Budget review #31" [ref=e40] [cursor=pointer]':
      - /url: /message/m1
    - checkbox "Vacation responder on" [ref=e25]
    - button "Search flights" [ref=e20] [cursor=pointer]"""
INSTRUCTION = (
    "Book the cheapest flight from Mias to Videl on 2026-06-17 for Ada Hopper "
    '(ada.hopper@example.net), 2 seats, note "window please".'
)


class HashEncoder(TextEncoder):
    """A deterministic stand-in for MiniLM (unit vectors seeded by the text's hash): fast tests
    of everything but the encoder."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for t in texts:
            seed = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out.append(v / np.linalg.norm(v))
        return np.stack(out) if out else np.zeros((0, DIM), np.float32)

    def encode_fresh(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)


def messages(history: list[str] | None = None, tree: str = TREE, error: str | None = None):
    turns = [Turn("u", "t", a11y="x", action_text=a, error=error) for a in history or []]
    turns.append(Turn("http://127.0.0.1:5/flights?x=1", "Farefinder — search", a11y=tree))
    return build_messages(INSTRUCTION, turns, PromptConfig(mode="a11y"))


def test_parse_prompt_reads_what_build_messages_wrote() -> None:
    msgs = messages(["click(e24)", 'type(e11, "Mia")'], error="boom")
    for form in (msgs, render(msgs)):
        inp = parse_prompt(form)
        assert inp.instruction == INSTRUCTION
        assert inp.history == ("click(e24)", 'type(e11, "Mia")')
        assert inp.failed == (True, True)
        assert inp.title == "Farefinder — search"  # a title holding " — " keeps it
        assert inp.url == "http://127.0.0.1:5/flights?x=1"
        assert inp.tree == TREE
    none = parse_prompt(messages())
    assert none.history == () and none.failed == ()
    both = build_messages("Do it", [Turn("u", "T", screenshot=b"png", a11y="- button")])
    assert parse_prompt(both).tree == "- button"
    shot = build_messages("Do it", [Turn("u", "T", screenshot=b"png", a11y="- x")],
                          PromptConfig(mode="screenshot"))  # fmt: skip
    assert parse_prompt(shot).tree == ""
    with pytest.raises(NotAWebloopPrompt, match="system"):
        parse_prompt([{"role": "user", "content": "Task: x"}])
    with pytest.raises(NotAWebloopPrompt, match="JSON"):
        parse_prompt("not json")


def test_tree_parsing_unquotes_yaml_lines_and_nests() -> None:
    nodes = {n.ref: n for n in parse_tree(TREE) if n.ref}
    assert nodes["e40"].role == "link" and nodes["e40"].name == "Budget review #31"
    assert nodes["e16"].text.startswith("★ 3.6")
    assert [c.name for c in nodes["e13"].children] == ["Any", "Nonstop only"]
    assert nodes["e35"].parent is not None and nodes["e35"].parent.ref == "e34"


def test_instruction_values_cover_the_kinds_of_typed_text() -> None:
    values = instruction_values(INSTRUCTION)
    for v in ("window please", "ada.hopper@example.net", "2026-06-17", "Mias", "Mia", "Vid",
              "Ada Hopper", "Ada", "Hopper", "2"):  # fmt: skip
        assert v in values, v
    assert "Book" not in [v for v in values if v.lower() == "book the"]
    mail = (
        'Reply to the email "Budget review #31" from Ken Torvalds with the message: See you then.'
    )
    assert {"Budget review #31", "See you then.", "See you then", "Ken Torvalds"} <= set(
        instruction_values(mail)
    )


def test_candidates_cover_clicks_types_selects_answers_with_features() -> None:
    inp = parse_prompt(messages(['type(e11, "Mia")']))
    cands = candidates(inp)
    actions = {c.action for c in cands}
    e = lambda r: Target(ref=r)  # noqa: E731
    expected = [
        Click(e("e35")), Click(e("e40")), Click(e("e25")), Click(e("e20")),
        Type("2026-06-17", e("e19")), Type("Vid", e("e11")),
        Select(e("e13"), "Nonstop only"),
        Answer("$69"), Answer("3.6"), Answer("Brightwell"), Answer("done"),
    ]  # fmt: skip
    for a in expected:
        assert a in actions, a
    assert Click(e("e28")) not in actions  # a plain cell is not clickable
    assert len(actions) == len(cands)  # deduplicated by parsed action
    by = {c.action: dict(zip(FEATURES, c.features, strict=True)) for c in cands}
    mia = by[Type("Mia", e("e11"))]
    assert mia["value_typed_into_this_before"] == 1.0 and mia["ref_in_last_action"] == 1.0
    assert by[Type("2026-06-17", e("e19"))]["value_is_date"] == 1.0
    assert by[Type("2026-06-17", e("e19"))]["value_typed_before"] == 0.0
    assert by[Select(e("e13"), "Any")]["option_selected"] == 1.0
    assert by[Answer("$69")]["value_is_price"] == 1.0
    # share of the element's word stems (no stop words) found in the instruction
    assert by[Click(e("e20"))]["name_overlap"] == pytest.approx(1 / 2)  # "flights" ~ "flight"
    assert by[Click(e("e25"))]["name_overlap"] == 0.0  # "Vacation responder on"
    assert by[Answer("$69")]["key_overlap"] == 0.0
    assert (
        by[Type("Vid", e("e11"))]["value_near_last_typed"]
        > by[Type("2026-06-17", e("e19"))]["value_near_last_typed"]
    )
    assert target_index(cands, 'Thought: go.\nAction: select(e13, "Nonstop only")') is not None
    assert target_index(cands, "Action: click( e20 )") == target_index(cands, "click(e20)")
    assert target_index(cands, "Action: click(e999)") is None
    assert target_index(cands, "nothing") is None


def test_save_load_gives_identical_scores(tmp_path) -> None:
    model = RankerModel(seed=3).eval()
    enc = encode_input(parse_prompt(messages(["click(e24)"])), HashEncoder())
    before = model(*batch_tensors([enc])).detach()
    model.save_pretrained(tmp_path / "ck")
    import json

    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["model_type"] == "webloop-ranker" and cfg["features"] == list(FEATURES)
    assert "MiniLM" in cfg["encoder"] and cfg["feature_version"] >= 1
    again = RankerModel.from_pretrained(tmp_path / "ck")
    after = again(*batch_tensors([enc])).detach()
    assert before.shape == (len(enc.candidates),)
    assert np.array_equal(before.numpy(), after.numpy())
    other = RankerModel(seed=4).eval()(*batch_tensors([enc])).detach()
    assert not np.allclose(before.numpy(), other.numpy())  # the seed matters
    cfg["feature_version"] = 999
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="feature set version"):
        RankerModel.from_pretrained(tmp_path / "ck")


def _act(policy: RankerPolicy, seed: int, tree: str = TREE) -> Any:
    ctx = PolicyContext(
        "t", INSTRUCTION, None, [Turn("http://h/", "T", a11y=tree)], random.Random(seed)
    )
    return asyncio.run(policy.act(ctx))


def test_policy_greedy_is_deterministic_and_sampling_varies_with_the_seed() -> None:
    assert POLICIES.factories["ranker"] is RankerPolicy
    greedy = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
    outs = [_act(greedy, s) for s in range(3)]
    assert len({o.text for o in outs}) == 1
    cands, scores = greedy.rank(outs[0].messages)
    best = int(np.argmax(scores))
    assert outs[0].action == cands[best].action
    logp = scores - np.log(np.exp(scores - scores.max()).sum()) - scores.max()
    assert outs[0].logprob == pytest.approx(logp[best], abs=1e-5) and outs[0].logprob < 0
    hot = make_policy("ranker", temperature=5.0, encoder=HashEncoder())
    sampled = [_act(hot, s) for s in range(12)]
    assert len({o.text for o in sampled}) > 3
    assert all(not isinstance(o.action, ParseError) for o in sampled)
    # the log-prob is under softmax(scores) at T=1 whatever the sampling temperature
    for o in sampled:
        i = next(k for k, c in enumerate(cands) if c.action == o.action)
        assert o.logprob == pytest.approx(logp[i], abs=1e-5)
    with pytest.raises(ValueError, match="accessibility tree"):
        RankerPolicy(prompt=PromptConfig(mode="screenshot"))


def test_top_k_lists_the_likeliest_distinct_actions_best_first() -> None:
    policy = make_policy("ranker", temperature=1.0, encoder=HashEncoder())
    ctx = PolicyContext(
        "t", INSTRUCTION, None, [Turn("http://h/", "T", a11y=TREE)], random.Random(0)
    )
    outs = asyncio.run(policy.top_k(ctx, 4))
    cands, scores = policy.rank(outs[0].messages)
    order = [int(i) for i in np.argsort(-scores, kind="stable")[:4]]
    assert [o.action for o in outs] == [cands[i].action for i in order]
    assert len({o.text for o in outs}) == 4  # distinct, where samples could repeat one action
    logps = [o.logprob for o in outs]
    assert (
        logps == sorted(logps, reverse=True)
        and logps[0]
        == _act(make_policy("ranker", temperature=0.0, encoder=HashEncoder()), 0).logprob
    )


def test_prompts_ranked_together_get_the_same_scores_as_ranked_alone() -> None:
    """Concurrent episodes share the ranker's calls (``rank_many``: one encoder call for their
    new texts); each prompt's scores are the same bits as ranking it alone, so batching never
    changes what an episode does."""
    policy = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
    instructions = [INSTRUCTION, "Search Openpedia for Hamarton", "Accept the cookies"]

    def ctx(k: int) -> PolicyContext:
        turns = [Turn("http://h/", "T", a11y=TREE)]
        return PolicyContext(f"t{k}", instructions[k % 3], None, turns, random.Random(k))

    async def together() -> list:
        return await asyncio.gather(*(policy.act(ctx(k)) for k in range(6)))

    outs = asyncio.run(together())
    ranked = policy.rank_many([o.messages for o in outs])
    for k, (out, (cands, scores)) in enumerate(zip(outs, ranked, strict=True)):
        alone = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
        solo_cands, solo_scores = alone.rank(out.messages)
        assert np.array_equal(scores, solo_scores) and cands == solo_cands
        solo = asyncio.run(alone.act(ctx(k)))
        assert (solo.text, solo.logprob) == (out.text, out.logprob)
    asyncio.run(policy.aclose())


# -- real snapshots of the bundled sites --------------------------------------------------------

TEMPLATES = ["shop_add_to_cart", "wiki_twin_city", "mail_reply", "travel_book_cheapest"]


def _run(
    chromium: Any, server: Any, policy: Any, tasks: list[Any], max_steps: int
) -> list[Finished]:
    return run_on_chromium(
        chromium, server, policy, tasks, run_id="ranker-test", concurrency=4, max_steps=max_steps
    )


@pytest.fixture(scope="module")
def tasks() -> list[Any]:
    seen: dict[str, Any] = {}
    for t in generate(120, seed=5):
        seen.setdefault(t.meta["template"], t)
    return [seen[k] for k in TEMPLATES]


@pytest.mark.browser
def test_candidates_of_real_snapshots_contain_the_experts_actions(chromium, server, tasks):
    expert = ExpertPolicy(action_space="ref", prompt=PromptConfig(mode="a11y"))
    done = _run(chromium, server, expert, tasks, 60)
    assert {f.trajectory.status for f in done} == {"success"}
    rows, uncovered = [], []
    for f in done:
        site = f.trajectory.task_id.split("/")[1].split("_")[0]
        for s in f.steps:
            row = {"prompt": f.blobs[s.prompt_hash].decode(), "action_text": s.action_text}
            rows.append(row)
            inp = parse_prompt(row["prompt"])
            if target_index(candidates(inp), f"Action: {s.action_text}") is None:
                uncovered.append((site, s.action_text, inp.tree))
    assert len(rows) >= 25
    # Every miss is a travel autocomplete suggestion the observation does not show yet (the
    # snapshot is taken before the suggestions render): its ref is not in the tree.
    for site, action, tree in uncovered:
        ref = parse_action(action).target.ref  # type: ignore[union-attr]
        assert site == "travel" and f"[ref={ref}]" not in tree, (site, action)
    assert oracle_coverage(rows) == pytest.approx(1 - len(uncovered) / len(rows))
    assert oracle_coverage(rows) >= 0.85


@pytest.mark.browser
def test_untrained_policy_acts_on_live_pages(chromium, server, tasks):
    policy = make_policy("ranker", seed=0, prompt=PromptConfig(mode="a11y"))
    done = _run(chromium, server, policy, tasks[:2], 3)
    assert len(done) == 2
    steps = [s for f in done for s in f.steps]
    assert steps and all(s.prompt_hash for s in steps)
    for s in steps:
        assert not isinstance(parse_action(s.model_output or ""), ParseError), s.model_output
        assert s.logprob is not None and s.logprob <= 0.0


def test_encoder_caches_in_memory_lru_and_on_disk(tmp_path) -> None:
    enc = TextEncoder(max_items=2, cache_dir=tmp_path / "emb")
    v = enc.encode(["Accept all", "Search flights", "Accept all"])
    assert v.shape == (3, DIM) and v.dtype == np.float32
    assert np.array_equal(v[0], v[2]) and enc.misses == 2 and enc.hits == 0
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    enc.encode(["Reject optional"])  # evicts "Accept all" from memory (LRU of 2) ...
    assert len(enc) == 2
    enc.encode(["Accept all"])  # ... but the disk shard still holds it
    assert enc.misses == 3
    assert enc.flush() >= 1
    warm = TextEncoder(cache_dir=tmp_path / "emb")
    again = warm.encode(["Accept all", "Search flights"])
    assert warm.misses == 0 and warm.hits == 2
    assert np.array_equal(again, v[:2])
    assert warm.encode([]).shape == (0, DIM)
    with pytest.raises(TypeError):
        warm.encode("Accept all")


def test_a_texts_vector_barely_depends_on_what_was_encoded_beside_it() -> None:
    """The same text alone, in a batch of others (shorter, longer, the same token count), at any
    position and under 1 or 2 threads: the vectors agree to float32 noise (kernel paths depend
    on the batch shape, the thread count and the CPU, so not always to the bit), and
    :meth:`TextEncoder.encode_fresh` gives the bits of one canonical call whatever was cached
    (what the trainer reads: the same rows and seed give the same checkpoint)."""
    import torch

    from rollouts.encoder import TextEncoder, encode_uncached

    rng = random.Random(7)
    words = ["add", "the", "blue", "kettle", "to", "cart", "search", "flights", "Ripeel", "Mia"]
    texts = sorted({" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(300)})
    probes = [*texts[::37], "Accept all", "link Checkout — /cart"]
    alone = {t: encode_uncached([t])[0] for t in probes}
    threads = torch.get_num_threads()
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            mixed = texts + probes
            rng.shuffle(mixed)
            vecs = encode_uncached(mixed)
            for t in probes:
                np.testing.assert_allclose(vecs[mixed.index(t)], alone[t], rtol=0, atol=2e-6)
    finally:
        torch.set_num_threads(threads)
    cold, warm = TextEncoder(), TextEncoder()
    warm.encode(texts)  # vectors computed beside 300 other texts
    fresh = warm.encode_fresh(probes)
    assert np.array_equal(fresh, cold.encode_fresh(probes))
    assert np.array_equal(warm.encode(probes), fresh)  # and cached for encode()
    # and the vectors are MiniLM's: a text is nearer to itself reworded than to another text
    a, b, c = encode_uncached(
        [
            "Add the blue kettle to the cart",
            "Put the blue kettle into your cart",
            "Reply to Mia Kim",
        ]
    )
    assert float(a @ b) > 0.8 > float(a @ c)
