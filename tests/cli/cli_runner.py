"""Running the ``webloop`` CLI in tests: in-process through its console entry point (the same
``cli.app.main``, so the same error handling and exit codes), or as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def webloop(home: Path, *args: str, ok: bool = True) -> Result:
    """``webloop ARGS`` with ``WEBLOOP_HOME=home``, in this process. Commands that run flows
    need the session's ``prefect_harness`` fixture. An unexpected exception propagates (a
    subprocess would print its traceback and exit 1)."""
    from cli import app as cli

    env = {"WEBLOOP_HOME": str(home), "WEBLOOP_WAREHOUSE": None, "COLUMNS": "200"}
    argv = sys.argv
    with CliRunner().isolation(env=env) as (out, err, _):
        sys.argv = ["webloop", *args]
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        result = Result(code, out.getvalue().decode(), err.getvalue().decode())
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def webloop_subprocess(
    home: Path, *args: str, ok: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m cli.app ARGS`` as users run it. Pass ``env`` (e.g. the
    ``prefect_subprocess_env`` fixture) when the command runs a flow."""
    env = {**(env or os.environ), "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
    env.pop("WEBLOOP_WAREHOUSE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.app", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc
