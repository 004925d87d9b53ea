"""One of three processes sharing a warehouse (see test_concurrency.py).

    python concurrency_worker.py writer|labeller|reader STOP_FILE [BATCHES PER_BATCH STEPS]

The warehouse comes from WEBLOOP_HOME / WEBLOOP_WAREHOUSE. Prints one JSON line of results;
any exception escapes (non-zero exit, traceback on stderr) so the test sees it.

Overlap is made explicit, not left to timing: the reader and the labeller publish how many passes
they have finished (``<role>.passes`` beside STOP_FILE); the writer starts only after both have
finished one pass, and half-way waits until the reader has finished two more passes, so at least
one whole reader pass sees a half-written warehouse. STOP_FILE appears after the last batch.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from warehouse import Warehouse
from warehouse.ids import make_id
from warehouse.records import HumanLabel, Step, Trajectory

BARRIER_TIMEOUT_S = 240  # a safety net for a dead peer, not a pace: peers normally take ms


def publish(stop: Path, role: str, passes: int) -> None:
    tmp = stop.with_name(f"{role}.passes.tmp")
    tmp.write_text(str(passes))
    os.replace(tmp, stop.with_name(f"{role}.passes"))  # atomic: never read half-written


def passes_of(stop: Path, role: str) -> int:
    try:
        return int(stop.with_name(f"{role}.passes").read_text())
    except FileNotFoundError:
        return 0


def wait_for(stop: Path, role: str, passes: int) -> None:
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while passes_of(stop, role) < passes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {role} did not finish {passes} passes")
        time.sleep(0.01)


def writer(stop: Path, batches: int, per_batch: int, n_steps: int) -> dict:
    wh = Warehouse.open()
    wait_for(stop, "reader", 1)
    wait_for(stop, "labeller", 1)
    for b in range(batches):
        if b == batches // 2:  # half-way: a whole reader pass over a half-written warehouse
            wait_for(stop, "reader", passes_of(stop, "reader") + 2)
        trajs, steps = [], []
        for k in range(per_batch):
            tid = f"b{b:03d}-t{k:02d}"
            trajs.append(
                Trajectory(
                    traj_id=tid,
                    run_id="conc",
                    task_id=f"task{k}",
                    policy="p",
                    status="success",
                    n_steps=n_steps,
                    meta={"batch": b},
                )
            )
            steps += [
                Step(
                    traj_id=tid,
                    step_idx=i,
                    url=f"http://x/{b}/{k}/{i}",
                    model_output="Thought: … Action: click(1, 2)" * 4,
                )
                for i in range(n_steps)
            ]
        wh.write_trajectories(trajs, steps)
    wh.close()
    stop.touch()
    return {"batches": batches}


def labeller(stop: Path) -> dict:
    wh = Warehouse.open()
    labelled, rounds = 0, 0
    while True:
        done = stop.exists()  # read before the pass, so the last pass sees every trajectory
        todo = wh.sql(
            "SELECT traj_id FROM trajectories WHERE traj_id NOT IN "
            "(SELECT traj_id FROM human_labels)"
        )["traj_id"].to_list()
        if todo:
            rows = [
                HumanLabel(
                    label_id=make_id("label", t),
                    traj_id=t,
                    label=random.choice(["success", "failure"]),
                    reviewer="bot",
                )
                for t in todo
            ]
            wh.write(rows)
            labelled += len(rows)
        rounds += 1
        publish(stop, "labeller", rounds)
        if done:
            break
        time.sleep(0.05)
    wh.close()
    return {"labelled": labelled, "rounds": rounds}


def reader(stop: Path, batches: int, per_batch: int) -> dict:
    wh = Warehouse.open()
    checks, violations, partial = 0, [], 0
    while True:
        done = stop.exists()
        # Ad-hoc SQL in one statement (one snapshot): every visible batch must be whole.
        df = wh.sql(
            "SELECT t.meta->>'batch' AS batch, count(DISTINCT t.traj_id) AS trajs, "
            "count(s.step_idx) AS steps, max(t.n_steps) AS n "
            "FROM trajectories t LEFT JOIN steps s USING (traj_id) GROUP BY 1"
        )
        for row in df.iter_rows(named=True):
            if row["trajs"] != per_batch or row["steps"] != per_batch * row["n"]:
                violations.append(row)
        partial += 0 < df.height < batches  # a pass that saw some batches, not all
        checks += 1
        publish(stop, "reader", checks)
        if done:
            break
        time.sleep(0.02)
    wh.close()
    return {"checks": checks, "partial_views": partial, "violations": violations[:5]}


if __name__ == "__main__":
    role, stop = sys.argv[1], Path(sys.argv[2])
    nums = [int(x) for x in sys.argv[3:]]
    if role == "writer":
        out = writer(stop, *nums)
    elif role == "labeller":
        out = labeller(stop)
    else:
        out = reader(stop, nums[0], nums[1])
    print(json.dumps(out))
