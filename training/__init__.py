"""Model factory (incl. tiny offline models), SFT, RL, checkpoints, evaluation helpers.

Imports ``warehouse`` and ``rollouts`` (shared prompt/action code) only.
"""
