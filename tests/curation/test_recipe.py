"""Recipes: loading, one-line errors with file:line and field, warehouse names, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from curation.filters import LengthParams, PrmThresholdParams, VerdictParams
from curation.recipe import Recipe, RecipeError, load_recipe, recipe_hash, validate_against
from curation.select import select
from tests.curation.fixture import recipe_of, report_of

RECIPES = Path(__file__).resolve().parents[2] / "curation" / "recipes"


def load_text(tmp_path: Path, text: str, name: str = "my-recipe.yaml") -> Recipe:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_recipe(path)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_text(tmp_path, text)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_full_recipe_is_typed_and_frozen(tmp_path: Path) -> None:
    r = load_text(
        tmp_path,
        "name: x\n"
        "sources: {splits: [train, valid], policies: ['expert*'], since: 2026-01-02}\n"
        "filters:\n"
        "  - verdict: {judges: [programmatic, vlm], min_agreement: 0.5}\n"
        "  - prm_threshold: {scorer: exact, min_score: 0.5}\n"
        "  - length: {max_steps: 30}\n"
        "  - drop_loops:\n"
        "balance: {per_site: 10}\n"
        "curriculum: {weights: intermediate, horizon: [5, 10]}\n"
        "gates: {success_rate: [0.2, 0.9]}\n",
    )
    assert r.sources.splits == ("train", "valid")
    assert (
        r.sources.since is not None and r.sources.since.isoformat() == "2026-01-02T00:00:00+00:00"
    )
    assert [f.name for f in r.filters] == ["verdict", "prm_threshold", "length", "drop_loops"]
    assert isinstance(r.filters[0].params, VerdictParams)
    assert r.filters[0].params.judges == ("programmatic", "vlm")
    assert isinstance(r.filters[1].params, PrmThresholdParams)
    assert r.filters[1].params.unscored == "drop"
    assert isinstance(r.filters[2].params, LengthParams) and r.filters[2].params.min_steps == 1
    assert r.filters[3].params.max_repeats == 2  # empty value → defaults
    assert r.balance.per_site == 10 and r.balance.per_task is None
    assert r.curriculum.horizon == (5, 10)
    assert r.gates.success_rate == (0.2, 0.9)
    with pytest.raises(Exception, match="frozen"):
        r.name = "y"  # type: ignore[misc]


def test_defaults() -> None:
    r = recipe_of("")
    assert r.name == "test"
    assert r.sources.splits == ("train",) and r.sources.runs == ()
    assert r.filters == () and r.curriculum.weights == "none"
    assert r.output.sft and not r.output.rl_groups and r.output.k_images == 3
    assert r.include.interventions is False and r.include.rationales is None


def test_unknown_filter_names_file_line_and_field(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "name: x\nfilters:\n  - length: {}\n  - dedup_trajectory: {}\n")
    assert msg.startswith(f"{tmp_path / 'my-recipe.yaml'}:4: filters[1]: unknown filter ")
    assert "'dedup_trajectory'" in msg and "dedup_trajectories" in msg  # lists the known ones


def test_wrong_type_in_filter_params(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path,
        "name: x\nfilters:\n  - length: {}\n  - prm_threshold:\n"
        "      scorer: exact\n      min_score: high\n",
    )
    assert msg.startswith(f"{tmp_path / 'my-recipe.yaml'}:6: filters[1].prm_threshold.min_score: ")
    assert "valid number" in msg


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        ("name: x\nbalance:\n  per_site: '3'\n", 3, "balance.per_site", "valid integer"),
        ("name: x\noutput:\n  sft: 'yes'\n", 3, "output.sft", "valid boolean"),
        ("name: x\nsources:\n  splits: [train]\n  sorce: 1\n", 4, "sources.sorce", "Extra"),
        (
            "name: x\nfilters:\n  - length: {min_step: 2}\n",
            3,
            "filters[0].length.min_step",
            "Extra",
        ),
        (
            "name: x\nfilters:\n  - verdict: {judges: []}\n",
            3,
            "filters[0].verdict.judges",
            "at least 1",
        ),
        (
            "name: x\ncurriculum:\n  weights: hard\n",
            3,
            "curriculum.weights",
            "'none' or 'intermediate'",
        ),
        ("name: x\ngates:\n  success_rate: [0.9, 0.1]\n", 3, "gates.success_rate", "low <= high"),
        ("description: no name\n", 1, "name", "Field required"),
        (
            "name: x\nfilters:\n  - length: {min_steps: 5, max_steps: 2}\n",
            3,
            "filters[0].length",
            "max_steps",
        ),
        (
            "name: x\nfilters:\n  - {length: {}, drop_loops: {}}\n",
            3,
            "filters[0]",
            "one-key mapping",
        ),
    ],
)
def test_structural_errors(tmp_path: Path, text: str, line: int, field: str, problem: str) -> None:
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'my-recipe.yaml'}:{line}: {field}: "), msg
    assert problem in msg


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path, "name: x\nfilters:\n  - length: {min_steps: 1\n  - drop_loops: {}\nbalance: {}\n"
    )
    assert msg.startswith(f"{tmp_path / 'my-recipe.yaml'}:")
    assert "YAML syntax error" in msg
    # the unclosed flow mapping started on line 3 (the length filter)
    assert "line 3" in msg or ":3:" in msg
    msg = error_of(tmp_path, "name: x\nsources:\n  splits: [train\n")
    assert "my-recipe.yaml:" in msg and "YAML syntax error" in msg and "line 3" in msg


def test_not_a_mapping_and_missing_file(tmp_path: Path) -> None:
    assert "must be a mapping" in error_of(tmp_path, "- just a list\n")
    with pytest.raises(RecipeError, match=r"nope\.yaml: cannot read the recipe"):
        load_recipe(tmp_path / "nope.yaml")


# -- names in the warehouse ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "sources:\n  runs: [expert-collect, nightly]\n",
            "recipe.yaml:2: sources.runs[1]: unknown run 'nightly'",
        ),
        (
            "sources:\n  splits: [train, trian]\n",
            "recipe.yaml:2: sources.splits[1]: unknown split 'trian'",
        ),
        (
            "sources:\n  suites: [webarena]\n",
            "recipe.yaml:2: sources.suites[0]: unknown suite 'webarena'",
        ),
        (
            "filters:\n  - length: {}\n  - verdict:\n      judges: [programmatic, gpt-judge]\n",
            "recipe.yaml:4: filters[1].verdict.judges[1]: unknown judge 'gpt-judge'",
        ),
        (
            "filters:\n  - prm_threshold: {scorer: vlm, min_score: 0.5}\n",
            "recipe.yaml:2: filters[0].prm_threshold.scorer: unknown scorer 'vlm'",
        ),
        (
            "include:\n  rationales: teacher-z\n",
            "recipe.yaml:2: include.rationales: unknown teacher 'teacher-z'",
        ),
    ],
)
def test_validate_against_unknown_names(shared_wh, text: str, expected: str) -> None:
    wh, _ = shared_wh
    recipe = recipe_of(text)  # `name: test` is prepended: lines shift by one
    with pytest.raises(RecipeError) as info:
        validate_against(recipe, wh)
    msg = str(info.value)
    shifted = expected.replace(":2:", ":3:").replace(":4:", ":5:")
    assert msg.startswith(shifted), msg
    assert "(known: " in msg


def test_validate_against_known_names_pass(shared_wh) -> None:
    wh, _ = shared_wh
    recipe = recipe_of(
        "sources: {runs: [expert-collect, run-model], splits: [train, valid, ood], "
        "suites: [bundled]}\n"
        "filters:\n"
        "  - verdict: {judges: [programmatic, vlm]}\n"
        "  - prm_threshold: {scorer: exact, min_score: 0.5}\n"
        "include: {rationales: teacher-b}\n"
    )
    assert validate_against(recipe, wh) == {
        "run": {"expert-collect", "run-model"},
        "split": {"train", "valid", "ood"},
        "suite": {"bundled"},
        "judge": {"programmatic", "vlm"},
        "scorer": {"exact"},
        "teacher": {"teacher-b"},
    }


# -- hashing ------------------------------------------------------------------------------------


def test_recipe_hash_is_content_only() -> None:
    a = recipe_of("filters:\n  - length: {min_steps: 2}   # comment\n")
    b = recipe_of("filters: [{length: {max_steps: null, min_steps: 2}}]\n", source="other.yaml")
    c = recipe_of("filters:\n  - length: {min_steps: 3}\n")
    assert recipe_hash(a) == recipe_hash(b)
    assert recipe_hash(a) != recipe_hash(c)
    assert len(recipe_hash(a)) == 64
    again = Recipe.model_validate(a.model_dump(mode="json"))
    assert recipe_hash(again) == recipe_hash(a)
    assert a.model_dump(mode="json")["filters"] == [{"length": {"min_steps": 2, "max_steps": None}}]


# -- the example recipes ------------------------------------------------------------------------


def test_example_recipes_load_and_validate(shared_wh) -> None:
    wh, _ = shared_wh
    names = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert names == ["filtered-bc.yaml", "prm-step-filtered.yaml"]
    for path in RECIPES.glob("*.yaml"):
        recipe = load_recipe(path)
        assert recipe.name == path.stem
        validate_against(recipe, wh)


def test_filtered_bc_on_the_fixture(shared_wh) -> None:
    wh, fx = shared_wh
    sel = select(wh, load_recipe(RECIPES / "filtered-bc.yaml"), snapshot_id=fx.snapshot_id)
    assert report_of(sel) == [
        ("exclude_infra", 3, 2),
        ("verdict", 3, 18),  # t05 t12 t13
        ("drop_invalid_steps", 0, 0),  # t05's invalid steps left with t05
        ("drop_loops", 0, 1),  # t06 step 4
        ("length", 0, 0),
        ("dedup_trajectories", 1, 3),  # t02
        ("dedup_tasks", 1, 2),  # t07 (task-2 rewords task-1)
        ("balance.per_task", 0, 0),  # at most 2 per task left
    ]
    assert sel.trajectories.get_column("traj_id").to_list() == ["t01", "t03", "t04", "t06"]


def test_prm_step_filtered_on_the_fixture(shared_wh) -> None:
    wh, fx = shared_wh
    recipe = load_recipe(RECIPES / "prm-step-filtered.yaml")
    sel = select(wh, recipe, snapshot_id=fx.snapshot_id)
    assert report_of(sel) == [
        ("exclude_infra", 3, 2),
        ("drop_invalid_steps", 0, 3),  # t05 steps 0-2
        ("prm_threshold", 8, 33),  # 35 kept → t03 steps 0 and 3
        ("length", 0, 0),
        ("dedup_trajectories", 0, 0),
    ]
    assert sel.steps.rows() == [("t03", 0), ("t03", 3)]
    assert sel.horizon == [5, 10, 20]
    # task-3: t03 s, t06 s, t12 f → 8/9
    assert sel.trajectories.get_column("weight").to_list() == pytest.approx([8 / 9])
    assert sel.interventions.get_column("intervention_id").to_list() == ["iv-05", "iv-13"]
