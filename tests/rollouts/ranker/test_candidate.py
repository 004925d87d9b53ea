"""The candidate actions and their features (:mod:`rollouts.ranker.candidate`): on a snapshot of
the sites' kind, and on real snapshots of the bundled sites against the expert's actions."""

from __future__ import annotations

import pytest

from rollouts.actions import Answer, Click, Select, Target, Type, parse_action
from rollouts.policies import ExpertPolicy
from rollouts.prompts import PromptConfig
from rollouts.ranker.candidate import candidates, oracle_coverage, target_index
from rollouts.ranker.features import FEATURES, slot_binding
from rollouts.ranker.prompt import parse_prompt
from tests.rollouts.ranker.fixture import messages, run


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


def test_refs_count_on_their_own_page_only_and_elements_by_name_everywhere() -> None:
    """An action taken on another page names another page's ``e11``: ref features ignore it,
    and the element features match by role and name (which survive the page change)."""
    e = lambda r: Target(ref=r)  # noqa: E731
    here = parse_prompt(messages(['type(e11, "Mia")']))
    there = parse_prompt(messages(['type(e11, "Mia")'], page=("http://h/other", "Other page")))
    f_here, f_there = (
        {c.action: dict(zip(FEATURES, c.features, strict=True)) for c in candidates(i)}
        for i in (here, there)
    )
    mia = Type("Mia", e("e11"))
    assert f_here[mia]["ref_in_last_action"] == 1.0 and f_here[mia]["ref_in_history"] == 1.0
    assert f_there[mia]["ref_in_last_action"] == 0.0 and f_there[mia]["ref_in_history"] == 0.0
    assert f_there[mia]["value_typed_into_this_before"] == 0.0
    for f in (f_here, f_there):  # 'textbox "From"' in the history line, on either page
        assert f[mia]["target_in_last_action"] == 1.0 and f[mia]["target_in_history"] == 1.0
        assert f[Click(e("e20"))]["target_in_history"] == 0.0


def test_slot_binding_pairs_a_value_with_the_field_its_words_name() -> None:
    """'from Mias to Videl': Mias binds to the "From" field, Videl does not (a word between)."""
    e = lambda r: Target(ref=r)  # noqa: E731
    by = {c.action: dict(zip(FEATURES, c.features, strict=True)) for c in candidates(
        parse_prompt(messages()))}  # fmt: skip
    assert by[Type("Mias", e("e11"))]["slot_binding"] == 1.0
    assert by[Type("Videl", e("e11"))]["slot_binding"] == 0.0
    assert by[Type("Mias", e("e19"))]["slot_binding"] == 0.0  # "Departure date"
    assert slot_binding("send it to bob@x.org now", "bob@x.org", "To") == 1.0
    assert slot_binding("search for the red kettle", "red kettle", "Search") == 0.5
    assert slot_binding("a to b", "b", "") == 0.0


@pytest.mark.browser
def test_candidates_of_real_snapshots_contain_the_experts_actions(chromium, server, tasks):
    expert = ExpertPolicy(action_space="ref", prompt=PromptConfig(mode="a11y"))
    done = run(chromium, server, expert, tasks, 60)
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


SHOP_RESULTS = """- main [ref=e1]:
  - searchbox "Search products" [ref=e2]
  - button "Search" [ref=e3] [cursor=pointer]
  - link "Blue Kettle" [ref=e4] [cursor=pointer]:
    - /url: /product/1
  - link "Red Mug" [ref=e5] [cursor=pointer]:
    - /url: /product/2"""
WIKI_PAGE = """- main [ref=e1]:
  - heading "Lyon" [level=1] [ref=e2]
  - table [ref=e3]:
    - row [ref=e4]:
      - cell "Twin city" [ref=e5]
      - cell [ref=e6]:
        - link "Oslo" [ref=e7] [cursor=pointer]:
          - /url: /wiki/oslo
  - link "Paris" [ref=e8] [cursor=pointer]:
    - /url: /wiki/paris"""


def _features(instruction: str, turns: list) -> dict:
    from rollouts.prompts import build_messages

    inp = parse_prompt(build_messages(instruction, turns, PromptConfig(mode="a11y")))
    return {c.action: dict(zip(FEATURES, c.features, strict=True)) for c in candidates(inp)}


