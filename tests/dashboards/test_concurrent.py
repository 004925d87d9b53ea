"""The app works while flows write: another process writes trajectories in transactions
while the app's pages read (every count seen is a whole number of batches, never half a
transaction, and never goes back), and a label saved through the Label page meanwhile lands in
``human_labels``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dashboards import data
from tests.dashboards.conftest import use_home
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import Step, Trajectory

ROOT = Path(__file__).parents[2]
PER_BATCH, READS = 5, 5
# Writes batches of PER_BATCH trajectories, one transaction each, until the stop file appears;
# prints each batch number, then "done <batches>".
WRITER = """
import sys, time
from pathlib import Path
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import Step, Trajectory
home, stop, per = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
    b = 0
    while not stop.exists():
        trajs = [Trajectory(f"w{b}-{i}", "run-w", "task-w", "writer", "success", n_steps=1)
                 for i in range(per)]
        steps = [Step(traj_id=t.traj_id, step_idx=0, action_text="click(1, 1)") for t in trajs]
        wh.write_trajectories(trajs, steps)
        print(b, flush=True)
        b += 1
        time.sleep(0.2)
print("done", b, flush=True)
"""


def next_batch(writer: subprocess.Popen) -> int:
    """The writer's next printed batch number (DuckDB may print a progress bar first)."""
    while True:
        line = writer.stdout.readline()
        assert line, writer.stderr.read()
        text = line.rsplit("\r", 1)[-1].strip()
        if text.isdigit():
            return int(text)


def trajectories_shown(at) -> int:
    return int(next(m.value for m in at.metric if m.label == "Trajectories").replace(",", ""))


@pytest.mark.slow  # a writer process beside the app
def test_pages_read_and_label_while_another_process_writes(open_page, tmp_path, monkeypatch):
    # every read looks the snapshot up (the app memoises it for a second, so a read right after
    # the writer's last commit could show the one before: by design, not what is tested here)
    monkeypatch.setattr(data, "_SNAPSHOT_TTL_S", 0.0)
    home = tmp_path / "home"
    cfg = WarehouseConfig.from_env(home=home, warehouse="")
    with Warehouse.open(cfg) as wh:
        wh.write_trajectories(
            [Trajectory("seed", "run-s", "task-s", "expert", "failure", n_steps=1)],
            [Step(traj_id="seed", step_idx=0, action_text="click(2, 2)")],
        )
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home), str(stop), str(PER_BATCH)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert next_batch(writer) == 0  # it is writing (and writes until told to stop)
        seen = []
        at = open_page("overview", home=home)
        assert not at.exception and not at.error
        seen.append(trajectories_shown(at))
        at = open_page("label", home=home, traj="seed")
        at.radio(key="queue_label").set_value("not_executable")
        at.text_input(key="queue_reviewer").set_value("carol")
        at.button[-1].click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any(s.value.startswith("Saved: not_executable by carol") for s in at.success)
        for _ in range(READS):
            at = open_page("overview", home=home)
            assert not at.exception and not at.error, [e.value for e in at.error]
            seen.append(trajectories_shown(at))
        # one more batch than any read saw, so the last read below shows more than all of them
        while next_batch(writer) <= (max(seen) - 1) // PER_BATCH:
            pass
        assert writer.poll() is None  # the label was saved while the writer was writing
        stop.touch()
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
        batches = int(out.split("done")[-1].strip())
    finally:
        if writer.poll() is None:
            writer.kill()
    at = open_page("overview", home=home)
    seen.append(trajectories_shown(at))
    assert seen == sorted(seen), seen  # never goes back
    assert all((n - 1) % PER_BATCH == 0 for n in seen), seen  # whole transactions only
    assert seen[-1] == 1 + batches * PER_BATCH
    assert seen[0] < seen[-1]  # the reads happened while the writer was writing
    use_home(monkeypatch, home)
    with Warehouse.open(cfg, migrate=False, read_only=True) as wh:
        rows = wh.sql("SELECT traj_id, label, reviewer, source FROM human_labels").rows()
    assert rows == [("seed", "not_executable", "carol", "dashboard")]
