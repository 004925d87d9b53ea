"""The dashboard's fixture warehouse: :func:`tests.curation.fixture.build_fixture_warehouse`
(13 trajectories with judgments, a judge error, PRM scores, interventions, task groups) plus
what the review pages need beyond it, written through the warehouse API:

- ``tx-html`` (run ``run-dash``, task ``task-x``, success, 4 steps on 320x200 screenshots):
  step 0 ``click(100, 60)`` at coordinates; step 1 ``type(e5, "kettle")`` on an element whose
  box (20, 30, 120x24) is in the stored accessibility snapshot; step 2 ``scroll(0, 600)``;
  step 3 the answer. Its instruction, answer, model output and judge rationale hold HTML/JS
  that must show as text (``window.__pwned`` must stay undefined in a browser).
- ``tx-missing``: one step whose screenshot blob is not in the store.
- ``tx-running``: still running, one step written of its budget.
- a judgment of ``vlm`` on tx-html with two criteria and a rationale;
- a dataset (3 member trajectories), an SFT training run with a falling loss, a checkpoint,
  an evaluation of it with a per-site breakdown, and a stored agreement.
"""

from __future__ import annotations

import datetime as dt
import io

from PIL import Image

from tests.curation.fixture import build_fixture_warehouse
from warehouse.blobs import sha256_hex
from warehouse.records import (
    Agreement,
    Checkpoint,
    Dataset,
    DatasetMember,
    Evaluation,
    Judgment,
    Metric,
    ProtocolComparison,
    Run,
    Step,
    Task,
    TrainingRun,
    Trajectory,
)

T1 = dt.datetime(2026, 2, 1, tzinfo=dt.UTC)
PWN = "<script>window.__pwned = 1</script>"
ANSWER = f'{PWN}<img src=x onerror="window.__pwned = 2">the kettle is in the cart'
INSTRUCTION = f"<b>Add</b> the kettle {PWN} to the cart"
MODEL_OUTPUT = f"Thought: scroll to see more {PWN}\nAction: scroll(0, 600)"
MISSING_BLOB = sha256_hex(b"a screenshot that was never stored")
A11Y = '- main\n  - textbox "search" [ref=e5] [box=20,30,120,24]\n  - button "Go" [ref=e6]\n'
LOSSES = [2.0, 1.5, 1.1, 0.8]


def screen(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (320, 200), (240, 240, 240 - seed * 10)).save(buf, "PNG")
    return buf.getvalue()


def _steps(wh) -> list[Step]:
    shots = [wh.blobs.put_image(screen(i)).hash for i in range(4)]
    tree = wh.blobs.put_text(A11Y).hash
    spec = [
        ({"type": "click", "target": {"x": 100, "y": 60}}, "click(100, 60)", "Action: click"),
        (
            {"type": "type", "text": "kettle", "target": {"ref": "e5"}},
            'type(e5, "kettle")',
            "Action: type",
        ),
        ({"type": "scroll", "dx": 0, "dy": 600}, "scroll(0, 600)", MODEL_OUTPUT),
        ({"type": "answer", "text": ANSWER}, "answer(...)", f"Action: answer({ANSWER!r})"),
    ]
    return [
        Step(
            traj_id="tx-html",
            step_idx=i,
            url=f"http://shop.test/p{i}",
            title=f"shop p{i}",
            screenshot_hash=shots[i],
            a11y_hash=tree,
            model_output=out,
            action=action,
            action_text=text,
            created_at=T1 + dt.timedelta(seconds=i),
        )
        for i, (action, text, out) in enumerate(spec)
    ]


