"""Text from data (page titles, task ids, model output, imported files) printed to a terminal.

A terminal obeys control sequences in what it prints: ``ESC ]0;…BEL`` retitles the window, ``ESC
[2J`` clears it, OSC 8 plants links, ``\\r`` overwrites a line with another. Rich also reads
``[markup]`` in strings. So every console of the CLI is a :class:`SafeConsole` (control characters
in printed strings are shown as escapes: ``\\x1b``), and table cells, which rich parses as markup,
are escaped as well (:func:`cell`)."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.markup import escape

# C0 controls but tab and newline, DEL, C1 controls (ESC's 8-bit forms)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with each control character (but tab and newline) replaced by its escape."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def cell(value: Any) -> str:
    """A table cell: the value as text, control characters escaped, markup shown as typed."""
    return "" if value is None else escape(terminal_safe(str(value)))


class SafeConsole(Console):
    """A rich console that never sends a control character from a printed string to the
    terminal (markup written by the CLI itself still styles; data is escaped by the callers)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        safe = (terminal_safe(o) if isinstance(o, str) else o for o in objects)
        super().print(*safe, **kwargs)
