"""Hypothesis settings profiles for the fuzz tests (``tests/**/test_fuzz*.py``).

- ``ci`` (default): deterministic (``derandomize=True``: the same examples every run), no
  per-example deadline (2 shared cores make timings noisy), modest example counts.
- ``dev``: random and longer, for hunting: ``HYPOTHESIS_PROFILE=dev pytest tests -k fuzz``.

Each fuzz module imports :func:`load` so the profile applies however the tests are selected.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=100,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow],
)


def load() -> None:
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


load()
