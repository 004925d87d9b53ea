"""A small, hand-countable warehouse for curation tests: :func:`build_fixture_warehouse`.

Contents (screens are real 64x40 PNGs in the blob store, one per screen name; a step's url is
``http://<site>.test/<screen>``; every step has a thought and a model_output):

Tasks (suite ``bundled``, version 1):

=======  =====  ======  ====  =========================================================
task     site   split   diff  instruction
=======  =====  ======  ====  =========================================================
task-1   shop   train   2     Add the blue kettle to the cart
task-2   shop   train   3     Put the blue kettle into your cart   (rewording of task-1)
task-3   travel train   2     Book a flight from Paris to Rome on May 3
task-4   wiki   train   1     Find the wiki article about volcanoes
task-5   mail   test    2     Send an email to Alice about the meeting
=======  =====  ======  ====  =========================================================

Runs: ``run-expert`` (name ``expert-collect``), ``run-model`` (name ``model-collect``).

Trajectories (policy ``expert`` in run-expert, ``openai:tiny`` in run-model):

====  ======  =========== ======  =====  ==============================================
traj  task    status      policy  steps  what it is for
====  ======  =========== ======  =====  ==============================================
t01   task-1  success     expert  3      clean: (s1 click(e1)) (s2 type) (s3 answer)
t02   task-1  success     expert  3      the same screens and actions as t01 (dedup)
t03   task-3  success     expert  4      clean; PRM-scored (see below)
t04   task-4  success     expert  2      clean, short
t05   task-1  failure     model   4      s1 x4: action error, unparseable (no action),
                                         scroll with no visible effect (no-op), click
t06   task-3  success     model   6      loop: (s4 click(e3)) at 0,2,4; (s5 back()) at 1,3
t07   task-2  success     model   2      the near-duplicate task
t08   task-4  infra_error model   1      always excluded
t09   task-4  timeout     model   0      always excluded
t10   task-4  running     model   1      always excluded
t11   task-5  success     model   2      test split: outside the default sources
t12   task-3  failure     model   12     long (12 distinct screens)
t13   task-4  failure     model   2
====  ======  =========== ======  =====  ==============================================

Judgments (latest per judge counts):

- ``programmatic`` v1: success on t01 t02 t03 t04 t06 t07 t11; failure on t12 t13; on t05 an
  OLDER success and a NEWER failure (latest: failure).
- ``vlm`` v1: success on t01 t03 t05; failure on t04; an ERROR (no verdict) on t06; none on
  t02 t07 t12 t13.

PRM (scorer ``exact``), only on t03 (taken actions: click(e3), click(e5), type(e6, "Rome"),
answer("ok")):

- step 0: cand 0 = taken, 1.0 (v2); cand 1 other, 0.0 (v2)
- step 1: cand 0 = taken, 0.2 (v2); cand 1 other, 0.9 (v2)
- step 2: cand 0 other, 1.0 (v2) — the taken action has no score
- step 3: cand 0 = taken: 0.1 (v1, older) and 0.8 (v2, newer); cand 1 = taken too, error row

Interventions: iv-05 on t05 (verified), iv-12 on t12 (NOT verified), iv-13 on t13 (verified),
iv-11 on t11 (verified, but t11 is outside the default sources).

Rationales: teacher ``teacher-a`` on t01 steps 0, 1, 2 and t03 step 1; ``teacher-b`` on t01
step 0.

Counts after ``exclude_infra`` with the default sources (split train): 9 trajectories
(t01-t07, t12, t13), 38 steps; before it 12 trajectories, 40 steps.
"""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from curation.recipe import Recipe, parse_recipe
from curation.select import Selection, select
from warehouse.blobs import BlobStore
from warehouse.ids import make_id
from warehouse.records import (
    Candidate,
    Intervention,
    Judgment,
    Rationale,
    Run,
    Step,
    StepScore,
    Task,
    Trajectory,
)
from warehouse.versions import current_snapshot

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

TASKS = {
    "task-1": ("shop", "train", 2, "Add the blue kettle to the cart"),
    "task-2": ("shop", "train", 3, "Put the blue kettle into your cart"),
    "task-3": ("travel", "train", 2, "Book a flight from Paris to Rome on May 3"),
    "task-4": ("wiki", "train", 1, "Find the wiki article about volcanoes"),
    "task-5": ("mail", "test", 2, "Send an email to Alice about the meeting"),
}

