"""Curation recipes, filters, dedup, curriculum, interventions, quality gates, dataset export.

Imports ``warehouse`` and ``rollouts`` (shared prompt/action code) only.
"""
