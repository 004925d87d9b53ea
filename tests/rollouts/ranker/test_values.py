"""Values drawn from the instruction (:mod:`rollouts.ranker.values`)."""

from __future__ import annotations

from rollouts.ranker.values import instruction_values
from tests.rollouts.ranker.fixture import INSTRUCTION


def test_instruction_values_cover_the_kinds_of_typed_text() -> None:
    values = instruction_values(INSTRUCTION)
    for v in ("window please", "ada.hopper@example.net", "2026-06-17", "Mias", "Mia", "Vid",
              "Ada Hopper", "Ada", "Hopper", "2"):  # fmt: skip
        assert v in values, v
    assert "Book" not in [v for v in values if v.lower() == "book the"]
    mail = (
        'Reply to the email "Budget review #31" from Ken Torvalds with the message: See you then.'
    )
    assert {"Budget review #31", "See you then.", "See you then", "Ken Torvalds"} <= set(
        instruction_values(mail)
    )
