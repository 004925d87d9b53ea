"""The tutorials cannot rot: every ``bash`` block of every page under ``docs/tutorials/`` runs here
(real CLI subprocesses, real Chromium, the session's Prefect server), in order, in a fresh
working folder and data directory; a block the suite cannot run (a GPU, a model download) says
why. The warehouse page's SQL examples run against the first tutorial's warehouse.

What stands in for what cannot exist here: a local server speaking the OpenAI protocol for the
Online-Mind2Web tutorial's judge model (a frontier judge), a small run folder in the current
Online-Mind2Web schema for the published runs, the suite's own PostgreSQL server for the Dask
tutorial's database."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, bash_blocks, script

TUTORIALS = ROOT / "docs" / "tutorials"
SKIP_LINKS = {".git", ".venv", ".venv-vllm", ".webloop", "site"}
pytestmark = pytest.mark.slow


def workdir(tmp: Path) -> Path:
    """A folder that looks like the repository to a tutorial's relative paths (each top-level
    entry linked) but keeps what the tutorial writes out of it."""
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in SKIP_LINKS:
            (work / entry.name).symlink_to(entry)
    return work


def run_page(page: Path, work: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run ``page``'s blocks (``tests/docs/blocks.py``) in ``work``; their output. A failure
    names the page and line of the block that failed. Everything the page started in the
    background is stopped (its process group)."""
    path = work / f"{page.stem}.sh"
    path.write_text(script(page))
    full = {
        **env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "WEBLOOP_HOME": str(work / ".webloop"),
        "COLUMNS": "120",
    }
    proc = subprocess.Popen(
        ["bash", str(path)],
        cwd=work,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"{page.name} ran past {timeout} s; last block: {_last_block(out)}\n{out[-3000:]}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    if proc.returncode != 0:
        pytest.fail(f"{_last_block(out)} failed (exit {proc.returncode}):\n{out[-4000:]}")
    return out


def _last_block(out: str) -> str:
    marks = re.findall(r"^>>> (\S+)$", out, re.M)
    return marks[-1] if marks else "the first block"


def test_every_tutorial_block_runs_or_says_why_not():
    pages = sorted(TUTORIALS.glob("*.md"))
    assert {p.name for p in pages} >= {
        "first-flywheel.md",
        "bring-your-own-vlm.md",
        "review-and-label.md",
        "dask-postgres.md",
        "online-mind2web.md",
    }
    for page in pages:
        blocks = bash_blocks(page)
        assert blocks, f"{page.name} has no command block"
        assert any(b.skipped is None for b in blocks), f"{page.name}: no block runs"
        for b in blocks:
            assert b.skipped is None or len(b.skipped) > 10, f"{page.name}:{b.line}: say why"
    covered = {p.name for p in pages}
    assert covered <= set(PAGE_TESTS), f"a tutorial no test runs: {covered - set(PAGE_TESTS)}"


def test_blocks_marked_not_run_are_left_out(tmp_path: Path):
    page = tmp_path / "p.md"
    page.write_text(
        "```bash\necho one\n```\n\n<!-- not run: needs a GPU here -->\n```bash\nexit 3\n```\n"
        "```text\nexit 4\n```\n"
    )
    blocks = bash_blocks(page)
    assert [(b.line, b.skipped) for b in blocks] == [(1, None), (6, "needs a GPU here")]
    out = subprocess.run(["bash", "-c", script(page)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "one\n"


def test_first_flywheel_review_and_the_warehouse_examples(tmp_path, prefect_subprocess_env):
    work = workdir(tmp_path)
    out = run_page(TUTORIALS / "first-flywheel.md", work, prefect_subprocess_env)
    assert "run tutorial-expert: ran 8 trajectories" in out
    assert re.search(r"training run train-sft-\w+: 3 steps; checkpoint ckpt-\w+", out)
    assert "forced: the protocols differ (prompt_mode)" in out and "McNemar exact p" in out
    out = run_page(TUTORIALS / "review-and-label.md", work, prefect_subprocess_env)
    assert "http://127.0.0.1:8599/?token=tutorial-token" in out
    assert re.search(r"^1,\(all\),\d+,1\.0,", out, re.M)  # the checker agrees with its own labels
    for n, sql in enumerate(sql_blocks(ROOT / "docs" / "warehouse.md")):
        res = subprocess.run(
            [str(Path(sys.executable).parent / "webloop"), "sql", sql, "--format", "csv"],
            cwd=work,
            env={**prefect_subprocess_env, "WEBLOOP_HOME": str(work / ".webloop")},
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, f"warehouse.md SQL example {n + 1}: {res.stderr}"
        assert len(res.stdout.strip().splitlines()) >= 2, f"example {n + 1} returned no rows"


def sql_blocks(page: Path) -> list[str]:
    text = page.read_text()
    return [m.group(1).strip() for m in re.finditer(r"^```sql\n(.*?)^```", text, re.S | re.M)]


@pytest.mark.long(
    reason=(
        "the tutorial's CLI run of a VLM (import, collect, SFT, evaluate); twins: "
        "tests/docs/test_tutorials.py::test_first_flywheel_review_and_the_warehouse_examples "
        "(a tutorial run end to end), tests/cli/test_train_cli.py::"
        "test_the_tiny_vlm_trains_on_the_dataset_screenshots"
    )
)
def test_bring_your_own_vlm_at_cpu_scale(tmp_path, prefect_subprocess_env):
    out = run_page(TUTORIALS / "bring-your-own-vlm.md", workdir(tmp_path), prefect_subprocess_env)
    assert "2 tasks read: 2 new" in out
    assert "run my-vlm-rollouts: ran 2 trajectories" in out
    assert re.search(r"training run train-sft-\w+: 2 steps", out)
    assert "evaluation eval-" in out and "(hf on bundled/test)" in out


def test_online_mind2web_import_and_judge(tmp_path, prefect_subprocess_env):
    from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
    from tests.warehouse.test_om2w_v2 import png, step, v2_result, write_folder

    run = tmp_path / "results" / "my-agent"
    outcome = {"task-a": "success", "task-b": "failure", "task-c": "success"}
    for tid, verdict in outcome.items():
        shots = {
            f"{i}.png": png((0, 200, 0) if verdict == "success" else (200, 0, 0)) for i in range(2)
        }
        steps = [
            step(0, "CLICK <a> Products", "0.png"),
            step(1, f"TASK_COMPLETE -> ANSWER: {tid}", "1.png"),
        ]
        write_folder(run, tid, v2_result(tid, steps, tid), shots)
    labels = tmp_path / "human_label.json"
    labels.write_text(json.dumps({"task-a": 1, "task-b": 0, "task-c": 0}))

    def judge(body):  # a model that reads the screenshots: green means done
        if "List the key points" in last_user_text(body):
            return "1. find the product"
        images = [c for c in body["messages"][-1]["content"] if c.get("type") == "image_url"]
        green = _green(images[-1])
        return json.dumps({"criteria": [], "verdict": "success" if green else "failure"})

    env = {**prefect_subprocess_env, "OM2W_DIR": str(run), "OM2W_LABELS": str(labels)}
    with FakeOpenAI([], default=("fn", judge)) as fake:
        env |= {"JUDGE_URL": fake.url, "JUDGE_MODEL": "judge"}
        out = run_page(TUTORIALS / "online-mind2web.md", workdir(tmp_path), env)
    assert "task-a,2,success" in out and "task-b,2,failure" in out
    # judged a, c success and b failure; people said c failed: 2 of 3 agree
    assert re.search(r"^[^,]+,\(all\),3,0\.66", out, re.M), out[-2000:]
    # three protocols, each of which shows the model the final page: the same verdicts
    assert "3 judged under every protocol" in out
    assert out.count("2/3 (66.7%)") == 3
    pairs = [line for line in out.splitlines() if "3 (100.0%)" in line]  # the 3 pairs agree
    assert len(pairs) == 3 and all("1.00" in line for line in pairs), out[-3000:]


def _green(image: dict) -> bool:
    import base64
    import io

    from PIL import Image

    raw = base64.b64decode(image["image_url"]["url"].split(",", 1)[1])
    return Image.open(io.BytesIO(raw)).convert("RGB").getpixel((0, 0)) == (0, 200, 0)


@pytest.mark.long(
    reason=(
        "the tutorial's Dask cluster on a PostgreSQL catalog; twins: "
        "tests/docs/test_tutorials.py::test_first_flywheel_review_and_the_warehouse_examples "
        "(a tutorial run end to end), tests/flows/test_dask.py::"
        "test_shards_split_contiguously_and_cover_everything"
    )
)
def test_dask_and_postgres(tmp_path, prefect_subprocess_env, pg_url):
    env = {**prefect_subprocess_env, "WEBLOOP_WAREHOUSE": pg_url}
    out = run_page(TUTORIALS / "dask-postgres.md", workdir(tmp_path), env)
    assert "run dask-run: ran 4 trajectories" in out
    assert "postgres" in out.lower() and "ATTACH" in out


PAGE_TESTS = {
    "first-flywheel.md": test_first_flywheel_review_and_the_warehouse_examples,
    "review-and-label.md": test_first_flywheel_review_and_the_warehouse_examples,
    "bring-your-own-vlm.md": test_bring_your_own_vlm_at_cpu_scale,
    "online-mind2web.md": test_online_mind2web_import_and_judge,
    "dask-postgres.md": test_dask_and_postgres,
}
