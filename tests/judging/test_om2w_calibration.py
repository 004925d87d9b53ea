"""Calibration on imported Online-Mind2Web trajectories and their human labels: the rubric judge
(over a local OpenAI-protocol server) judges the imported screenshots; agreement with the human
labels is computed, per site and per judge version, and stored."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from judging.agreement import compute_agreements
from judging.base import backlog, judge_all, make_judge
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from tests.warehouse.test_om2w import make_task, png
from warehouse.interop import om2w
from warehouse.records import Agreement

GREEN, RED = (0, 200, 0), (200, 0, 0)


def final_colour(body: dict) -> tuple[int, int, int]:
    """The colour of the last image the judge was shown (what the agent's final page showed)."""
    urls = [
        c["image_url"]["url"]
        for c in body["messages"][-1]["content"]
        if c.get("type") == "image_url"
    ]
    raw = base64.b64decode(urls[-1].split(",", 1)[1])
    return Image.open(io.BytesIO(raw)).convert("RGB").getpixel((0, 0))


def test_rubric_judge_agreement_with_om2w_human_labels(wh, tmp_path: Path):
    root = tmp_path / "om2w"
    # The agent's final screenshot shows the answer page (green) or an error page (red); the
    # judge model decides from that imported screenshot, so its verdicts depend on what the
    # import stored and the judge sent, not on the task ids.
    final = {"t01": RED, "t02": GREEN, "t03": RED, "t04": GREEN, "t05": RED, "t06": GREEN}
    for tid, colour in final.items():
        folder = make_task(root, tid, n_shots=3, n_actions=2)
        (folder / "trajectory" / "2_full_screenshot.png").write_bytes(png(colour))
    labels = tmp_path / "human_label.json"
    # human: success for t01 t02 t04 t06, failure t03 t05 -> vs the judge (t02 t04 t06):
    # tp 3 (t02 t04 t06), fn 1 (t01), tn 2 (t03 t05), fp 0
    human = {"t01": 1, "t02": 1, "t03": 0, "t04": 1, "t05": 0, "t06": 1}
    labels.write_text(json.dumps(human))
    rep = om2w.import_om2w(wh, root, labels=labels, run_name="om2w")
    assert rep.labels_written == 6

    def model(body):
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. find the opening hours\n2. of the right store"
        ok = final_colour(body) == GREEN
        return json.dumps({"criteria": [], "verdict": "success" if ok else "failure"})

    with FakeOpenAI([], default=("fn", model)) as fake:
        judge = make_judge("rubric_vlm", base_url=fake.url, model="m", selection="heuristic")
        ids_todo = backlog(wh, judge)
        assert len(ids_todo) == 6  # imported trajectories are 'finished': judged, not checked
        summary = asyncio.run(judge_all(wh, judge, ids_todo))
    verdicts = dict(
        wh.sql(
            "SELECT t.task_id, j.verdict FROM judgments j JOIN trajectories t USING (traj_id) "
            "WHERE j.judge = 'rubric_vlm'"
        ).rows()
    )
    assert verdicts == {t: "success" if c == GREEN else "failure" for t, c in final.items()}
    assert summary.verdicts == {"success": 3, "failure": 3}
    # every imported screenshot of a 3-shot trajectory went to the judge (under the cap of 4)
    verdict_calls = [b for b in fake.requests if "Final answer" in last_user_text(b)]
    assert all(
        sum(c.get("type") == "image_url" for c in b["messages"][-1]["content"]) == 3
        for b in verdict_calls
    )
    rows = compute_agreements(wh, "rubric_vlm", "human", judge.version)
    overall = next(r for r in rows if r.site is None)
    assert overall.n == 6 and overall.accuracy == pytest.approx(5 / 6)
    assert overall.precision == 1.0 and overall.recall == pytest.approx(0.75)
    # kappa: p_o = 5/6; p_e = .5*(4/6) + .5*(2/6) = .5 -> (5/6 - .5) / .5 = 2/3
    assert overall.kappa == pytest.approx(2 / 3)
    assert overall.success_rate_gap == pytest.approx(0.5 - 4 / 6)
    stored = [a for a in wh.records(Agreement) if a.judge_version == judge.version]
    assert [a.site for a in stored] == [None]  # live-web tasks have no site: "all" only
