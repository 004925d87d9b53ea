"""How :func:`training.trainer.fit` runs on one process or many: accelerate's ``Accelerator``.

One process (``WORLD_SIZE`` unset or 1) is accelerate's plain mode: the loop is the single-process
loop, with accelerate's autocast for mixed precision. Under a launcher (webloop's own,
:mod:`training.launch`, or ``torchrun`` / ``accelerate launch`` of its worker) every process is
a rank of one process group (gloo on CPUs, NCCL on GPUs) and the module is wrapped:

* ``ddp``: accelerate's ``DistributedDataParallel`` (every rank holds the whole model, gradients
  are averaged);
* ``fsdp``: parameters, gradients and optimizer state sharded across ranks with PyTorch's FSDP2
  (``fully_shard``): accelerate's FSDP plugin (``fsdp_version=2``) on GPUs; on CPUs, where
  accelerate 1.15 runs only DDP, the same ``fully_shard`` call applied here (each block listed
  in the model's ``_no_split_modules``, then the root), as accelerate's plugin does on GPUs.

Checkpoints are rank-independent: the module's full state dict (gathered from the shards) and the
optimizer state in the single-process format (``torch.optim.Optimizer.state_dict()``: integer
parameter ids in parameter order), so a run written by N processes resumes on M.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Strategy = Literal["ddp", "fsdp"]
Precision = Literal["no", "bf16", "fp16"]


@dataclass(frozen=True)
class ParallelConfig:
    """How a fit runs (not what it computes: none of this enters a run's fingerprint).

    ``grad_accum``: micro-batches each rank splits its share of a step's batch into (gradient
    accumulation; the step's gradient is the same, memory is lower)."""

    strategy: Strategy = field(default="ddp", metadata={"help": "ddp or fsdp (many processes)."})
    mixed_precision: Precision = field(default="no", metadata={"help": "no, bf16 or fp16."})
    grad_accum: int = field(default=1, metadata={"help": "Micro-batches per rank per step."})

    def __post_init__(self) -> None:
        if self.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {self.strategy!r}")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise ValueError(
                f"mixed_precision must be 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}"
            )
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ValueError(f"grad_accum must be an integer >= 1, got {self.grad_accum!r}")


