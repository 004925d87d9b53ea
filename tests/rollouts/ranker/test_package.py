"""The ranker package keeps the names callers import from ``rollouts.ranker`` (training, the
flows, scripts, benchmarks), and importing it registers the policy without importing torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import rollouts.ranker as ranker

MODULES = ("prompt", "tree", "values", "features", "candidate", "encoding", "model", "policy")


def test_every_public_name_is_the_object_of_its_module() -> None:
    homes = {}
    for name in MODULES:
        module = importlib.import_module(f"rollouts.ranker.{name}")
        homes.update({k: getattr(module, k) for k in vars(module) if not k.startswith("_")})
    for name in ranker.__all__:
        if name != "RankerModel":
            assert getattr(ranker, name) is homes[name], name
    assert callable(ranker.candidates)  # the function, not the module of that theme


def test_importing_the_package_registers_the_policy_and_leaves_torch_out() -> None:
    code = (
        "import sys\n"
        "from rollouts.policies import POLICIES\n"
        "import rollouts.ranker\n"
        "assert 'ranker' in POLICIES.names(), POLICIES.names()\n"
        "assert 'torch' not in sys.modules, 'importing rollouts.ranker imported torch'\n"
        "from rollouts.ranker import RankerModel\n"
        "assert RankerModel.__module__ == 'rollouts.ranker'\n"
        "assert RankerModel is rollouts.ranker.model.ranker_model_class()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
