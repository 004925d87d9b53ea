"""Interventions on constructed failures in real Chromium, on each bundled site.

The CLI tests run the flows from ``webloop`` on the session's Prefect server.

Each site's task is run by the expert in model-facing (ref) actions with its plan changed: a
wrong element clicked at step m, step m skipped, or an early answer at step m (the first two
then give up with a wrong answer). The intervene flow must find the first error at step m,
verify the expert teacher's correction by replay (the replay stored and graded a success).
On one site (:data:`OPENAI_SITE`: the teacher protocol is the same on every site), an
OpenAI-protocol teacher's wrong corrections are recorded as not verified."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest

from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Job
from rollouts.env import BrowserEnv, origin_of
from rollouts.policies import ExpertPolicy
from rollouts.writer import BatchWriter
from sites.tasks import generate, resolve_start_url
from stages.collect import bundled_grader
from stages.intervene import InterveneConfig, run_intervene_async
from stages.runs import recorded_run
from tests.cli.cli_runner import webloop
from tests.curation.test_rationales import _warehouse
from tests.rollouts.fake_openai import FakeOpenAI
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import Intervention, Task, Trajectory, from_frame
from warehouse.tasks import put_tasks

# site → (template, {kind: step m}, the wrong element clicked at m)
SITES = {
    "shop": ("shop_add_to_cart", {"wrong": 3, "skip": 5, "early": 3}, "#cart-link"),
    "travel": ("travel_cheapest_price", {"wrong": 6, "skip": 5, "early": 5}, "a.logo"),
    "wiki": ("wiki_fact", {"wrong": 1, "skip": 0, "early": 1}, "a[href^='/wiki/']"),
    "mail": ("mail_compose", {"wrong": 1, "skip": 3, "early": 2}, "#settings-link"),
}
# the kind of first error expected (travel's logo link reloads the empty form: progress undone)
KINDS = {"wrong": "left_path", "skip": "left_path", "early": "early_answer"}
WENT_BACK = {("travel", "wrong")}
OPENAI_SITE = "mail"  # the OpenAI-protocol teacher's wrong corrections, checked on one site
RUN_SETTINGS = {"prompt_mode": "both", "coords": "pixels", "set_of_marks": False, "k_images": 3}


def constructed(reference: list[str], kind: str, m: int, wrong_css: str) -> list[str]:
    """The changed plan: the mistake at step m (then a wrong answer)."""
    if kind == "wrong":
        return [*reference[:m], f'click(css="{wrong_css}")', 'answer("done")']
    if kind == "skip":
        return [*reference[:m], reference[m + 1], 'answer("done")']
    return [*reference[:m], 'answer("I could not find it")']


def task_for(template: str) -> Task:
    return next(t for t in generate(300, seed=0) if t.meta["template"] == template)


async def collect_constructed(wh, sites, browser, site: str) -> dict[str, tuple[str, int]]:
    """Run the changed plans as the expert would (ref actions); traj_id → (kind, m)."""
    template, steps, wrong_css = SITES[site]
    task = task_for(template)
    run_id = f"constructed-{site}"
    out: dict[str, tuple[str, int]] = {}
    url = resolve_start_url(task.start_url, sites.urls)
    slot = SharedSlot(browser)
    jobs = []
    for kind, m in steps.items():
        plan = constructed(list(task.reference), kind, m, wrong_css)
        job = Job(dataclasses.replace(task, reference=plan), 0, f"traj-{site}-{kind}", "g", url)
        job.allowed_origins = [origin_of(url)]
        jobs.append(job)
        out[job.traj_id] = (kind, m)
    async with httpx.AsyncClient() as client:
        writer = BatchWriter(wh).start()
        engine = Engine(  # the three plans side by side (each episode has its own context)
            run_id,
            ExpertPolicy(action_space="ref"),
            bundled_grader(sites, client),
            writer.put,
            config=EngineConfig(concurrency=len(jobs), max_steps=20),
            env_factory=lambda: BrowserEnv(slot),
        )
        await engine.run(jobs)
        await writer.close()
    return out


def open_wh(home: Path) -> Warehouse:
    return Warehouse.open(WarehouseConfig.from_env(home=home))


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("site", sorted(SITES))
def test_first_error_found_corrected_and_verified_by_replay(tmp_path, sites, chromium, site):
    template = SITES[site][0]
    with open_wh(tmp_path / "home") as wh:
        put_tasks(wh, [task_for(template)])
        with recorded_run(wh, f"constructed-{site}", "collect", RUN_SETTINGS):
            made = chromium.run(collect_constructed(wh, sites, chromium.browser, site))
        trajs = {t.traj_id: t for t in from_frame(Trajectory, wh.sql("SELECT * FROM trajectories"))}
        assert {t: trajs[t].status for t in made} == dict.fromkeys(made, "failure")
        # in ref space the expert takes one step per planned action: step m is the mistake
        for traj_id, (_, m) in made.items():
            texts = wh.sql(
                "SELECT action_text FROM steps WHERE traj_id = ? ORDER BY step_idx", [traj_id]
            )["action_text"].to_list()
            assert not any("css=" in t for t in texts[:m]), texts

        cfg = InterveneConfig(teacher="expert", run=f"constructed-{site}", concurrency=3)
        shared = dict(server=sites, browser=chromium.browser)
        out = chromium.run(run_intervene_async(wh, cfg, **shared))
        assert (out.selected, out.verified, out.errors) == (3, 3, 0), out.error_examples
        rows = {
            i.traj_id: i for i in from_frame(Intervention, wh.sql("SELECT * FROM interventions"))
        }
        for traj_id, (kind, m) in made.items():
            rec = rows[traj_id]
            assert rec.first_error_step == m, (kind, rec.detail)
            expected_kind = "went_back" if (site, kind) in WENT_BACK else KINDS[kind]
            assert rec.detail["error_kind"] == expected_kind
            assert rec.detail["cursor"] == m
            assert rec.verified is True and rec.verified_outcome == "success", rec.detail
            assert rec.proposer == "expert" and rec.reference == "task"
            assert "css=" not in rec.proposed_action["text"]  # model-facing, grounded
            replay = wh.sql(
                "SELECT status, policy, run_id, n_steps FROM trajectories WHERE traj_id = ?",
                [rec.replay_traj_id],
            ).rows()
            assert replay == [("success", "intervention:expert", rec.run_id, replay[0][3])]
            # the replay: the m prefix steps verbatim, then the correction
            replayed = wh.sql(
                "SELECT action_text FROM steps WHERE traj_id = ? ORDER BY step_idx",
                [rec.replay_traj_id],
            )["action_text"].to_list()
            original = wh.sql(
                "SELECT action_text FROM steps WHERE traj_id = ? ORDER BY step_idx", [traj_id]
            )["action_text"].to_list()
            assert replayed[:m] == original[:m]
            assert replayed[m] == rec.proposed_action["text"]
        # three corrections of one task: their replays are three samples, each naming the
        # trajectory it corrects (at sample 0 each, they looked like one sample stored thrice)
        replays = wh.sql(
            "SELECT task_id, sample_idx, json_extract_string(meta, '$.corrects') FROM "
            "trajectories WHERE policy = 'intervention:expert'"
        ).rows()
        assert len({(t, k) for t, k, _ in replays}) == len(replays) == 3
        assert {c for *_, c in replays} == set(made)
        again = chromium.run(run_intervene_async(wh, cfg, **shared))
        assert again.selected == 0  # resumable: nothing left for this teacher
        if site == OPENAI_SITE:
            openai_teacher_corrections_are_not_verified(wh, cfg, made, sites, chromium)


def openai_teacher_corrections_are_not_verified(wh, cfg, made, sites, chromium) -> None:
    """An OpenAI-protocol teacher with wrong corrections: an answer that gives up, a no-op
    scroll (the expert's continuation would do all the work) and garbage (a teacher error)."""
    shared = dict(server=sites, browser=chromium.browser)
    replies = [
        'Error: step 1: lost\nThought: I cannot do it.\nAction: answer("no idea")',
        "Error: step 1: lost\nThought: look further down the page.\nAction: scroll(down)",
        "I am not sure what to do here.",
    ]
    with FakeOpenAI([("reply", r) for r in replies]) as fake:
        ocfg = dataclasses.replace(cfg, teacher="openai", base_url=fake.url, model="bad")
        bad = chromium.run(run_intervene_async(wh, ocfg, **shared))
    assert (bad.verified, bad.not_verified, bad.errors) == (0, 2, 1), bad
    assert len(fake.requests) == 3
    rows = from_frame(
        Intervention, wh.sql("SELECT * FROM interventions WHERE proposer = 'openai:bad'")
    )
    by_action = {(r.proposed_action or {}).get("text"): r for r in rows}
    gave_up, noop, garbage = (
        by_action['answer("no idea")'],
        by_action["scroll(down)"],
        by_action[None],
    )
    assert (gave_up.verified, gave_up.verified_outcome) == (False, "failure")
    assert (noop.verified, noop.verified_outcome) == (False, "success")
    assert noop.detail["why"] == "the correction made no progress on the reference path itself"
    assert garbage.verified is None and garbage.verified_outcome == "teacher_error"
    assert gave_up.rationale == "I cannot do it." and gave_up.detail["teacher_named_step"] == 0
    for r in rows:  # the error the teacher was asked about is the one found by replay
        assert r.first_error_step == made[r.traj_id][1]
    # a re-run retries only the teacher error
    with FakeOpenAI([("reply", replies[0])]) as fake:
        ocfg = dataclasses.replace(ocfg, base_url=fake.url)
        retry = chromium.run(run_intervene_async(wh, ocfg, **shared))
    assert retry.selected == 1 and len(fake.requests) == 1, retry


def test_a_replay_waits_for_elements_as_long_as_its_source_run_did(tmp_path):
    from judging.base import TrajectoryView
    from stages.intervene import plan_items
    from warehouse.records import Run

    task = task_for("mail_compose")
    with open_wh(tmp_path / "home") as wh:
        put_tasks(wh, [task])
        wh.write([Run("fast", "collect", {"action_timeout_s": 1.5}), Run("old", "collect", {})])
        views = [
            TrajectoryView(Trajectory(t, run, task.task_id, "expert", "failure"), task, [])
            for t, run in (("t-fast", "fast"), ("t-old", "old"))
        ]
        items, skipped = plan_items(wh, views, action_timeout_s=4.0)
    assert skipped == []
    # the recorded timeout where the run has one, else the intervene config's
    assert [(i.view.traj_id, i.env.action_timeout_s) for i in items] == [
        ("t-fast", 1.5),
        ("t-old", 4.0),
    ]


def test_cli_refuses_bad_options_in_one_line_before_any_work(tmp_path, prefect_harness):
    home = tmp_path / "home"
    bad = webloop(home, "intervene", "--teacher", "openai", ok=False)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --teacher openai needs --base-url and --model"
    with open_wh(home) as wh:
        before = wh.sql("SELECT count(*) FROM runs").item()
    missing = webloop(home, "intervene", "--run", "nope", ok=False)
    assert missing.returncode == 2 and "--run: no run 'nope' in the warehouse" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    with open_wh(home) as wh:
        assert wh.sql("SELECT count(*) FROM runs").item() == before  # no run was started
    zero = webloop(home, "rationales", "--max-steps", "0", ok=False)
    assert zero.returncode == 2 and "Invalid value for '--max-steps'" in zero.stderr


def test_cli_rationales_runs_the_flow_and_resumes(tmp_path, prefect_harness):
    home = tmp_path / "home"
    with open_wh(home) as wh:
        _warehouse(wh)
    out = webloop(home, "rationales", "--teacher", "expert")
    assert "rationales (expert): 3 steps selected, 3 written, 0 per-step errors" in out.stdout
    with open_wh(home) as wh:
        rows = wh.sql("SELECT teacher, count(*) FROM rationales GROUP BY 1").rows()
        kinds = wh.sql("SELECT kind, status FROM runs").rows()
    assert rows == [("expert", 3)] and kinds == [("rationales", "completed")]
    again = webloop(home, "rationales", "--teacher", "expert")
    assert "0 steps selected, 0 written" in again.stdout
