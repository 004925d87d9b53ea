"""The ``vllm`` test tier: tests marked ``vllm`` need the vLLM environment (``make vllm``) and
are skipped with this reason when it is not built."""

from __future__ import annotations

import pytest

from flows.serving import vllm_python

HAVE_VLLM = vllm_python() is not None
SKIP_REASON = "the vllm tier needs .venv-vllm: run `make vllm` (CI does) to run these tests"
requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)
# the marks of a vllm-tier test; its own timeout, as its first test also starts vLLM (30-70 s
# here, many minutes on a machine loaded by other jobs)
VLLM = [pytest.mark.vllm, requires_vllm, pytest.mark.timeout(2400)]