def test_progress_features_count_values_typed_on_earlier_pages() -> None:
    """A multi-item task: the first item was searched for and added on other pages; the
    features say it was typed before, that the second item lies past the progress mark, and
    which search result matches the latest query."""
    from rollouts.prompts import Turn

    instr = "Add 1 × the Blue Kettle and 2 × the Red Mug to your shopping cart."
    e = lambda r: Target(ref=r)  # noqa: E731
    first = _features(instr, [Turn("http://s/", "Shoply", a11y=SHOP_RESULTS)])
    assert first[Type("Red Mug", e("e2"))]["value_after_progress"] == 0.0  # nothing typed yet
    turns = [
        Turn("http://s/", "Shoply", a11y=SHOP_RESULTS, action_text='type(e2, "Blue Kettle")'),
        Turn("http://s/search", "Results — Shoply", a11y=SHOP_RESULTS, action_text="click(e4)"),
        Turn("http://s/product/1", "Blue Kettle — Shoply", a11y=SHOP_RESULTS),
    ]
    f = _features(instr, turns)
    kettle, mug = Type("Blue Kettle", e("e2")), Type("Red Mug", e("e2"))
    assert f[kettle]["value_typed_before"] == 1.0  # typed on another page: still counts
    assert f[kettle]["value_typed_into_this_before"] == 0.0  # its ref named another page's e2
    assert f[mug]["value_typed_before"] == 0.0
    assert f[mug]["value_after_progress"] == 1.0 and f[kettle]["value_after_progress"] == 0.0
    assert f[mug]["progress"] == pytest.approx(
        (instr.lower().find("blue kettle") + 11) / len(instr)
    )
    assert f[Click(e("e4"))]["name_matches_last_typed"] == 1.0  # the result named as searched
    assert f[Click(e("e5"))]["name_matches_last_typed"] == 0.0
    assert f[Click(e("e4"))]["name_is_visited_page"] == 1.0  # "Blue Kettle — Shoply" was seen
    assert f[Click(e("e4"))]["links_followed"] == pytest.approx(1 / 5)  # result → its page


def test_links_followed_counts_the_hops_of_a_chain_of_links() -> None:
    from rollouts.prompts import Turn

    instr = "On Openpedia, find the twin city of Paris. What is that city's population?"
    e = lambda r: Target(ref=r)  # noqa: E731
    paris = WIKI_PAGE.replace('"Lyon"', '"Paris"').replace('"Oslo"', '"Lyon"')
    turns = [
        Turn("http://w/", "Openpedia", a11y=SHOP_RESULTS, action_text='type(e2, "Paris")'),
        Turn("http://w/", "Openpedia", a11y=SHOP_RESULTS, action_text="click(e3)"),
        Turn("http://w/wiki/paris", "Paris — Openpedia", a11y=paris, action_text="click(e7)"),
        Turn("http://w/wiki/lyon", "Lyon — Openpedia", a11y=WIKI_PAGE),
    ]
    f = _features(instr, turns)
    assert f[Click(e("e7"))]["links_followed"] == pytest.approx(1 / 5)  # link "Lyon" → Lyon
    assert f[Click(e("e8"))]["name_is_visited_page"] == 1.0  # back to Paris
    assert f[Click(e("e7"))]["name_is_visited_page"] == 0.0  # Oslo: not seen yet
    before = _features(instr, turns[:3])
    assert before[Click(e("e7"))]["links_followed"] == 0.0  # the search button is no link hop


CART = """- main [ref=e1]:
  - searchbox "Search products" [ref=e2]
  - table [ref=e3]:
    - row [ref=e4]:
      - cell "Blue Kettle" [ref=e5]
      - cell "2" [ref=e6]
  - button "Checkout" [ref=e7] [cursor=pointer]"""
PRODUCT = """- main [ref=e1]:
  - heading "Red Mug" [level=1] [ref=e2]
  - combobox "Colour" [ref=e3]:
    - option "Blue"
    - option "Green"
  - spinbutton "Quantity" [ref=e4]
  - button "Add to cart" [ref=e5] [cursor=pointer]"""


def test_page_features_say_what_the_page_shows_and_which_clause_it_is_about() -> None:
    """On the cart, the item it lists is on the page (the other is not); on an item's page,
    its own quantity and colour are in the clause naming it (the other item's are not)."""
    from rollouts.prompts import Turn

    instr = "Add 2 × the Blue Kettle in Green and 3 × the Red Mug in Blue to your shopping cart."
    e = lambda r: Target(ref=r)  # noqa: E731
    cart = _features(instr, [Turn("http://s/cart", "Cart — Shoply", a11y=CART)])
    assert cart[Type("Blue Kettle", e("e2"))]["value_on_page"] == 1.0
    assert cart[Type("Red Mug", e("e2"))]["value_on_page"] == 0.0
    assert cart[Click(e("e7"))]["values_on_page"] == pytest.approx(1 / 2)
    assert cart[Type("Red Mug", e("e2"))]["value_in_page_clause"] == 0.0  # "cart" names no item
    mug = _features(instr, [Turn("http://s/product/2", "Red Mug — Shoply", a11y=PRODUCT)])
    assert mug[Type("3", e("e4"))]["value_in_page_clause"] == 1.0
    assert mug[Type("2", e("e4"))]["value_in_page_clause"] == 0.0
    assert mug[Select(e("e3"), "Blue")]["value_in_page_clause"] == 1.0
    assert mug[Select(e("e3"), "Green")]["value_in_page_clause"] == 0.0