# traj: (task, status, run, [(screen, action_text, action_error), ...])
CLEAN_1 = [
    ("s1", "click(e1)", None),
    ("s2", 'type(e2, "kettle")', None),
    ("s3", 'answer("done")', None),
]
TRAJECTORIES: dict[str, tuple[str, str, str, list[tuple[str, str | None, str | None]]]] = {
    "t01": ("task-1", "success", "run-expert", CLEAN_1),
    "t02": ("task-1", "success", "run-expert", CLEAN_1),
    "t03": (
        "task-3",
        "success",
        "run-expert",
        [
            ("s4", "click(e3)", None),
            ("s5", "click(e5)", None),
            ("s6", 'type(e6, "Rome")', None),
            ("s7", 'answer("ok")', None),
        ],
    ),
    "t04": (
        "task-4",
        "success",
        "run-expert",
        [("s8", "click(e4)", None), ("s9", 'answer("Etna")', None)],
    ),
    "t05": (
        "task-1",
        "failure",
        "run-model",
        [
            ("s1", "click(e9)", "no element e9"),
            ("s1", None, "parse error: no action found"),
            ("s1", "scroll(0, 100)", None),
            ("s1", "click(e1)", None),
        ],
    ),
    "t06": (
        "task-3",
        "success",
        "run-model",
        [
            ("s4", "click(e3)", None),
            ("s5", "back()", None),
            ("s4", "click(e3)", None),
            ("s5", "back()", None),
            ("s4", "click(e3)", None),
            ("s6", 'answer("x")', None),
        ],
    ),
    "t07": (
        "task-2",
        "success",
        "run-model",
        [("s1", "click(e1)", None), ("s3", 'answer("done")', None)],
    ),
    "t08": ("task-4", "infra_error", "run-model", [("s8", "click(e4)", None)]),
    "t09": ("task-4", "timeout", "run-model", []),
    "t10": ("task-4", "running", "run-model", [("s8", "click(e4)", None)]),
    "t11": (
        "task-5",
        "success",
        "run-model",
        [("s10", "click(e1)", None), ("s11", 'answer("sent")', None)],
    ),
    "t12": (
        "task-3",
        "failure",
        "run-model",
        [(f"l{i}", "scroll(0, 100)", None) for i in range(12)],
    ),
    "t13": (
        "task-4",
        "failure",
        "run-model",
        [("s8", "click(e7)", None), ("s9", 'answer("wrong")', None)],
    ),
}

SITE_OF = {t: v[0] for t, v in TASKS.items()}
RUN_NAMES = {"run-expert": "expert-collect", "run-model": "model-collect"}
POLICY_OF_RUN = {"run-expert": "expert", "run-model": "openai:tiny"}


@dataclass
class Fixture:
    """What :func:`build_fixture_warehouse` wrote: the snapshot after it and screen hashes."""

    snapshot_id: int
    screens: dict[str, str] = field(default_factory=dict)  # screen name → blob hash


