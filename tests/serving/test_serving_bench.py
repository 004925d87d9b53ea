"""``bench/serving.py --quick`` (vllm tier): both arms run the same tasks to the same number of
steps and the bench prints steps/s for each and their ratio. The vllm arm talks to the session's
vLLM server (``--vllm-url``): starting a second one would only cost a minute of start-up."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.vllm_tier import VLLM

ROOT = Path(__file__).parents[2]
NUM = r"(\d+(?:\.\d+)?)"
pytestmark = VLLM


@pytest.mark.browser
@pytest.mark.slow
def test_quick_serving_bench_prints_both_arms_and_their_ratio(vllm_server, idefics):
    cmd = [sys.executable, str(ROOT / "bench" / "serving.py"), "--quick", "--eager"]
    cmd += ["--vllm-url", vllm_server.base_url, "--model", str(idefics)]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    arms = {  # name: (trajectories, steps, steps per second from the printed seconds)
        m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(3)) / float(m.group(4)))
        for m in re.finditer(
            rf"  (hf|vllm): (\d+) trajectories, (\d+) steps in {NUM} s = {NUM} steps/s", out
        )
    }
    assert set(arms) == {"hf", "vllm"}, out
    assert arms["hf"][:2] == arms["vllm"][:2] == (2, 6)  # the same work: 2 tasks x 3 steps
    assert all(rate > 0 for _, _, rate in arms.values())
    m = re.search(rf"ratio vllm/hf: {NUM}x steps/s", out)
    assert m and float(m.group(1)) == pytest.approx(arms["vllm"][2] / arms["hf"][2], rel=0.05)
    assert f"vllm: the running server at {vllm_server.base_url}" in out
