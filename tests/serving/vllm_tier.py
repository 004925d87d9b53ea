"""The ``vllm`` test tier: tests marked ``vllm`` need the vLLM environment (``make vllm``) and
are skipped with this reason when it is not built."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from serving.supervisor import ModelServer, ServerSpec, free_port, vllm_python

HAVE_VLLM = vllm_python() is not None
SKIP_REASON = "the vllm tier needs .venv-vllm: run `make vllm` (CI does) to run these tests"
requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)
# the marks of a vllm-tier test; its own timeout, as its first test also starts vLLM (30-70 s
# here, many minutes on a machine loaded by other jobs)
VLLM = [pytest.mark.vllm, requires_vllm, pytest.mark.timeout(2400)]

NAME = "tiny-idefics"


def spec_of(engine: str, model: Path) -> ServerSpec:
    """The session's server spec of ``engine`` over the tiny model; vLLM's in dev mode (the
    weight-sync tests reload checkpoints the tests save in their temporary folders), hf's not."""
    # eager vLLM: torch.compile of a tiny model only costs start-up time
    dev = {"dev_mode": True, "reload_root": tempfile.gettempdir()} if engine == "vllm" else {}
    return ServerSpec(engine, str(model), port=free_port(), name=NAME, enforce_eager=True, **dev)


class EarlyVllm:
    """The session's tiny Idefics3 and vLLM server, built and launched in a background thread."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="webloop-serving-"))
        self.model: Path | None = None
        self.server: ModelServer | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._go, name="vllm-launch", daemon=True)

    def _go(self) -> None:
        try:
            from training.models import build_tiny_idefics

            self.model = build_tiny_idefics(self.dir / NAME)
            # launched from this short-lived thread: not tied to it (close() stops it)
            self.server = ModelServer(
                spec_of("vllm", self.model), log=self.dir / "vllm.log", die_with_starter=False
            )
            self.server.launch()
        except BaseException as exc:  # re-raised where a test needs the server
            self.error = exc

    def wait(self) -> EarlyVllm:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self

    def close(self) -> None:
        self.thread.join()
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


early: EarlyVllm | None = None


def launch_early() -> None:
    """Build the tiny model and launch vLLM now, in the background (once per session)."""
    global early
    if early is None and HAVE_VLLM:
        early = EarlyVllm()
        early.thread.start()


def close_early() -> None:
    if early is not None:
        early.close()
