"""Child processes that end with the process that started them (Linux's ``PR_SET_PDEATHSIG``):
the kernel signals the child when its parent dies, however it died (SIGKILL runs no Python).
Used by the servers a command starts (:mod:`serving.children`) and the training ranks
(:mod:`training.launch`)."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux; a no-op elsewhere).
    For ``preexec_fn``: it runs in the child between fork and exec. The kernel ties it to the
    *thread* that forked: start such children from a thread that lives as long as they should
    (the CLI's main thread), not from a worker thread (a Prefect task's)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
