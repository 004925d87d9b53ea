"""A browser-free environment with :class:`~rollouts.env.BrowserEnv`'s interface, for measuring
the engine's scheduler alone (``Engine(..., env_factory=lambda: SimEnv(...))``).

``reset`` and ``step`` take a sampled browser time (``asyncio.sleep``) and return a fixed
observation (a small PNG, a short accessibility tree with refs); ``answer(...)`` terminates, the
step budget truncates, every other action succeeds. Times are drawn from a seeded RNG keyed by
(seed, start URL, step index), so two runs of the same episode, in any order and by any loop
(the engine or a lock-step baseline), see the same browser times.
"""

from __future__ import annotations

import asyncio
import io
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from rollouts.actions import Action, Answer
from rollouts.env import Observation
from warehouse.ids import stable_hash

Sampler = Callable[[random.Random], float]

A11Y = """- banner:
  - link "Home" [ref=e1]
- main:
  - heading "Simulated page" [level=1]
  - textbox "Search" [ref=e2]
  - button "Go" [ref=e3]
  - link "Next" [ref=e4]"""


def lognormal(median_s: float, sigma: float) -> Sampler:
    """Log-normal times with this median and sigma."""
    mu = math.log(median_s)
    return lambda rng: rng.lognormvariate(mu, sigma)


def empirical(values: Sequence[float]) -> Sampler:
    """Times drawn (with replacement) from measured ``values``."""
    pool = sorted(float(v) for v in values)
    if not pool:
        raise ValueError("empirical() needs at least one measured value")
    return lambda rng: rng.choice(pool)


def _png(seed: int = 0, w: int = 160, h: int = 100) -> bytes:
    from PIL import Image

    rng = random.Random(seed)
    img = Image.frombytes("RGB", (w, h), bytes(rng.randrange(256) for _ in range(w * h * 3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


_SHOT: bytes | None = None


class SimEnv:
    """``reset``/``step``/``observe``/``close``/``cookies`` like BrowserEnv; no browser."""

    def __init__(
        self,
        step_s: Sampler | None = None,
        reset_s: Sampler | None = None,
        seed: int = 0,
    ) -> None:
        global _SHOT
        if _SHOT is None:
            _SHOT = _png()
        self.step_s = step_s or lognormal(0.1, 0.3)
        self.reset_s = reset_s or lognormal(0.3, 0.2)
        self.seed = seed
        self.url = ""
        self.step_idx = 0
        self.max_steps = 0
        self.resets = self.steps = 0

    def _rng(self, k: int) -> random.Random:
        return random.Random(stable_hash(self.seed, self.url, k))

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        del seed
        opts = options or {}
        self.url, self.step_idx = opts["start_url"], 0
        self.max_steps = opts.get("max_steps", 30)
        self.resets += 1
        await asyncio.sleep(self.reset_s(self._rng(-1)))
        return await self.observe(), {"start_url": self.url}

    async def step(self, action: Action) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if not self.url:
            raise RuntimeError("step() before reset()")
        await asyncio.sleep(self.step_s(self._rng(self.step_idx)))
        self.step_idx += 1
        self.steps += 1
        terminated = isinstance(action, Answer)
        truncated = not terminated and self.step_idx >= self.max_steps
        info = {
            "error": None,
            "answer": action.text if terminated else None,
            "blocked": [],
        }
        return await self.observe(), 0.0, terminated, truncated, info

    async def observe(self) -> Observation:
        assert _SHOT is not None
        return Observation(self.step_idx, self.url, "Simulated page", _SHOT, A11Y)

    async def cookies(self, url: str) -> list[dict[str, Any]]:
        return []

    async def close(self) -> None:
        return None
