"""The command blocks of a docs page, as the tutorial test runs them.

Every fenced ``bash`` block of a page runs, in order, in one ``bash`` script (``set -euo
pipefail``): a later block sees an earlier one's variables and files. A block preceded by
``<!-- not run: REASON -->`` is shown but not run (a GPU, a real website); it must give a reason.

    python -m tests.docs.blocks docs/tutorials/first-flywheel.md     # print the script
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    skipped: str | None  # the reason, when the block is not run


def bash_blocks(page: Path) -> list[Block]:
    """The ``bash`` blocks of ``page``, each with its line and whether it is skipped."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "bash":
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _NOT_RUN.search(before)
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(line, m.group(2), reason.group(1).strip() if reason else None))
    return out


def script(page: Path) -> str:
    """One bash script of the page's blocks that run, each announced by its line."""
    rel = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    parts = ["set -euo pipefail"]
    for b in bash_blocks(page):
        if b.skipped is None:
            parts.append(f"echo '>>> {rel}:{b.line}' >&2\n{b.code}")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(script(Path(sys.argv[1]).resolve()))
