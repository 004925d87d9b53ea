"""Judges (programmatic, rubric VLM, ensemble), PRM step scoring, agreement metrics.

Built by the judges issue; imports ``warehouse`` and ``rollouts`` (shared prompt/action code).
"""
