"""Claims belong to their claimant, against the real daemon (sim RDMA on real veths), the
real kernel's namespaces and Debian's polkitd under the tests' rules (nobody may take
shares and release its own claims): a caller that is not root claims only into a netns its
own user namespace owns, named by path, pid or fd, and releases only its own claims, also
after a restart."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from testbed.bus import NOBODY, PrivateBus, run_as, start_private_bus
from testbed.children import spawn
from testbed.polkit import start_polkitd
from tests.reliability.conftest import reliability_rig, restart
from tests.support.polkit import TEST_RULES
from tests.support.sim_rig import Rig

DENIED = "org.freedesktop.DBus.Error.AccessDenied"
DAEMON = 1  # Debian's "daemon" user: another user than nobody
MANAGER = ("/io/rdmad1", "io.rdmad1.Manager")
SHARE = "{'shared': Variant('b', True)}"


@pytest.fixture(scope="module")
def polkit_bus() -> Iterator[PrivateBus]:
    with start_private_bus() as bus, start_polkitd(bus, TEST_RULES):
        yield bus


@pytest.fixture
async def rig(polkit_bus: PrivateBus, tmp_path: Path) -> AsyncIterator[Rig]:
    async with reliability_rig(polkit_bus.address, tmp_path, 2) as rig:
        yield rig


async def users_netns(uid: int) -> AsyncIterator[int]:
    """A process of `uid` in a new user namespace (its uid mapped to itself) and a new netns
    there: yields its pid once the namespaces exist; killed afterwards."""
    proc = await spawn(
        "unshare",
        "--user",
        "--net",
        "--map-current-user",
        "sh",
        "-c",
        "echo ready; exec sleep infinity",
        user=uid,
        group=NOBODY,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(10):
            assert await proc.stdout.readline() == b"ready\n"
        yield proc.pid
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def nobodys() -> AsyncIterator[int]:
    async for pid in users_netns(NOBODY):
        yield pid


@pytest.fixture
async def daemons() -> AsyncIterator[int]:
    async for pid in users_netns(DAEMON):
        yield pid


def claim_as_nobody(how: str, pid: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(run_as's call, its wrap) for a shared claim of sim1 into pid's netns, named `how`."""
    if how == "fd":  # the caller's own netns, entered as its user namespace's owner
        nsenter = ("nsenter", "--preserve-credentials", "-U", "-n", "-t", str(pid))
        return (*MANAGER, "ClaimFd", "sha{sv}", f"['sim1', 0, {SHARE}]"), nsenter
    netns = f"pid:{pid}" if how == "pid" else f"/proc/{pid}/ns/net"
    return (*MANAGER, "Claim", "ssa{sv}", f"['sim1', '{netns}', {SHARE}]"), ()


async def claims(rig: Rig) -> list[str]:
    return [row[0] for row in await rig.client.manager("ListClaims")]


@pytest.mark.parametrize("how", ["path", "pid", "fd"])
async def test_a_caller_claims_into_its_own_user_namespaces_netns(
    rig: Rig, nobodys: int, how: str
) -> None:
    call, wrap = claim_as_nobody(how, nobodys)
    assert await run_as(rig.daemon.bus_address, *call, wrap=wrap, message=True) == "ok"
    assert len(await claims(rig)) == 1


@pytest.mark.parametrize("whose", ["another-users", "roots", "init_net"])
async def test_a_caller_is_refused_a_netns_it_does_not_own(
    rig: Rig, daemons: int, netns: str, whose: str
) -> None:
    # the test runs in init_net, as rdmad does
    target = {"another-users": f"pid:{daemons}", "roots": netns, "init_net": f"pid:{os.getpid()}"}
    call = (*MANAGER, "Claim", "ssa{sv}", f"['sim1', '{target[whose]}', {SHARE}]")
    got = await run_as(rig.daemon.bus_address, *call, message=True)
    assert got.startswith(f"{DENIED}: '{target[whose]}' is not uid {NOBODY}'s"), got
    assert await claims(rig) == []


async def nobodys_and_roots_claims(rig: Rig, nobodys: int, netns: str) -> tuple[str, str]:
    call, _ = claim_as_nobody("pid", nobodys)
    assert await run_as(rig.daemon.bus_address, *call) == "ok"
    (mine,) = await claims(rig)
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    roots = await rig.client.prop(path, "io.rdmad1.Claim", "Id")
    return mine, roots


async def release_as_nobody(rig: Rig, claim_id: str) -> str:
    call = (*MANAGER, "Release", "s", f"['{claim_id}']")
    return await run_as(rig.daemon.bus_address, *call, message=True)


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
async def test_a_caller_releases_its_own_claim_and_not_anothers(
    rig: Rig, nobodys: int, netns: str, restarted: bool
) -> None:
    mine, roots = await nobodys_and_roots_claims(rig, nobodys, netns)
    if restarted:  # the claimant is kept with the claim
        await rig.daemon.kill()
        await restart(rig)
    refused = await release_as_nobody(rig, roots)
    assert refused.startswith(f"{DENIED}: io.rdmad1.release-any: not authorized by polkit")
    assert await release_as_nobody(rig, mine) == "ok"
    assert await claims(rig) == [roots]
