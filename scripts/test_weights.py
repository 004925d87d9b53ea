"""Per-file test times from a pytest log run with ``--durations=0``: the order in which
``tests/conftest.py`` hands test files to pytest-xdist workers (the longest first: the run's
tail is then the short files, not the flywheel), and for the default tier the figures its time
budget is checked on (``tests/tiers.py``). Usage, one tier at a time::

    make test PYTEST_ADDOPTS=--durations=0 > /tmp/test.log
    python scripts/test_weights.py /tmp/test.log > tests/weights.txt
    make test-long PYTEST_ADDOPTS=--durations=0 > /tmp/long.log
    python scripts/test_weights.py /tmp/long.log --tier long > tests/weights-long.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r"^(\d+\.\d+)s (?:call|setup|teardown)\s+(tests/\S+?)(?:::|\s|$)")


def main(path: str, tier: str = "default") -> None:
    seconds: Counter[str] = Counter()
    with open(path, encoding="utf-8") as log:
        for line in log:
            m = LINE.match(line)
            if m:
                unit = m.group(2)
                unit = "tests/serving/" if unit.startswith("tests/serving/") else unit
                seconds[unit] += float(m.group(1))
    command = {"default": "make test", "long": "make test-long"}[tier]
    print(f"# seconds per test file of a 2-worker `{command}` (scripts/test_weights.py)")
    for unit, s in seconds.most_common():
        if s >= 2:
            print(f"{s:.0f} {unit}")


if __name__ == "__main__":
    args = sys.argv[1:]
    tier = args[args.index("--tier") + 1] if "--tier" in args else "default"
    main(args[0], tier)