def build_dashboard_warehouse(wh) -> None:
    """Write the curation fixture and the additions in this module's docstring into ``wh``."""
    build_fixture_warehouse(wh)
    wh.write(
        [
            Task(
                task_id="task-x",
                suite="bundled",
                instruction=INSTRUCTION,
                start_url="http://shop.test/",
                site="shop",
                split="train",
                created_at=T1,
            )
        ]
    )
    wh.write([Run(run_id="run-dash", kind="collect", config={"coords": "pixels"}, created_at=T1)])
    trajs = [
        Trajectory(
            "tx-html",
            "run-dash",
            "task-x",
            "expert",
            "success",
            task_version=1,
            n_steps=4,
            answer=ANSWER,
            created_at=T1,
        ),
        Trajectory(
            "tx-missing",
            "run-dash",
            "task-x",
            "expert",
            "failure",
            task_version=1,
            n_steps=1,
            created_at=T1 + dt.timedelta(minutes=1),
        ),
        Trajectory(
            "tx-running",
            "run-dash",
            "task-x",
            "expert",
            "running",
            task_version=1,
            n_steps=1,
            created_at=T1 + dt.timedelta(minutes=2),
        ),
    ]
    steps = [
        *_steps(wh),
        Step(
            traj_id="tx-missing",
            step_idx=0,
            screenshot_hash=MISSING_BLOB,
            action={"type": "click", "target": {"x": 5, "y": 5}},
            action_text="click(5, 5)",
        ),
        Step(
            traj_id="tx-running",
            step_idx=0,
            screenshot_hash=wh.blobs.put_image(screen(5)).hash,
            action={"type": "click", "target": {"ref": "e9"}},
            action_text="click(e9)",
        ),
    ]
    wh.write_trajectories(trajs, steps)
    wh.write(
        [
            Judgment(
                judgment_id="j-html",
                traj_id="tx-html",
                judge="vlm",
                judge_version="1",
                verdict="success",
                score=0.9,
                criteria=[
                    {"name": "kettle in cart", "passed": True, "detail": ""},
                    {"name": "answer given", "passed": True, "detail": PWN},
                ],
                rationale=f"The page shows the cart. {PWN}",
                created_at=T1,
            )
        ]
    )
    _training(wh)


def _training(wh) -> None:
    wh.write(
        [
            Dataset(
                dataset_id="ds-1",
                name="filtered-bc",
                snapshot_id=3,
                recipe={"name": "filtered-bc", "filters": [{"verdict": "success"}]},
                counts={"sft": 7, "trajectories": 3, "steps": 7},
                data_card="# filtered-bc\n\n## Gates\n| gate | ok |\n| rows | True |\n",
                created_at=T1,
            )
        ]
    )
    wh.write(
        [DatasetMember("ds-1", t, None, "train") for t in ("t01", "t03", "t04")], DatasetMember
    )
    wh.write(
        [
            TrainingRun(
                "tr-1", "sft", "tiny-vlm", dataset_id="ds-1", status="completed", created_at=T1
            )
        ]
    )
    wh.write([Metric("tr-1", i, "loss", v) for i, v in enumerate(LOSSES)])
    wh.write([Checkpoint("ck-1", "tr-1", 3, "/ckpt/step-3")])
    wh.write(
        [
            Evaluation(
                evaluation_id="ev-1",
                suite="bundled",
                split="test",
                n=20,
                n_success=15,
                success_rate=0.75,
                checkpoint_id="ck-1",
                ci_low=0.53,
                ci_high=0.89,
                breakdown={
                    "site": [
                        {
                            "site": "shop",
                            "n": 12,
                            "n_success": 10,
                            "rate": 10 / 12,
                            "ci_low": 0.55,
                            "ci_high": 0.95,
                        },
                        {
                            "site": "wiki",
                            "n": 8,
                            "n_success": 5,
                            "rate": 0.625,
                            "ci_low": 0.31,
                            "ci_high": 0.86,
                        },
                    ]
                },
            )
        ]
    )
    wh.write(
        [Agreement("ag-1", "vlm", "programmatic", 9, judge_version="1", accuracy=0.78, kappa=0.41)]
    )
    cmp = dict(run_id="run-a", n=6, model="m")
    wh.write(
        [  # a stored side-by-side protocol table (stages.protocols computes them)
            ProtocolComparison("pc-1", protocol="outcome", protocol_hash="h-out", successes=3,
                               rate=0.5, ci_low=0.19, ci_high=0.81, **cmp),
            ProtocolComparison("pc-2", protocol="webjudge", protocol_hash="h-wj", successes=4,
                               rate=4 / 6, ci_low=0.3, ci_high=0.9, **cmp),
            ProtocolComparison("pc-3", protocol="outcome", protocol_hash="h-out", successes=3,
                               other="webjudge", other_successes=4, agree=5, only_this=0,
                               only_other=1, kappa=0.67, mcnemar_p=1.0, **cmp),
            ProtocolComparison("pc-4", protocol="outcome", protocol_hash="h-out", successes=3,
                               other="human", other_successes=4, agree=5, only_this=0,
                               only_other=1, kappa=0.67, mcnemar_p=1.0, **cmp),
        ]
    )  # fmt: skip
