"""The guest soak (`make soak-guest`) has one node, in one RDMA netns mode: it plays the
seed's schedule but for the other node's actions."""

from __future__ import annotations

from tests.soak.runner import on_nodes
from tests.soak.schedule import NODES, generate


def test_one_node_plays_its_own_actions_and_every_action_that_names_no_node() -> None:
    schedule = generate(29, 120)
    played = on_nodes(list(schedule.actions), ["shared"])
    left_out = [a for a in schedule.actions if a not in played]
    assert left_out, "the exclusive node's actions exist, to be left out"
    assert all(a.args["node"] == "exclusive" for a in left_out)
    assert all(a.args.get("node", "shared") == "shared" for a in played)


def test_both_nodes_play_the_whole_schedule() -> None:
    schedule = generate(29, 120)
    assert on_nodes(list(schedule.actions), NODES) == list(schedule.actions)
