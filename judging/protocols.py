"""Named evaluation protocols: which judge, with which prompts, evidence, parser and decoding.

Published web-agent success rates come from different judges, and a number means little
without the protocol that produced it. A protocol here fixes everything that decides a
verdict except the judge model (a run-time choice, recorded on every judgment): the registered
judge, its options (which screenshots, how many, what else the call sees, the reply budget;
decoding is greedy in every judge that prompts a model), the judge's prompt templates (their
hash) and its version (bumped when its parser or rule changes). Its :attr:`EvalProtocol.hash`
covers all of these, so a changed prompt or option is a new protocol version: judgments record
the hash they were made under (it is part of their key), and ``webloop judge --protocol NAME``
judges again what an earlier version judged.

The shipped protocols, all webloop's own prompts:

=============  ===============  ==================================================================
name           judge            follows
=============  ===============  ==================================================================
checkers       programmatic     the benchmark's own functional checks of the final state
                                (WebArena, WebShop, MiniWoB++): bundled sites only
outcome        outcome_vlm      Pan et al. 2024, "Autonomous Evaluation and Refinement of Digital
                                Agents": one call on the instruction, the actions and the final
                                screenshot
webvoyager     outcome_vlm      He et al. 2024, "WebVoyager": one call on the task, the agent's
                                answer and its last 3 screenshots (no action history)
webjudge       rubric_vlm       Xue et al. 2025, "An Illusion of Progress? Assessing the Current
                                State of Web Agents" (Online-Mind2Web's WebJudge): key points →
                                key screenshots rated for relevance → verdict
=============  ===============  ==================================================================

A user's module adds one with :func:`register_protocol` (loaded by ``WEBLOOP_PLUGINS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from judging import outcome_vlm, programmatic, rubric_vlm  # noqa: F401 (register the judges)
from judging.base import SPECS
from warehouse.ids import stable_hash
from warehouse.registry import check_options

PROTOCOL_FORMAT = "1"
"""Version of what a protocol's hash covers (bump if the hashed fields change)."""


@dataclass(frozen=True)
class EvalProtocol:
    """A named way of deciding success: ``judge`` (a registered judge) with ``options`` fixed
    (all but the endpoint: base URL and model come at run time), ``follows`` (the published
    protocol it follows) and a one-line ``summary``."""

    name: str
    judge: str
    options: Mapping[str, Any] = field(default_factory=dict)
    follows: str = ""
    summary: str = ""

    @property
    def prompts(self) -> str | None:
        """The judge's prompt templates' hash (None: it prompts no model)."""
        spec = SPECS.get(self.judge)
        return spec.prompts if spec else None

    @property
    def needs(self) -> frozenset[str]:
        spec = SPECS.get(self.judge)
        return spec.needs if spec else frozenset()

    @property
    def hash(self) -> str:
        """Stable over runs and machines: the judge (its class and version), its options and
        its prompts' hash, not the protocol's name."""
        spec = SPECS.get(self.judge)
        source = f"{spec.factory.__module__}.{spec.factory.__qualname__}" if spec else None
        body = {
            "format": PROTOCOL_FORMAT,
            "judge": self.judge,
            "source": source,
            "version": spec.version if spec else None,
            "options": dict(sorted(self.options.items())),
            "prompts": self.prompts,
        }
        return stable_hash(body, length=16)

    def describe(self) -> dict[str, Any]:
        """What the ``protocols`` listing and the docs show."""
        return {
            "name": self.name,
            "hash": self.hash,
            "judge": self.judge,
            "options": dict(self.options),
            "prompts": self.prompts,
            "needs": sorted(self.needs),
            "follows": self.follows,
            "summary": self.summary,
        }


PROTOCOLS: dict[str, EvalProtocol] = {}
"""Protocol name → its spec (filled by :func:`register_protocol`)."""

RESERVED = frozenset({"human"})


def register_protocol(p: EvalProtocol) -> EvalProtocol:
    """Register ``p`` by name; the same name with another definition is refused (an import
    would otherwise change a protocol silently), as is a judge that is not registered, and the
    name ``human`` (the human labels' place in a comparison)."""
    if p.name in RESERVED:
        raise ValueError(f"protocol name {p.name!r} is reserved (the human labels)")
    if p.judge not in SPECS:
        raise ValueError(f"protocol {p.name!r}: unknown judge {p.judge!r}; known: {sorted(SPECS)}")
    check_options(f"protocol {p.name!r}: judge", p.judge, p.options, SPECS[p.judge].parameters)
    old = PROTOCOLS.get(p.name)
    if old is not None and old != p:
        raise ValueError(f"protocol {p.name!r} is registered already, with another definition")
    PROTOCOLS[p.name] = p
    return p


def get_protocol(name: str) -> EvalProtocol:
    """The protocol ``name``; ValueError naming the known ones."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown evaluation protocol {name!r}; known: {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


register_protocol(
    EvalProtocol(
        "checkers",
        "programmatic",
        follows="the benchmark's own functional checks of the final state (WebArena, WebShop, "
        "MiniWoB++)",
        summary="The bundled sites' checkers on the final server state and the answer.",
    )
)
register_protocol(
    EvalProtocol(
        "outcome",
        "outcome_vlm",
        {"last_k": 1, "history": True, "max_tokens": 512},
        follows='Pan et al. 2024, "Autonomous Evaluation and Refinement of Digital Agents" '
        "(the end-to-end VLM evaluator)",
        summary="One call: the instruction, the action history, the answer, the final page.",
    )
)
register_protocol(
    EvalProtocol(
        "webvoyager",
        "outcome_vlm",
        {"last_k": 3, "history": False, "max_tokens": 512},
        follows='He et al. 2024, "WebVoyager: Building an End-to-End Web Agent with Large '
        'Multimodal Models" (its auto-evaluation)',
        summary="One call: the task, the answer and the last 3 screenshots (no actions).",
    )
)
register_protocol(
    EvalProtocol(
        "webjudge",
        "rubric_vlm",
        {"selection": "model", "k": 4, "max_tokens": 512},
        follows='Xue et al. 2025, "An Illusion of Progress? Assessing the Current State of Web '
        "Agents\" (Online-Mind2Web's WebJudge)",
        summary="Key points, then key screenshots rated for relevance, then one verdict call.",
    )
)
