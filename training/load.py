"""Which model path a model name or folder is, how to load it for training, and which rollout
policy runs it.

Model names: ``ranker`` (a new, seeded, untrained candidate ranker), ``tiny`` (the offline tiny
Qwen2-VL of :mod:`training.models`, built once under ``$WEBLOOP_HOME/models/tiny-vlm``), or a
folder: a ranker checkpoint (``config.json`` with ``"model_type": "webloop-ranker"``) or any
Hugging Face VLM folder (or hub id, with network).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.interface import DataMismatch, TrainablePolicy
from warehouse.store import Warehouse

RANKER_TYPE = "webloop-ranker"
POLICY_OF = {"ranker": "ranker", "vlm": "hf"}  # model path → the rollout policy that runs it


def model_kind(path: str | Path) -> str:
    """``ranker`` or ``vlm`` for a checkpoint folder (a hub id is a VLM)."""
    cfg = Path(path) / "config.json"
    if cfg.exists():
        try:
            if json.loads(cfg.read_text()).get("model_type") == RANKER_TYPE:
                return "ranker"
        except (OSError, json.JSONDecodeError) as exc:
            raise DataMismatch(f"{cfg}: not a readable model config ({exc})") from exc
    elif Path(path).exists():
        raise DataMismatch(f"{path}: no config.json — not a model checkpoint folder")
    return "vlm"


def tiny_vlm_path(home: Path) -> Path:
    """The offline tiny VLM, built on first use (seed 0, so every build is the same model)."""
    from training.models import build_tiny_vlm

    out = home / "models" / "tiny-vlm"
    if not (out / "config.json").exists():
        tmp = out.with_name(".tmp-tiny-vlm")
        build_tiny_vlm(tmp)
        tmp.rename(out)
    return out


def load_trainable(
    model: str, *, home: Path, seed: int = 0, vlm: dict[str, Any] | None = None
) -> TrainablePolicy:
    """A trainable model for a model name or folder (see the module docstring)."""
    if model == "ranker":
        from training.ranker import RankerTrainable

        return RankerTrainable.new(seed=seed)
    path = tiny_vlm_path(home) if model == "tiny" else Path(model)
    if model_kind(path) == "ranker":
        from training.ranker import RankerTrainable

        return RankerTrainable.load(path)
    from training.vlm import VLMTrainable

    return VLMTrainable.load(str(path), **(vlm or {}))


@dataclass(frozen=True)
class ResolvedPolicy:
    """A rollout policy for a checkpoint: the policy name, the ``--model`` collect gets, the
    prompt mode, and the checkpoint's id when it is registered."""

    policy: str
    model: str | None
    prompt_mode: str
    checkpoint_id: str | None


def resolve_policy(
    wh: Warehouse,
    policy: str,
    checkpoint: str | None,
    model: str | None = None,
    prompt_mode: str | None = None,
) -> ResolvedPolicy:
    """Resolve ``--policy/--checkpoint``: a registered checkpoint (id, training run id, folder)
    or an unregistered folder; the checkpoint's kind must be the policy's."""
    from training.registry import find_checkpoint

    if checkpoint is None:
        if policy in POLICY_OF.values() and not model:
            raise DataMismatch(f"--policy {policy} needs --checkpoint (a checkpoint id or folder)")
        mode = prompt_mode or ("a11y" if policy == "ranker" else "both")
        return ResolvedPolicy(policy, model, mode, None)
    row = find_checkpoint(wh, checkpoint)
    if row is not None:
        path, cid = row["path"], row["checkpoint_id"]
    elif Path(checkpoint).is_dir():
        path, cid = str(Path(checkpoint).resolve()), None
    else:
        raise DataMismatch(
            f"no checkpoint {checkpoint!r}: not a registered checkpoint or training run id, "
            "and not a folder (list them: webloop checkpoints list)"
        )
    expected = POLICY_OF[model_kind(path)]
    if policy != expected:
        raise DataMismatch(
            f"checkpoint {checkpoint} is a {model_kind(path)} model: run it with --policy "
            f"{expected}, not {policy}"
        )
    mode = prompt_mode or ("a11y" if expected == "ranker" else "both")
    return ResolvedPolicy(expected, path, mode, cid)


@dataclass(frozen=True)
class ModelSpec:
    """How each rank loads the model: :func:`training.load.load_trainable`'s arguments."""

    ref: str
    home: str
    seed: int = 0
    vlm: dict[str, Any] = field(default_factory=dict)

    def load(self) -> TrainablePolicy:
        return load_trainable(self.ref, home=Path(self.home), seed=self.seed, vlm=self.vlm)
