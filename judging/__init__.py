"""Judges (programmatic, rubric VLM, one-call outcome VLM, ensemble), named evaluation
protocols, PRM step scoring, agreement metrics.

Imports ``warehouse`` and ``rollouts`` (shared prompt/action code). The registry of judges lives
in :mod:`judging.base`, which imports no judge; each judge module registers itself there, and
importing this package imports them all, so ``make_judge(name)`` finds every judge; then
:mod:`judging.protocols` registers the named protocols over them.
"""

from judging import ensemble, outcome_vlm, programmatic, protocols, rubric_vlm

__all__ = ["ensemble", "outcome_vlm", "programmatic", "protocols", "rubric_vlm"]