def png(seed: int) -> bytes:
    """A small real PNG, different for each seed."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), ((seed * 37) % 256, (seed * 91) % 256, 120)).save(buf, "PNG")
    return buf.getvalue()


def _screens(blobs: BlobStore) -> dict[str, str]:
    names = sorted({s for *_, steps in TRAJECTORIES.values() for s, _, _ in steps})
    return {name: blobs.put(png(i + 1)).hash for i, name in enumerate(names)}


def _steps(traj_id: str, site: str, steps, screens: dict[str, str]) -> list[Step]:
    return [
        Step(
            traj_id=traj_id,
            step_idx=i,
            url=f"http://{site}.test/{screen}",
            title=f"{site} {screen}",
            screenshot_hash=screens[screen],
            model_output=f"Thought: step {i} of {traj_id}\nAction: {action or '???'}",
            thought=f"step {i} of {traj_id}",
            action_text=action,
            action_error=error,
            created_at=T0 + dt.timedelta(minutes=i),
        )
        for i, (screen, action, error) in enumerate(steps)
    ]


def _judgment(traj: str, judge: str, verdict: str | None, minute: int, error: str | None = None):
    return Judgment(
        judgment_id=make_id("judgment", traj, judge, minute),
        traj_id=traj,
        judge=judge,
        judge_version="1",
        verdict=verdict,
        score=None if verdict is None else float(verdict == "success"),
        error=error,
        created_at=T0 + dt.timedelta(hours=1, minutes=minute),
    )


def _judgments() -> list[Judgment]:
    out = [
        _judgment(t, "programmatic", "success", 0)
        for t in ("t01", "t02", "t03", "t04", "t06", "t07", "t11")
    ]
    out += [_judgment(t, "programmatic", "failure", 0) for t in ("t12", "t13")]
    out += [
        _judgment("t05", "programmatic", "success", 0),  # older
        _judgment("t05", "programmatic", "failure", 5),  # newer: counts
    ]
    out += [_judgment(t, "vlm", "success", 0) for t in ("t01", "t03", "t05")]
    out += [
        _judgment("t04", "vlm", "failure", 0),
        _judgment("t06", "vlm", None, 0, error="model unavailable"),
    ]
    return out


def _prm() -> tuple[list[Candidate], list[StepScore]]:
    taken = [a for _, a, _ in TRAJECTORIES["t03"][3]]
    cands = {  # (step, cand) → action text
        (0, 0): taken[0],
        (0, 1): "click(e99)",
        (1, 0): taken[1],
        (1, 1): "click(e98)",
        (2, 0): "click(e97)",
        (3, 0): taken[3],
        (3, 1): taken[3],
    }
    # (step, cand, version, score, error, minute)
    scores = [
        (0, 0, "2", 1.0, None, 10),
        (0, 1, "2", 0.0, None, 10),
        (1, 0, "2", 0.2, None, 10),
        (1, 1, "2", 0.9, None, 10),
        (2, 0, "2", 1.0, None, 10),
        (3, 0, "1", 0.1, None, 0),
        (3, 0, "2", 0.8, None, 10),
        (3, 1, "2", None, "replay failed: browser closed", 10),
    ]
    c_rows = [
        Candidate(
            traj_id="t03", step_idx=s, cand_idx=c, policy="expert", action_text=a, created_at=T0
        )
        for (s, c), a in cands.items()
    ]
    s_rows = [
        StepScore(
            traj_id="t03",
            step_idx=s,
            cand_idx=c,
            scorer="exact",
            scorer_version=v,
            score=score,
            error=err,
            created_at=T0 + dt.timedelta(hours=2, minutes=m),
        )
        for s, c, v, score, err, m in scores
    ]
    return c_rows, s_rows


def _interventions() -> list[Intervention]:
    spec = [("t05", True, 3), ("t12", False, 0), ("t13", True, 0), ("t11", True, 1)]
    return [
        Intervention(
            intervention_id=f"iv-{t[1:]}",
            traj_id=t,
            first_error_step=step,
            proposed_action={"kind": "click", "ref": "e1"},
            rationale=f"the fix for {t}",
            proposer="teacher-a",
            verified=ok,
            verified_outcome="success" if ok else "failure",
            reference="task",
            created_at=T0,
        )
        for t, ok, step in spec
    ]


def _rationales() -> list[Rationale]:
    spec = [("t01", 0, "teacher-a"), ("t01", 1, "teacher-a"), ("t01", 2, "teacher-a")]
    spec += [("t03", 1, "teacher-a"), ("t01", 0, "teacher-b")]
    return [
        Rationale(traj_id=t, step_idx=i, teacher=who, thought=f"{who} on {t}#{i}", created_at=T0)
        for t, i, who in spec
    ]


def build_fixture_warehouse(wh, blobs: BlobStore | None = None) -> Fixture:
    """Write the fixture described in this module's docstring into ``wh`` (screens into
    ``blobs``, default ``wh.blobs``); return the snapshot id after the last write."""
    screens = _screens(blobs or wh.blobs)
    wh.write(
        [
            Task(
                task_id=tid,
                suite="bundled",
                instruction=text,
                start_url=f"http://{site}.test/",
                site=site,
                split=split,
                difficulty=diff,
                rubric=[f"{text} was done"],
                reference=["click(e1)"],
                created_at=T0,
            )
            for tid, (site, split, diff, text) in TASKS.items()
        ]
    )
    wh.write(
        [
            Run(run_id=r, kind="collect", name=n, status="completed", started_at=T0, created_at=T0)
            for r, n in RUN_NAMES.items()
        ]
    )
    trajs, steps = [], []
    for k, (traj, (task, status, run, spec)) in enumerate(sorted(TRAJECTORIES.items())):
        model = run == "run-model"
        trajs.append(
            Trajectory(
                traj_id=traj,
                run_id=run,
                task_id=task,
                policy=POLICY_OF_RUN[run],
                status=status,
                task_version=1,
                group_id=f"{run}/{task}" if model else None,
                sample_idx=k,
                n_steps=len(spec),
                answer=None,
                created_at=T0 + dt.timedelta(minutes=k),
            )
        )
        steps += _steps(traj, SITE_OF[task], spec, screens)
    wh.write_trajectories(trajs, steps)
    cands, scores = _prm()
    wh.write_many(
        [
            (_judgments(), Judgment),
            (cands, Candidate),
            (scores, StepScore),
            (_interventions(), Intervention),
            (_rationales(), Rationale),
        ]
    )
    return Fixture(snapshot_id=current_snapshot(wh), screens=screens)


# -- helpers for the tests ---------------------------------------------------------------


def recipe_of(body: str, source: str = "recipe.yaml") -> Recipe:
    """A recipe from YAML text (``name`` added when missing)."""
    text = body if body.lstrip().startswith("name:") else "name: test\n" + body
    return parse_recipe(text, source)


def run(shared: tuple[Any, Fixture], body: str) -> Selection:
    """Select with the recipe ``body`` at the fixture's snapshot."""
    wh, fx = shared
    return select(wh, recipe_of(body), snapshot_id=fx.snapshot_id)


def kept_steps(sel: Selection) -> dict[str, list[int]]:
    """traj_id → the kept step indices."""
    out: dict[str, list[int]] = {}
    for tid, idx in sel.steps.iter_rows():
        out.setdefault(tid, []).append(idx)
    return out


def report_of(sel: Selection) -> list[tuple[str, int, int]]:
    """(name, trajectories removed, steps removed) per filter applied."""
    return [(r.name, r.trajectories_removed, r.steps_removed) for r in sel.report]
