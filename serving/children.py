"""Child processes that end with the command that started them.

A command that runs a server as a child (``webloop dashboard`` runs Streamlit) must not leave it
serving when it is stopped: by Ctrl-C, by a supervisor's SIGTERM (``docker stop``, systemd), by
SIGHUP when its terminal closes, or by SIGKILL, which runs no Python at all. :func:`run_child`
forwards the catchable signals to the child and waits for it (killing it after a grace period),
and starts the child with Linux's ``PR_SET_PDEATHSIG``: the kernel sends the child SIGTERM when
its parent dies, however it died.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

from warehouse.processes import die_with_parent

__all__ = ["FORWARDED", "die_with_parent", "run_child"]

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def run_child(argv: Sequence[str], env: dict[str, str] | None = None, grace_s: float = 10.0) -> int:
    """Run ``argv`` until it exits; return its exit code (``128 + N`` when signal N stopped
    this command). A SIGTERM, SIGHUP or SIGINT to this process is passed on to the child; if
    the child has not exited ``grace_s`` after the first one (or when this function is left by
    an exception), it is killed."""
    proc = subprocess.Popen(list(argv), env=env, preexec_fn=die_with_parent)
    got: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        got.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                code = proc.wait(timeout=grace_s if got else None)
                return 128 + got[0] if got else code
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
