"""What admission reserves for a request without max_tokens: the room of the slot its prompt would run in."""

from __future__ import annotations

from tokenrelay.backends.base import ModelCard


def test_a_short_prompt_is_bounded_by_a_short_slot_and_a_long_one_by_the_models_context() -> None:
    engine = ModelCard("m", "tokenrelay", 0, context_length=32768, slot_contexts=(1024, 32768))
    assert engine.room_for(100) == 1024  # it fills at most half a short slot: it runs there
    assert engine.room_for(600) == 32768
    assert engine.room_for(40000) == 32768  # held by no slot: refused by the engine, bounded by the context


def test_a_node_is_bounded_by_its_context() -> None:
    assert ModelCard("n", "node", 0, context_length=8192).room_for(100) == 8192
    assert ModelCard("n", "node", 0).room_for(100) is None  # unknown: the operator's default applies
