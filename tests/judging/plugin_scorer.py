"""A user's own PRM scorer, in its own module: imported through ``WEBLOOP_PLUGINS`` (or
:func:`stages.plugins.load_plugins`), the score-steps stage runs it by name."""

from __future__ import annotations

from collections.abc import Sequence

from judging.prm import Proposal, ScoreResult, State, register


@register("brevity")
class BrevityScorer:
    """Prefers short actions: 1 / (1 + the action text's length); an unparsed output scores 0.

    Needs nothing (no browser, no labels, no endpoint): ``@register("brevity")``."""

    name, version = "brevity", "1"

    async def score(self, state: State, cands: Sequence[Proposal]) -> list[ScoreResult]:
        return [
            ScoreResult(1.0 / (1 + len(c.action_text)) if c.action_text else 0.0) for c in cands
        ]
