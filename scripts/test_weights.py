"""Per-file test times from a pytest log run with ``--durations=0``: the order in which
``tests/conftest.py`` hands test files to pytest-xdist workers (the longest first: the run's
tail is then the short files, not the flywheel). Usage::

    make test PYTEST_ADDOPTS=--durations=0 > /tmp/test.log
    python scripts/test_weights.py /tmp/test.log > tests/weights.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r"^(\d+\.\d+)s (?:call|setup|teardown)\s+(tests/\S+?)(?:::|\s|$)")


def main(path: str) -> None:
    seconds: Counter[str] = Counter()
    with open(path, encoding="utf-8") as log:
        for line in log:
            m = LINE.match(line)
            if m:
                unit = m.group(2)
                unit = "tests/serving/" if unit.startswith("tests/serving/") else unit
                seconds[unit] += float(m.group(1))
    print("# seconds per test file of a 2-worker `make test` (scripts/test_weights.py)")
    for unit, s in seconds.most_common():
        if s >= 2:
            print(f"{s:.0f} {unit}")


if __name__ == "__main__":
    main(sys.argv[1])
