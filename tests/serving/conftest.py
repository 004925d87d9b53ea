"""Model servers for the serving tests, one per engine for the whole session (vLLM takes
30-70 s to start here): both serve the same tiny Idefics3 under the name ``tiny-idefics``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.serving import ModelServer, ServerSpec, free_port
from tests.serving.vllm_tier import HAVE_VLLM, SKIP_REASON

NAME = "tiny-idefics"


@pytest.fixture(scope="session")
def idefics(tmp_path_factory) -> Path:
    """The tiny Idefics3 preset, built offline once per session."""
    from training.models import build_tiny_idefics

    return build_tiny_idefics(tmp_path_factory.mktemp("idefics") / NAME)


def _serve(engine: str, model: Path, logs: Path) -> Iterator[ModelServer]:
    # eager vLLM: torch.compile of a tiny model only costs start-up time
    spec = ServerSpec(engine, str(model), port=free_port(), name=NAME, enforce_eager=True)
    server = ModelServer(spec, log=logs / f"{engine}.log")
    server.start(timeout_s=1800)  # a deadline for (very) loaded machines
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hf_server(idefics: Path, tmp_path_factory) -> Iterator[ModelServer]:
    """``serve-model --engine hf`` with the tiny Idefics3."""
    yield from _serve("hf", idefics, tmp_path_factory.mktemp("hf-logs"))


@pytest.fixture(scope="session")
def vllm_server(idefics: Path, tmp_path_factory) -> Iterator[ModelServer]:
    """vLLM with the tiny Idefics3 (skipped without ``.venv-vllm``)."""
    if not HAVE_VLLM:
        pytest.skip(SKIP_REASON)
    yield from _serve("vllm", idefics, tmp_path_factory.mktemp("vllm-logs"))


@pytest.fixture
def server_of(request) -> ModelServer:
    """The server of the engine named by the test's ``engine`` parameter."""
    engine = request.node.callspec.params["engine"]
    return request.getfixturevalue(f"{engine}_server")
