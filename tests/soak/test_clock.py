"""The soak's clock: it stands still only while no action is in flight, and runs at its pace."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.soak.clock import Clock


async def test_an_action_woken_by_the_gate_waits_again_when_a_check_shut_it_first() -> None:
    clock = Clock()
    started: list[float] = []

    async def actor() -> None:
        async with clock.acting():
            started.append(clock.now())

    async with clock.quiescent():
        waiting = asyncio.ensure_future(actor())
        await asyncio.sleep(0)  # the actor waits at the shut gate
    # The gate opened, waking the actor; a second check (its time past) shuts it at once.
    async with clock.quiescent():
        await asyncio.sleep(0)
        assert not started, "an action started while the clock stood still for a check"
        assert clock.in_flight == 0
    await waiting
    assert len(started) == 1


def test_at_pace_k_a_soak_second_is_k_wall_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: wall[0])
    clock = Clock(pace=4.0)
    wall[0] += 8.0
    assert clock.now() == 2.0
