"""Kept for :mod:`tests.training.test_ranker`, which imports ``TREE`` and ``HashEncoder`` from
here: the ranker's tests mirror its package in ``tests/rollouts/ranker/`` and share these from
:mod:`tests.rollouts.ranker.fixture`. Switch that import and delete this module."""

from __future__ import annotations

from tests.rollouts.ranker.fixture import INSTRUCTION, TREE, HashEncoder, messages

__all__ = ["INSTRUCTION", "TREE", "HashEncoder", "messages"]
