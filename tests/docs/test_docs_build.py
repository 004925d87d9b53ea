"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or
anchor fails it), and its generated parts are there: each stage config's every field, the
benchmark page from the results files, the Python API from docstrings."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stages.collect import CollectConfig
from stages.train import RLConfig

ROOT = Path(__file__).resolve().parents[2]


def mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "mkdocs"),
            "build",
            "--strict",
            "-f",
            str(config),
            "-d",
            str(site),
        ],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    res = mkdocs(ROOT / "mkdocs.yml", out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def text_of(site: Path, page: str) -> str:
    import html

    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def test_every_config_field_is_in_its_stage_page(site: Path):
    page = text_of(site, "stages/rollouts")
    for f in dataclasses.fields(CollectConfig):
        assert f.name in page, f"CollectConfig.{f.name} is not documented"
    assert "--max-steps" in page and "Step budget per trajectory." in page
    training = text_of(site, "stages/training")
    for f in dataclasses.fields(RLConfig):
        assert f.name in training, f"RLConfig.{f.name} is not documented"
    assert "rollout.n_tasks" in training and "--group-size" in training  # nested, renamed flag
    # every built-in judge's and estimator's options, from their docstrings
    assert "the temperature of the weights exp(A / beta)." in training
    judging = text_of(site, "stages/judging")
    assert "key screenshots at most (the image cap; 0: none)." in judging
    assert "the last screenshots shown, the final page last (0: none)." in judging


def test_the_benchmark_page_comes_from_the_results_files(site: Path):
    page = text_of(site, "benchmarks")
    files = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert files, "no results file is kept in bench/results/"
    for f in files:
        assert f.name in page, f"{f.name} is not on the benchmark page"


def test_the_api_page_renders_docstrings(site: Path):
    page = text_of(site, "api")
    assert "write_trajectories" in page and "This is the collector's hot path" in page


def test_a_broken_link_fails_the_build(tmp_path: Path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config.write_text(
        text.replace("scripts/docs_hooks.py", str(ROOT / "scripts" / "docs_hooks.py"))
    )
    res = mkdocs(config, tmp_path / "site")
    assert res.returncode != 0
    assert "no-such-page.md" in res.stdout + res.stderr
