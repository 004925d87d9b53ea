"""Shared fixtures: temporary warehouses (SQLite and PostgreSQL catalogs), the Prefect harness,
the bundled sites and one Chromium for the whole session."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from warehouse import Warehouse, WarehouseConfig

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture
def cfg(tmp_path: Path) -> WarehouseConfig:
    """A fresh SQLite-catalog warehouse config under tmp_path."""
    return WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")


@pytest.fixture
def wh(cfg: WarehouseConfig) -> Iterator[Warehouse]:
    with Warehouse.open(cfg) as w:
        yield w


# -- PostgreSQL: a throwaway cluster on a free loopback port ----------------------------------


def pg_bindir() -> Path | None:
    """Folder with initdb/pg_ctl: $WEBLOOP_PG_BIN, Debian's layout, or PATH."""
    if os.environ.get("WEBLOOP_PG_BIN"):
        return Path(os.environ["WEBLOOP_PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self, bindir: Path, base: Path, port: int, as_user: list[str]) -> None:
        self.bindir, self.base, self.port, self.as_user = bindir, base, port, as_user

    def run(self, tool: str, *args: str) -> None:
        cmd = [*self.as_user, str(self.bindir / tool), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {proc.stdout}\n{proc.stderr}")

    def new_database(self) -> str:
        name = "wl_" + uuid.uuid4().hex[:10]
        self.run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """The run's PostgreSQL cluster: under pytest-xdist the one the controller started for every
    worker (``tests/shared_services.py``), else one for this session."""
    from tests import shared_services

    shared = shared_services.wait_for("postgres")
    if shared is not None:
        yield PgCluster(
            Path(shared["bindir"]), Path(shared["base"]), shared["port"], shared["as_user"]
        )
        return
    cluster, stop = start_pg_cluster()
    try:
        yield cluster
    finally:
        stop()


def start_pg_cluster() -> tuple[PgCluster, Any]:
    """A new cluster on a free loopback port, and the function that stops and removes it."""
    bindir = pg_bindir()
    if bindir is None or not (bindir / "pg_ctl").exists():
        pytest.fail("PostgreSQL server binaries (initdb, pg_ctl) not found: run `make setup`")
    base = Path(tempfile.mkdtemp(prefix="webloop-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: use the postgres account
        shutil.chown(base, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    cluster = PgCluster(bindir, base, port, as_user)
    data = base / "data"
    cluster.run("initdb", "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "-N")
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    cluster.run("pg_ctl", "-D", str(data), "-l", str(base / "log"), "-w", "-o", opts, "start")

    def stop() -> None:
        cluster.run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)

    return cluster, stop


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """The URL of a fresh, empty PostgreSQL database for a DuckLake catalog."""
    return pg_cluster.new_database()


@pytest.fixture
def pg_cfg(pg_url: str, tmp_path: Path) -> WarehouseConfig:
    """A warehouse config with a fresh PostgreSQL catalog database and local data files."""
    return WarehouseConfig.from_env(home=tmp_path / "home", warehouse=pg_url)


# -- Prefect ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[str]:
    """A temporary Prefect server and database for the whole session (15-20 s to start, once,
    in the background from the end of collection: ``tests/prefect_server.py``); its API URL.

    Flows run in-process against it. A subprocess that runs a flow gets the URL in
    ``PREFECT_API_URL`` (:func:`prefect_subprocess_env`) instead of starting its own server."""
    from flows import prefect_env as configure_env

    configure_env.configure()
    from tests import prefect_server

    with prefect_server.harness() as api_url:
        yield api_url


@pytest.fixture
def prefect_subprocess_env(prefect_harness: str) -> dict[str, str]:
    """Environment for a subprocess that runs flows: this session's Prefect server."""
    return {**os.environ, "PREFECT_API_URL": prefect_harness}


# fixture → the marker a test that uses it carries, whichever fixture brought it in: the Prefect
# harness, a PostgreSQL cluster, a model server process (hf or vLLM: seconds to a minute to start)
FIXTURE_MARKERS = {
    "prefect_harness": "prefect",
    "pg_cluster": "postgres",
    "hf_server": "slow",
    "vllm_server": "slow",
    "server_of": "slow",
}


def _no_cuda() -> str | None:
    """Why ``gpu`` tests cannot run here (None on a machine with a CUDA device)."""
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA device (marker gpu)"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: every tier checks every marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a fixture of :data:`FIXTURE_MARKERS` carry its marker (``make test-fast``
    deselects them); Hypothesis tests carry ``fuzz``; a ``long`` marker must name its
    default-tier twin (:func:`tests.tiers.long_marker_problem`). In one process, tests of a
    ``--quick`` benchmark (marker ``bench``) run last: their benchmarks start in the background
    when the session begins (``tests/bench/early.py``); under pytest-xdist the longest files go
    first."""
    from tests.tiers import long_marker_problem

    refused = [p for item in items if (p := long_marker_problem(item))]
    if refused:
        raise pytest.UsageError("\n".join(dict.fromkeys(refused)))
    no_cuda = _no_cuda() if any(i.get_closest_marker("gpu") for i in items) else None
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.fuzz)
        if no_cuda and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=no_cuda))
        names = getattr(item, "fixturenames", ())
        for mark in {m for f, m in FIXTURE_MARKERS.items() if f in names}:
            item.add_marker(getattr(pytest.mark, mark))
    if _xdist(config):
        # pytest-xdist hands out whole files in this order: the longest first (measured,
        # tests/weights.txt), so the run does not end on one worker finishing the flywheel
        weights = _file_weights()
        items.sort(key=lambda i: -weights.get(_unit(i.nodeid), 0.0))  # stable: files stay whole
    else:  # one process: the benchmarks run early in the background, their tests read them last
        items[:] = [i for i in items if not _bench(i)] + [i for i in items if _bench(i)]


def _xdist(config: pytest.Config) -> bool:
    return getattr(config, "workerinput", None) is not None or bool(
        config.getoption("numprocesses", None)
    )


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to under pytest-xdist (its file; the serving tier)."""
    path = nodeid.split("::", 1)[0]
    return "tests/serving/" if path.startswith("tests/serving/") else path


def _file_weights() -> dict[str, float]:
    """Seconds per unit of the measured runs of both tiers (``tests/tiers.py``)."""
    from tests.tiers import read_weights

    return {**read_weights("long"), **read_weights("default")}


def _bench(item: pytest.Item) -> tuple[str, ...] | None:
    """The benchmark run (script and extra arguments) a test reads, from its ``bench`` marker."""
    mark = item.get_closest_marker("bench")
    return tuple(mark.args) if mark is not None else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a ``vllm`` test will run, launch vLLM now in the background (30-70 s to load); when a
    ``prefect`` test will, the session's Prefect server (``tests/prefect_server.py``); and
    start the selected ``--quick`` benchmarks (``tests/bench/early.py``): the suite keeps about
    one of the two cores busy, they run on the other (``tests/serving/vllm_tier.py``). Not under
    pytest-xdist: there every worker collects every test; each fixture or benchmark test then
    starts what it needs on the worker that runs it."""
    xdist = getattr(session.config, "workerinput", None) is not None
    if xdist or session.config.getoption("numprocesses", None):
        return
    if any(item.get_closest_marker("vllm") for item in session.items):
        from tests.serving import vllm_tier

        vllm_tier.launch_early()
    if any(item.get_closest_marker("prefect") for item in session.items):
        from tests import prefect_server

        prefect_server.launch()
    from tests.bench import early

    early.start([run for item in session.items if (run := _bench(item))])


def pytest_configure(config: pytest.Config) -> None:
    """The pytest-xdist controller launches the Prefect server and the PostgreSQL cluster that
    every worker shares (``tests/shared_services.py``), while the workers collect."""
    if _xdist(config) and getattr(config, "workerinput", None) is None:
        from tests import shared_services

        shared_services.start(config.getoption("markexpr", "") or "")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdist(config) and getattr(config, "workerinput", None) is None:
        from tests import shared_services

        shared_services.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import prefect_server
    from tests.bench import early
    from tests.serving import vllm_tier

    early.stop()
    vllm_tier.close_early()
    prefect_server.stop()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """Under pytest-xdist (``make test TEST_WORKERS=N``) a test file is the unit of work: its
    module-scoped fixtures are built once and its tests run in order on one worker. The serving
    files are one unit (they share the session's one vLLM server)."""
    from xdist.scheduler import LoadScopeScheduling

    # pytest-xdist reorders the units by their number of tests unless told not to, which put
    # the few-test, minutes-long benchmark files last: keep the weights' order instead
    config.option.loadscopereorder = False

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByFile(config, log)


# -- Bundled sites and Chromium, shared by the session -------------------------------------------


@pytest.fixture(scope="session")
def sites() -> Iterator[Any]:
    """The bundled sites (site seed 0) for the whole session, in a background thread. Browser
    sessions are cookies, so tests sharing it never see each other's state."""
    from sites.server import SiteServer

    with SiteServer(seed=0, slow_s=0.1) as s:
        yield s


@pytest.fixture(scope="session")
def server(sites: Any) -> Any:
    """The session's bundled sites (a module may override this fixture with its own server)."""
    return sites


class SharedChromium:
    """One Chromium for the whole session, on one long-lived event loop in a background thread.

    A Playwright browser belongs to the event loop that launched it, and every test drives its
    async code with its own ``asyncio.run``; so async code that uses the shared browser runs on
    the browser's loop instead: ``chromium.run(run_collect(wh, cfg, browser=chromium.browser))``.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="chromium")
        self.thread.start()
        self.browser: Any = None
        self._pw: Any = None

    def run(self, coro: Any, timeout: float = 600) -> Any:
        """Run ``coro`` on the browser's loop; its result (or exception) here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> SharedChromium:
        from playwright.async_api import async_playwright

        from rollouts.browser import launch

        async def go() -> None:
            self._pw = await async_playwright().start()
            self.browser = await launch(self._pw)

        self.run(go(), timeout=120)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self.browser is not None:
                await self.browser.close()
            if self._pw is not None:
                await self._pw.stop()

        try:
            self.run(close(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def chromium() -> Iterator[SharedChromium]:
    """The session's Chromium and its event loop (see :class:`SharedChromium`)."""
    shared = SharedChromium().start()
    try:
        yield shared
    finally:
        shared.stop()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Qwen2-VL built offline (seconds, no download)."""
    from training.models import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "tiny-vlm")


@pytest.fixture(scope="session")
def served(tiny: Path, tmp_path_factory) -> Iterator[str]:
    """``webloop serve-model`` with the tiny model (one server for the session), its /v1 URL."""
    log = open(tmp_path_factory.mktemp("serve") / "serve-model.log", "w+")  # noqa: SIM115
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.app",
            "serve-model",
            "--model",
            str(tiny),
            "--port",
            str(port),
            "--name",
            "tiny",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"serve-model exited: {log.read()[-3000:]}")
    yield url + "/v1"
    proc.terminate()
    proc.wait(30)
    log.close()
