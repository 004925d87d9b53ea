"""The scorer: :class:`RankerModel`, an MLP over encoder vectors and features, and its tensors.

The class is a ``torch.nn.Module``, so it is defined on first use (:func:`ranker_model_class`):
importing the ranker (the policy registry, the CLI's ``--policy`` check) does not import torch.
:func:`batch_tensors` stacks encoded prompts into one batch; :func:`segment_log_softmax` is the
log-softmax over each prompt's candidates within it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rollouts.encoder import DIM, MODEL_NAME
from rollouts.ranker.encoding import Encoded
from rollouts.ranker.features import FEATURE_VERSION, FEATURES, N_FEATURES

MODEL_TYPE = "webloop-ranker"


@lru_cache(maxsize=1)
def ranker_model_class() -> type:
    """The :class:`RankerModel` class (a ``torch.nn.Module``), defined once, on first use."""
    import torch

    class RankerModel(torch.nn.Module):
        """The scorer over frozen MiniLM vectors and exact-match features.

        ``q``/``p``/``h``: the instruction, page and last-action vectors; ``e``/``v``: the
        candidate's element and value vectors (384 wide). Context vectors go through a learnt
        projection ``Wc`` and candidate vectors through ``Wk`` (``proj`` wide), so the products
        ``q'·e'``, ``q'·v'``, ``e'·v'``, ``h'·e'``, ``p'·e'`` are learnt bilinear interactions;
        the raw cosine similarities of those pairs and the features join them in an MLP → one
        score.

        A HF-like folder: :meth:`save_pretrained` writes ``config.json`` (``model_type``
        ``webloop-ranker``, the encoder's name, the feature set and its version) and
        ``model.safetensors``; :meth:`from_pretrained` reads it back."""

        PAIRS = ((0, 3), (0, 4), (3, 4), (2, 3), (1, 3))  # (q,e) (q,v) (e,v) (h,e) (p,e)

        def __init__(
            self,
            hidden: int = 256,
            dim: int = DIM,
            n_features: int = N_FEATURES,
            dropout: float = 0.1,
            seed: int = 0,
            proj: int = 128,
        ) -> None:
            super().__init__()
            self.config = {
                "model_type": MODEL_TYPE,
                "encoder": MODEL_NAME,
                "feature_version": FEATURE_VERSION,
                "features": list(FEATURES),
                "hidden": hidden,
                "dim": dim,
                "n_features": n_features,
                "dropout": dropout,
                "seed": seed,
                "proj": proj,
            }
            gen = torch.Generator().manual_seed(seed)
            self.ctx_proj = torch.nn.Linear(dim, proj)
            self.cand_proj = torch.nn.Linear(dim, proj)
            n_in = 5 * proj + len(self.PAIRS) * (proj + 1) + n_features
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(n_in, hidden),
                torch.nn.GELU(),
                torch.nn.Dropout(dropout),
                torch.nn.Linear(hidden, hidden),
                torch.nn.GELU(),
                torch.nn.Linear(hidden, 1),
            )
            with torch.no_grad():
                for p in self.parameters():
                    if p.dim() == 2:
                        bound = 1 / math.sqrt(p.shape[1])
                        p.copy_(torch.empty_like(p).uniform_(-bound, bound, generator=gen))
                    else:
                        p.zero_()

        def forward(self, ctx: Any, elem: Any, value: Any, features: Any, seg: Any) -> Any:
            """Scores ``[N]`` of ``N`` candidates; ``ctx [B, 3, D]``, ``elem``/``value [N, D]``,
            ``features [N, F]``, ``seg [N]``: each candidate's prompt index in the batch."""
            raw = [ctx[seg, 0], ctx[seg, 1], ctx[seg, 2], elem, value]
            c = self.ctx_proj(ctx)
            vecs = [c[seg, 0], c[seg, 1], c[seg, 2], self.cand_proj(elem), self.cand_proj(value)]
            parts = list(vecs)
            for i, j in self.PAIRS:
                parts.append(vecs[i] * vecs[j])
                parts.append((raw[i] * raw[j]).sum(-1, keepdim=True))
            parts.append(features)
            return self.mlp(torch.cat(parts, dim=-1)).squeeze(-1)

        def save_pretrained(self, path: str | Path) -> None:
            from safetensors.torch import save_file

            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
            state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
            save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

        @classmethod
        def from_pretrained(cls, path: str | Path) -> Any:
            from safetensors.torch import load_file

            folder = Path(path)
            cfg_file = folder / "config.json"
            if not cfg_file.exists():
                raise FileNotFoundError(f"{folder}: no config.json (not a ranker checkpoint)")
            cfg = json.loads(cfg_file.read_text())
            if cfg.get("model_type") != MODEL_TYPE:
                raise ValueError(
                    f"{cfg_file}: model_type is {cfg.get('model_type')!r}, not {MODEL_TYPE!r}"
                )
            version, features = cfg.get("feature_version"), cfg.get("features")
            if version != FEATURE_VERSION or features != list(FEATURES):
                raise ValueError(
                    f"{cfg_file}: feature set version {cfg.get('feature_version')} does not match "
                    f"this code's {FEATURE_VERSION}: retrain the ranker"
                )
            if cfg.get("encoder") != MODEL_NAME:
                raise ValueError(
                    f"{cfg_file}: encoder {cfg.get('encoder')!r} is not {MODEL_NAME!r}"
                )
            keys = ("hidden", "dim", "n_features", "dropout", "seed", "proj")
            model = cls(*(cfg[k] for k in keys))
            model.load_state_dict(load_file(str(folder / "model.safetensors")))
            return model.eval()

    RankerModel.__qualname__ = "RankerModel"
    RankerModel.__module__ = "rollouts.ranker"  # where it is imported from (the lazy attribute)
    return RankerModel


def batch_tensors(items: Sequence[Encoded]) -> tuple[Any, ...]:
    """``(ctx, elem, value, features, seg)`` tensors of a batch of encoded prompts."""
    import torch

    ctx = torch.from_numpy(np.stack([e.ctx for e in items]))
    elem = torch.from_numpy(np.concatenate([e.elem for e in items]))
    value = torch.from_numpy(np.concatenate([e.value for e in items]))
    feats = torch.from_numpy(np.concatenate([e.features for e in items]))
    seg = torch.cat(
        [torch.full((len(e.candidates),), i, dtype=torch.long) for i, e in enumerate(items)]
    )
    return ctx, elem, value, feats, seg


def segment_log_softmax(scores: Any, seg: Any, n: int) -> Any:
    """Log-softmax of ``scores [N]`` within each segment (``seg [N]`` in ``0..n-1``)."""
    import torch

    big = torch.full((n,), -torch.inf, dtype=scores.dtype)
    mx = big.scatter_reduce(0, seg, scores, reduce="amax", include_self=True).detach()
    ex = torch.exp(scores - mx[seg])
    tot = torch.zeros(n, dtype=scores.dtype).index_add(0, seg, ex)
    return scores - mx[seg] - torch.log(tot)[seg]
