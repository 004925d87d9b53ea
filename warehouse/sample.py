"""A small generated sample of tasks and trajectories with screenshots, for the demo and tests.

It is synthetic data, labelled as such (suite ``demo-sample``, policy ``sample-generator``):
the real flywheel collects trajectories from live browsers (``webloop collect``). Everything is
derived from the seed, so the same seed gives byte-identical screenshots and the same ids.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from warehouse.blobs import sha256_hex
from warehouse.ids import make_id, stable_hash, traj_id_for
from warehouse.records import Blob, Run, Step, Task, Trajectory
from warehouse.store import Warehouse, WriteResult

SUITE = "demo-sample"
POLICY = "sample-generator"
_SITES = {
    "shop": ("Add the cheapest {x} to the cart", ["mug", "lamp", "backpack", "kettle"]),
    "travel": ("Find a one-way flight to {x} next Friday", ["Lisbon", "Oslo", "Kyoto", "Quito"]),
    "wiki": ("What is the population of {x}?", ["Tartu", "Gdansk", "Porto", "Leuven"]),
    "mail": ("Reply to the latest email from {x}", ["Ada", "Grace", "Linus", "Barbara"]),
}
_ACTIONS = ["click(412, 96)", "type('{x}')", "press('Enter')", "scroll(down)", "click(220, 318)"]


@dataclass
class Sample:
    """The generated rows, plus the screenshot bytes keyed by their sha256."""

    run: Run
    tasks: list[Task] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    screenshots: dict[str, bytes] = field(default_factory=dict)


def screenshot(url: str, title: str, lines: list[str], seed: int) -> bytes:
    """A deterministic 640x400 page-like PNG: address bar, title, a few text rows."""
    rng = random.Random(seed)
    img = Image.new("RGB", (640, 400), (250, 250, 252))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, 640, 36], fill=(225, 228, 235))
    d.rectangle([10, 8, 630, 28], fill=(255, 255, 255), outline=(190, 190, 200))
    d.text((16, 12), url, fill=(40, 40, 40))
    accent = (rng.randrange(40, 200), rng.randrange(40, 200), rng.randrange(40, 200))
    d.rectangle([0, 36, 640, 76], fill=accent)
    d.text((16, 50), title, fill=(255, 255, 255))
    for i, line in enumerate(lines):
        y = 96 + 34 * i
        d.rectangle([16, y, 624, y + 26], outline=(210, 210, 220))
        d.text((24, y + 7), line, fill=(30, 30, 30))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def generate(seed: int = 0, n_tasks: int = 12, samples: int = 2) -> Sample:
    """Generate ``n_tasks`` tasks over four sites with ``samples`` trajectories each."""
    rng = random.Random(seed)
    config = {"seed": seed, "n_tasks": n_tasks, "samples": samples}
    run = Run(run_id=make_id("sample", config), kind="sample", name="demo sample", config=config)
    out = Sample(run=run)
    sites = sorted(_SITES)
    for i in range(n_tasks):
        site = sites[i % len(sites)]
        template, fillers = _SITES[site]
        x = fillers[rng.randrange(len(fillers))]
        task = Task(
            task_id=f"{SUITE}/{site}-{i:04d}",
            suite=SUITE,
            site=site,
            instruction=template.format(x=x),
            start_url=f"http://{site}.localhost/",
            split="test" if i % 5 == 4 else "train",
            difficulty=rng.randint(2, 8),
            rubric=[f"The agent reached the {site} page about {x}", "The final state matches"],
        )
        out.tasks.append(task)
        group = make_id("group", run.run_id, task.task_id)
        for k in range(samples):
            _trajectory(out, task, k, group, x, rng)
    return out


def _trajectory(out: Sample, task: Task, k: int, group: str, x: str, rng: random.Random) -> None:
    tid = traj_id_for(out.run.run_id, task.task_id, k)
    n = max(1, (task.difficulty or 3) + rng.randint(-1, 2))
    status = rng.choices(["success", "failure", "infra_error"], weights=[6, 3, 1])[0]
    for s in range(n):
        url = f"{task.start_url}{'search?q=' + x if s else ''}"
        action = _ACTIONS[rng.randrange(len(_ACTIONS))].format(x=x)
        last = s == n - 1 and status != "infra_error"
        action = f"answer('{x}')" if last else action
        png = screenshot(
            url, f"{task.site} — step {s}", [task.instruction, action], int(stable_hash(tid, s), 16)
        )
        digest = sha256_hex(png)
        out.screenshots[digest] = png
        out.steps.append(
            Step(
                traj_id=tid,
                step_idx=s,
                url=url,
                title=f"{task.site} — step {s}",
                screenshot_hash=digest,
                model_output=f"Thought: working on '{task.instruction}'. Action: {action}",
                thought=f"working on '{task.instruction}'",
                action={"raw": action},
                action_text=action,
                latency_model_s=round(rng.uniform(0.2, 1.5), 3),
                latency_env_s=round(rng.uniform(0.05, 0.3), 3),
            )
        )
    out.trajectories.append(
        Trajectory(
            traj_id=tid,
            run_id=out.run.run_id,
            task_id=task.task_id,
            task_version=task.version,
            policy=POLICY,
            status=status,
            group_id=group,
            sample_idx=k,
            n_steps=n,
            answer=x if status != "infra_error" else None,
            error="browser crashed (synthetic)" if status == "infra_error" else None,
            duration_s=round(n * rng.uniform(0.5, 2.0), 2),
        )
    )


def load(wh: Warehouse, sample: Sample) -> WriteResult:
    """Store the sample's screenshots and rows; idempotent (loading twice keeps one copy)."""
    blobs = []
    for data in sample.screenshots.values():
        put = wh.blobs.put(data)
        blobs.append(Blob(hash=put.hash, size=put.size, media_type="image/png"))
    result = wh.write_many([([sample.run], Run), (sample.tasks, Task), (blobs, Blob)])
    return result + wh.write_trajectories(sample.trajectories, sample.steps)
