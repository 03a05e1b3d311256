"""The daemon checks callers itself, on a bus that lets everything through."""

from __future__ import annotations

import pytest

from rdmad.bus.names import MANAGER_IFACE, MANAGER_PATH
from tests.bus.conftest import Live
from tests.support.bus import run_as

pytestmark = pytest.mark.bus

CLAIM = ("Claim", "ssa{sv}", "['mlx5_0', 'ns1', {'shared': Variant('b', True)}]")


async def test_daemon_denies_mutating_methods_to_a_non_root_caller(live: Live) -> None:
    got = await run_as(live.address, MANAGER_PATH, MANAGER_IFACE, *CLAIM)
    assert got == "org.freedesktop.DBus.Error.AccessDenied"
    assert live.core.claims() == []


async def test_daemon_lets_a_non_root_caller_read(live: Live) -> None:
    assert await run_as(live.address, MANAGER_PATH, MANAGER_IFACE, "ListDevices") == "ok"


async def test_daemon_allows_members_of_the_configured_group(live_group: Live) -> None:
    got = await run_as(live_group.address, MANAGER_PATH, MANAGER_IFACE, *CLAIM, extra_groups=[4242])
    assert got == "ok"
    assert len(live_group.core.claims()) == 1


async def test_daemon_denies_non_members_when_a_group_is_configured(live_group: Live) -> None:
    got = await run_as(live_group.address, MANAGER_PATH, MANAGER_IFACE, *CLAIM, extra_groups=[4243])
    assert got == "org.freedesktop.DBus.Error.AccessDenied"
