"""The soak's schedule is a function of its seed, so a printed seed replays a run."""

from __future__ import annotations

from tests.soak.schedule import generate


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert generate(1234, 120).dump() == generate(1234, 120).dump()


def test_another_seed_gives_another_schedule() -> None:
    assert generate(1234, 120).actions != generate(1235, 120).actions


def test_a_shorter_run_plays_the_beginning_of_a_longer_one() -> None:
    """So a violation at minute 7 of a 10-minute run replays in an 8-minute one."""
    short = [a for a in generate(7, 60).actions if a.at < 50]
    long = [a for a in generate(7, 600).actions if a.at < 50]
    assert short == long


def test_every_actor_has_its_actions_in_time_order() -> None:
    schedule = generate(99, 120)
    for actor in schedule.actors():
        times = [a.at for a in schedule.of(actor)]
        assert times == sorted(times), actor
