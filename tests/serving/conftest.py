"""Model servers for the serving tests, one per engine for the whole session (vLLM takes
30-70 s to start here): both serve the same tiny Idefics3 under the name ``tiny-idefics``.

vLLM is launched when collection finds a ``vllm`` test (``vllm_tier.launch_early``, called by
``tests/conftest.py``), so it loads on the core the rest of the suite leaves idle; its fixture
then only waits for it to be healthy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.supervisor import ModelServer
from tests.serving import vllm_tier
from tests.serving.vllm_tier import HAVE_VLLM, NAME, SKIP_REASON, spec_of


@pytest.fixture(scope="session")
def idefics(tmp_path_factory) -> Path:
    """The tiny Idefics3 preset, built offline once per session (by the early vLLM launch when
    there is one)."""
    if vllm_tier.early is not None:
        return vllm_tier.early.wait().model  # type: ignore[return-value]
    from training.models import build_tiny_idefics

    return build_tiny_idefics(tmp_path_factory.mktemp("idefics") / NAME)


def _serve(engine: str, model: Path, logs: Path) -> Iterator[ModelServer]:
    server = ModelServer(spec_of(engine, model), log=logs / f"{engine}.log")
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
    if vllm_tier.early is None:
        yield from _serve("vllm", idefics, tmp_path_factory.mktemp("vllm-logs"))
        return
    server = vllm_tier.early.wait().server
    assert server is not None
    server.ready(timeout_s=1800)  # a deadline for (very) loaded machines
    yield server  # stopped at the end of the session (close_vllm_early)


@pytest.fixture
def server_of(request) -> ModelServer:
    """The server of the engine named by the test's ``engine`` parameter."""
    engine = request.node.callspec.params["engine"]
    return request.getfixturevalue(f"{engine}_server")
