"""One Prefect server and one PostgreSQL cluster for every pytest-xdist worker of a run.

Under pytest-xdist each worker is its own process, and each used to start its own Prefect server
(15-20 s of a core, 230 MB, and the first flow test of each worker waited for it) and its own
PostgreSQL cluster. A worker cannot own a shared server: it may finish its share of the files,
and stop, while the other still runs flows. So the controller (the process that starts the
workers) launches both right after configuration, in background threads, while the workers
collect; it writes what they need to know into a folder named in :data:`ENV`, which the
workers inherit, and stops both when the run ends. A worker's fixture waits for the file.

Launched only when the run's marker expression may select such tests (``make test-fast``'s
``not prefect and ... not postgres`` starts neither).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The environment variable naming the folder of the run's shared services (set by the controller).
ENV = "WEBLOOP_TEST_SERVICES"

_stops: list[Callable[[], None]] = []
_threads: list[threading.Thread] = []


def start(markexpr: str) -> None:
    """In the xdist controller: launch the services ``markexpr`` may need, in the background."""
    folder = Path(tempfile.mkdtemp(prefix="webloop-services-"))
    os.environ[ENV] = str(folder)
    if "not prefect" not in markexpr:
        _background("prefect", folder, _launch_prefect)
    if "not postgres" not in markexpr:
        _background("postgres", folder, _launch_postgres)
    _stops.append(lambda: shutil.rmtree(folder, ignore_errors=True))


def stop() -> None:
    """In the controller, when the run ends: stop what :func:`start` launched."""
    for thread in _threads:
        thread.join(timeout=300)
    for fn in reversed(_stops):
        try:
            fn()
        except Exception as exc:
            print(f"stopping a shared test service failed: {exc!r}")
    _stops.clear()
    os.environ.pop(ENV, None)


def wait_for(name: str, timeout_s: float = 600) -> dict[str, Any] | None:
    """In a worker: the shared service ``name``'s details (None when this run shares none);
    raises the controller's error when it could not start."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    path = Path(folder) / f"{name}.json"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the shared {name} service did not start in {timeout_s:.0f} s")
        time.sleep(0.2)
    info = json.loads(path.read_text())
    if "error" in info:
        raise RuntimeError(f"the shared {name} service failed to start: {info['error']}")
    return info


def _background(name: str, folder: Path, launch: Callable[[], dict[str, Any]]) -> None:
    def go() -> None:
        try:
            info = launch()
        except BaseException as exc:
            info = {"error": repr(exc)}
        tmp = folder / f".{name}.json"
        tmp.write_text(json.dumps(info))
        tmp.replace(folder / f"{name}.json")  # whole or absent: workers poll for it

    thread = threading.Thread(target=go, name=f"shared-{name}", daemon=True)
    thread.start()
    _threads.append(thread)


def _launch_prefect() -> dict[str, Any]:
    from tests import prefect_server

    prefect_server.launch()
    assert prefect_server._early is not None
    server = prefect_server._early.wait()
    _stops.append(prefect_server.stop)
    return {"api_url": server.api_url}


def _launch_postgres() -> dict[str, Any]:
    from tests.conftest import start_pg_cluster

    cluster, stop_cluster = start_pg_cluster()
    _stops.append(stop_cluster)
    return {
        "bindir": str(cluster.bindir),
        "base": str(cluster.base),
        "port": cluster.port,
        "as_user": cluster.as_user,
    }
