"""The tiers' rules hold (``tests/tiers.py``): the default tier's measured files fit its time
budget, the weights are current, and a ``long`` marker without a valid default-tier twin is
refused."""

from __future__ import annotations

from pathlib import Path

from tests.tiers import DEFAULT_BUDGET_S, ROOT, read_weights, twin_problem


def test_the_default_tier_fits_its_time_budget():
    weights = read_weights("default")
    total = sum(weights.values())
    heaviest = ", ".join(
        f"{u} {s:.0f} s" for u, s in sorted(weights.items(), key=lambda x: -x[1])[:6]
    )
    assert weights, "tests/weights.txt has no measured files"
    assert total <= DEFAULT_BUDGET_S, (
        f"the default tier's measured test files take {total:.0f} s on 2 workers, over its "
        f"{DEFAULT_BUDGET_S} s budget (`make test` under 15 minutes on 2 cores). Heaviest: "
        f"{heaviest}. Make them cheaper, or move their bench-size parts to the long tier "
        f"(`@pytest.mark.long(reason=... twin ...)`), then regenerate tests/weights.txt "
        f"(scripts/test_weights.py)"
    )


def test_both_tiers_are_weighed_and_every_weighed_file_exists():
    default, long = read_weights("default"), read_weights("long")
    assert default and long, "both tiers' weights are measured"
    # a unit measured in both runs is fine (a file with tests in both tiers); a stale entry is not
    for unit in [*default, *long]:
        assert (ROOT / unit).exists(), f"tests/weights*.txt weigh {unit}, which is gone"


def test_a_long_marker_must_name_an_existing_default_tier_twin(tmp_path: Path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_small.py").write_text(
        "import pytest\n"
        "def test_small(): assert 1\n"
        "@pytest.mark.long(reason='x tests/test_small.py::test_small')\n"
        "def test_big(): assert 1\n"
        "@pytest.mark.vllm\n"
        "def test_served(): assert 1\n"
        "HEAVY = pytest.mark.long(reason='tests/test_small.py::test_small')\n"
        "@HEAVY\n"
        "def test_aliased(): assert 1\n"
    )
    (tests / "test_all_long.py").write_text(
        "import pytest\npytestmark = pytest.mark.long(reason='-')\ndef test_one(): assert 1\n"
    )

    def problem(reason: str) -> str | None:
        return twin_problem(reason, where="t", root=tmp_path)

    assert problem("the bench at small size: tests/test_small.py::test_small") is None
    assert "must name the default-tier test" in problem("heavy, sorry")
    assert "does not exist" in problem("tests/test_small.py::test_tiny")
    assert "file that does not exist" in problem("tests/test_gone.py::test_small")
    assert "itself outside the default tier" in problem("tests/test_small.py::test_big")
    assert "itself outside the default tier" in problem("tests/test_small.py::test_served")
    assert "itself outside the default tier" in problem("tests/test_all_long.py::test_one")
    assert "itself outside the default tier" in problem("tests/test_small.py::test_aliased")
    # every twin named counts, not only the first
    assert "does not exist" in problem("tests/test_small.py::test_small, tests/test_small.py::x1")
