"""Calibration on imported Online-Mind2Web trajectories and their human labels: the rubric judge
(over a local OpenAI-protocol server) judges the imported screenshots; agreement with the human
labels is computed, per site and per judge version, and stored."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from judging.agreement import compute_agreements
from judging.base import backlog, judge_all, make_judge
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from tests.warehouse.test_om2w import make_task
from warehouse.interop import om2w
from warehouse.records import Agreement


def test_rubric_judge_agreement_with_om2w_human_labels(wh, tmp_path: Path):
    root = tmp_path / "om2w"
    # the judge model will call a task a success when its id ends in an even digit
    ids = ["t01", "t02", "t03", "t04", "t05", "t06"]
    for tid in ids:
        make_task(root, tid, n_shots=3, n_actions=2)
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
        m = re.search(r"store (t\d+)", text)
        ok = int(m.group(1)[-1]) % 2 == 0
        return json.dumps({"criteria": [], "verdict": "success" if ok else "failure"})

    with FakeOpenAI([], default=("fn", model)) as fake:
        judge = make_judge("rubric_vlm", base_url=fake.url, model="m", selection="heuristic")
        ids_todo = backlog(wh, judge)
        assert len(ids_todo) == 6  # imported trajectories are 'finished': judged, not checked
        summary = asyncio.run(judge_all(wh, judge, ids_todo))
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
