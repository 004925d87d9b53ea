"""Hypothesis settings profiles for the fuzz tests (``tests/**/test_fuzz*.py``).

- ``ci`` (default, the default tier): deterministic (``derandomize=True``: the same examples
  every run), no per-example deadline (2 shared cores make timings noisy), 25 examples a test.
- ``full`` (the long tier: ``make test-long`` runs every Hypothesis test again, marker ``fuzz``):
  the same, at 100 examples a test.
- ``dev``: random and longer, for hunting: ``HYPOTHESIS_PROFILE=dev pytest tests -k fuzz``.

Each fuzz module imports :func:`load` so the profile applies however the tests are selected.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_DETERMINISTIC = dict(
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", max_examples=25, **_DETERMINISTIC)
settings.register_profile("full", max_examples=100, **_DETERMINISTIC)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow],
)


def load() -> None:
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


load()


def examples(full: int) -> int:
    """A test's own example count ``full`` in the long tier (and ``dev``), a quarter of it (at
    least 10) in the default tier's ``ci`` profile: as the profiles' own counts."""
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        return max(10, full // 4)
    return full