def world_size() -> int:
    """The number of ranks a launcher started (1 outside one)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


class Engine:
    """One fit's accelerate state: rank, world size, the wrapped module, collectives."""

    def __init__(self, pc: ParallelConfig) -> None:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin

        self.pc = pc
        if world_size() == 1:
            # accelerate keeps one state per process; fits in one process (RL's iterations, a
            # test session) may each ask for another precision
            AcceleratorState._reset_state(reset_partial_state=True)
        kwargs: dict[str, Any] = {
            "mixed_precision": pc.mixed_precision,
            "cpu": not torch.cuda.is_available(),
            # a VLM trained on text-only turns leaves its vision tower without gradients
            "kwargs_handlers": [DistributedDataParallelKwargs(find_unused_parameters=True)],
        }
        on_gpu = torch.cuda.is_available() and world_size() > 1
        if pc.strategy == "fsdp" and on_gpu:
            kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
                fsdp_version=2, state_dict_type="FULL_STATE_DICT"
            )
        self.acc = Accelerator(**kwargs)
        self.rank = self.acc.process_index
        self.world = self.acc.num_processes
        self.is_main = self.acc.is_main_process
        self.device = self.acc.device
        self.fsdp = pc.strategy == "fsdp" and self.world > 1
        self._own_fsdp = self.fsdp and not on_gpu
        self.wrapped: Any = None
        self.plain: Any = None
        self._accelerated = False

    # -- wrapping ---------------------------------------------------------------------------

    def prepare(self, model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """Wrap ``model.module`` for this run (in place: ``model.module`` becomes the wrapped
        module) and return its AdamW optimizer over the trainable parameters."""
        self.plain = model.module
        if self.fsdp and (model.kind != "vlm" or getattr(model, "lora", None)):
            raise ValueError(
                "strategy fsdp shards a full Hugging Face VLM; LoRA and the ranker train with ddp"
            )
        if self._own_fsdp:
            _fully_shard(model.module, self.world)
            opt = _adamw(model, lr, weight_decay)
            self.wrapped = model.module
            return opt
        opt = _adamw(model, lr, weight_decay)
        if self.world == 1 and self.pc.mixed_precision == "no":
            self.wrapped = model.module  # nothing to wrap: the plain loop
            return opt
        self.wrapped, opt = self.acc.prepare(model.module, opt)
        self._accelerated = True
        model.module = self.wrapped
        return opt

    def describe(self) -> dict[str, Any]:
        """The run's layout for its checkpoints: strategy, world size, precision, and the share
        of the module's parameters this rank holds (1.0 unless sharded)."""
        local = total = 0
        for p in self.plain.parameters():
            total += p.numel()
            to_local = getattr(p, "to_local", None)
            local += to_local().numel() if callable(to_local) else p.numel()
        return {
            "strategy": self.pc.strategy if self.world > 1 else "single",
            "world_size": self.world,
            "mixed_precision": self.pc.mixed_precision,
            "grad_accum": self.pc.grad_accum,
            "rank0_param_share": local / max(total, 1),
        }

    def trainable_names(self) -> list[str]:
        """Names of the trainable parameters in optimizer order (the unwrapped module's)."""
        return [n for n, p in self.plain.named_parameters() if p.requires_grad]

    @contextlib.contextmanager
    def unwrapped(self, model: Any) -> Iterator[None]:
        """``model.module`` is the plain module inside (to save it); the wrapped one after."""
        model.module = self.plain
        try:
            yield
        finally:
            model.module = self.wrapped

    # -- a step ---------------------------------------------------------------------------------

    def autocast(self) -> Any:
        return self.acc.autocast() if self.pc.mixed_precision != "no" else contextlib.nullcontext()

    def no_sync(self, last: bool) -> Any:
        """The context of a micro-batch's backward: no gradient all-reduce before the last."""
        if last or self.world == 1:
            return contextlib.nullcontext()
        if self.fsdp:
            return _fsdp_sync(self.wrapped, False)
        return self.acc.no_sync(self.wrapped)

    def backward(self, loss: torch.Tensor) -> None:
        if self._accelerated:
            self.acc.backward(loss)  # (fp16: through its gradient scaler)
        else:
            loss.backward()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (every rank gets it)."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def clip(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the global gradient norm; the norm before clipping."""
        if self._accelerated:
            norm = self.acc.clip_grad_norm_(params, max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)
        return float(full() if callable(full) else norm)

    def barrier(self) -> None:
        if self.world > 1:
            self.acc.wait_for_everyone()

    # -- state ----------------------------------------------------------------------------------

    def module_state(self) -> dict[str, torch.Tensor]:
        """The full module state dict on CPU (a collective under fsdp: every rank calls it;
        rank 0 gets the tensors)."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_model_state_dict(self.wrapped, options=opts)
        return {k: v.detach().cpu() for k, v in self.plain.state_dict().items()}

    def optimizer_state(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer state in the single-process format (collective under fsdp)."""
        if not self.fsdp:
            return _inner(opt).state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        by_name = get_optimizer_state_dict(self.wrapped, _inner(opt), options=opts)
        return by_index(by_name, self.trainable_names()) if self.is_main else {}

    def load_optimizer_state(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Restore a single-process-format optimizer state (from any number of ranks)."""
        if not self.fsdp:
            _inner(opt).load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        by_name = by_param_name(state, self.trainable_names())
        opts = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.wrapped, _inner(opt), by_name, options=opts)


def _inner(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper (itself when not wrapped)."""
    return getattr(opt, "optimizer", opt)


def _adamw(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _fully_shard(module: torch.nn.Module, world: int) -> None:
    """FSDP2 over ``world`` CPU ranks: each ``_no_split_modules`` block, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    blocks = set(getattr(module, "_no_split_modules", None) or ())
    for sub in list(module.modules())[1:]:
        if type(sub).__name__ in blocks:
            fully_shard(sub, mesh=mesh)
    fully_shard(module, mesh=mesh)


@contextlib.contextmanager
def _fsdp_sync(module: Any, sync: bool) -> Iterator[None]:
    module.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (torch.distributed.checkpoint's) in the
    single-process format (integer ids in the order of ``names``)."""
    index = {n: i for i, n in enumerate(names)}
    groups = [
        {**g, "params": [index[n] for n in g["params"]]} for g in state.get("param_groups", [])
    ]
    per = {index[n]: s for n, s in state.get("state", {}).items()}
    return {"state": per, "param_groups": groups}


def by_param_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`by_index`."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
