"""The live progress bar: fed the reports the stage flows send (engine stats, judge and score
summaries, intervene's dict, trainer steps), it renders their counts and rates."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.console import Console

from cli.progress import LiveProgress, describe
from judging.base import JudgeSummary
from judging.prm import ScoreSummary
from rollouts.engine import Stats


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def console(terminal: bool) -> Console:
    return Console(record=True, file=io.StringIO(), width=200, force_terminal=terminal)


def engine_reports() -> list[Stats]:
    """What the engine reports about once a second over a run of 8 episodes."""
    return [
        Stats(total=8, running=4, finished=0, by_status={}, steps=10),
        Stats(total=8, running=4, finished=3, by_status={"success": 2, "failure": 1}, steps=30),
        Stats(total=8, running=0, finished=8, by_status={"success": 6, "timeout": 2}, steps=80),
    ]


@pytest.mark.parametrize("terminal", [True, False])
def test_engine_stats_render_counts_and_rates(terminal: bool):
    clock, out = Clock(), console(terminal)
    with LiveProgress("collect", console=out, clock=clock) as bar:
        for i, st in enumerate(engine_reports()):
            clock.now = 100.0 + 2.0 * (i + 1)  # 2 s, 4 s, 6 s after the start
            bar(st)
    text = out.export_text()
    final = (
        "8/8 episodes · 0 running · 6 successful · 2 not successful · 80 steps · "
        "13.3 steps/s · 1.33 episodes/s"
    )
    assert final in text and "collect" in text
    assert (bar.completed, bar.total) == (8, 8)
    if not terminal:  # a log: the first report, then the last (the middle one is within 5 s)
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines[0].endswith("0/8 episodes · 4 running · 0 successful · 0 not successful · "
                                 "10 steps · 5.0 steps/s · 0.00 episodes/s")  # fmt: skip
        assert lines[-1].endswith(final) and len(lines) == 2


def test_judge_score_intervene_and_training_reports():
    clock, out = Clock(), console(False)
    judged = JudgeSummary(judged=6, verdicts=Counter(success=4, failure=2), errors=1)
    with LiveProgress("judge", console=out, clock=clock, log_every_s=0) as bar:
        clock.now = 104.0
        bar(judged)
        bar(ScoreSummary(states=3, candidates=12, scored=11, errors=1))
        summary = {"selected": 5, "skipped": ["t9: no reference"], "intervened": 2,
                   "verified": 1, "not_verified": 1, "no_error_found": 1, "errors": 0}  # fmt: skip
        bar(summary)
        assert (bar.completed, bar.total) == (3, 4)
        bar("  curate select: 3 trajectories, 8 steps")
        bar.steps(6, 12)
    text = out.export_text()
    assert "6 judged (failure 2, success 4) · 1 judge errors · 1.50 trajectories/s" in text
    assert "3 states · 11/12 candidates scored · 1 scorer errors · 0.75 states/s" in text
    assert (
        "3/4 trajectories · 1 verified · 1 not verified · 1 no error found · 0 errors · "
        "0.75 trajectories/s"
    ) in text
    assert "  curate select: 3 trajectories, 8 steps" in text
    assert "step 6/12 · 1.50 steps/s" in text


def test_an_unknown_report_is_refused_by_name():
    with pytest.raises(TypeError, match="cannot show a int"):
        describe(3, 1.0)
    with pytest.raises(TypeError, match="lacks selected"):
        describe({"intervened": 1}, 1.0)
