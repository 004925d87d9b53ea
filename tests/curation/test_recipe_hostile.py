"""Hostile recipes: YAML alias bombs are refused before anything is built, and a recipe's name
cannot move its export outside the datasets folder."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from curation.export import final_path
from curation.recipe import RecipeError, load_recipe, parse_recipe

# 9 levels of 9 aliases: ~387 million strings once expanded (gigabytes), 600 bytes as text
_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    + ["name: *i"]
)


def test_a_billion_laughs_recipe_is_refused_quickly_and_small(tmp_path: Path):
    path = tmp_path / "laughs.yaml"
    path.write_text(_LAUGHS)
    assert len(_LAUGHS) < 700
    tracemalloc.start()
    start = time.monotonic()
    with pytest.raises(RecipeError, match=r"laughs\.yaml:1: an anchor \(&\): this file may not"):
        load_recipe(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - start < 2 and peak < 20_000_000


def test_a_single_alias_is_refused_with_its_line():
    with pytest.raises(RecipeError, match=r"r\.yaml:2: an alias \(\*\)"):
        parse_recipe("description: x\nname: *nope\n", "r.yaml")


@pytest.mark.parametrize("name", ["../../x", "/abs/x", "a/b", "..", ".hidden", "x y", ""])
def test_recipe_names_are_plain(name: str):
    with pytest.raises(RecipeError, match="name"):
        parse_recipe(f"name: {name!r}\n", "r.yaml")


def test_the_export_path_stays_inside_the_datasets_folder(tmp_path: Path):
    out = tmp_path / "datasets"
    assert final_path(out, "sft-v1.2", "abc") == out / "sft-v1.2-abc"
    for bad in ("../../victim", "/etc", "a/../../b"):
        with pytest.raises(ValueError, match="outside"):
            final_path(out, bad, "abc")
