"""``webloop sites serve`` as a real subprocess, for the tests that check what it prints and
writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path


def serve_until_ready(home: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """Start ``webloop sites serve`` with ``WEBLOOP_HOME=home``; the process and the site URLs
    it printed (it writes the secret file before it prints them). Stop it with SIGINT."""
    env = {**os.environ, "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "sites", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    urls: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while len(urls) < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        m = re.match(r"(\w+)\s+(http://127\.0\.0\.1:\d+)", line)
        if m:
            urls[m.group(1)] = m.group(2)
    return proc, urls
