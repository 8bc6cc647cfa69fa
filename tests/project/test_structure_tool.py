"""tools/structure.py, whose numbers docs/DESIGN.md quotes: floors and loops on graphs checked by
eye, and this checkout's engine without loops."""

from __future__ import annotations

from pathlib import Path

from tools import structure

ROOT = Path(__file__).resolve().parents[2]


def test_floors_and_loops_on_small_graphs():
    chain = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert structure.floors(chain) == 3 and structure.loops(chain) == []
    looped = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": {"a"}}  # b <-> c is one floor
    assert structure.loops(looped) == [{"b", "c"}]
    assert structure.floors(looped) == 3
    rooms = structure.rooms({"p.x.a": {"p.y.b"}, "p.y.b": set(), "p.top": {"p.x.a", "p"}}, "p")
    assert rooms == {"x": {"y"}, "y": set(), "top": {"x"}}


def test_this_checkout_measured():
    facts = structure.facts(ROOT)
    assert facts["engine import loops"] == 0
    assert facts["modules flat at the top of gnq_core"] <= 8
    assert facts["engine files flat in its folder"] == 3  # __init__, auditor, selfcheck
