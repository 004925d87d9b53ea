"""Judges (programmatic, rubric VLM, ensemble), PRM step scoring, agreement metrics.

Imports ``warehouse`` and ``rollouts`` (shared prompt/action code). The registry of judges lives
in :mod:`judging.base`, which imports no judge; each judge module registers itself there, and
importing this package imports them all, so ``make_judge(name)`` finds every judge.
"""

from judging import ensemble, programmatic, rubric_vlm

__all__ = ["ensemble", "programmatic", "rubric_vlm"]
