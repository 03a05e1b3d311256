"""Policy routing per claim (option table, routes): the real Core on the in-memory kernel.
A claim with a table gets, in its netns, a rule from each of its addresses to the table,
its connected routes and its own routes there, and the rail sysctls on its interface; all
of it goes with the claim, and nothing is left of a claim that failed."""

from __future__ import annotations

import asyncio
import errno
from dataclasses import replace
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.core import Core
from rdmad.core.store import Store
from rdmad.errors import InvalidArgs, KernelError
from rdmad.model import TABLE_AUTO, Claim, ClaimOptions
from rdmad.options import parse_route
from tests.support.core_rig import Rig, Rigs, two_nics
from tests.support.fake_kernel import FakeKernel
from tests.unit.test_core_reconcile import crash_at

V4 = ip_interface("10.0.0.5/24")
V6 = ip_interface("2001:db8::5/64")
ROUTED = ClaimOptions(
    shared=True,
    ifname="rail0",
    addresses=(V4, V6),
    table=TABLE_AUTO,
    routes=(parse_route("10.9.0.0/16,via=10.0.0.1"),),
)


async def claim(rig: Rig, device: str, options: ClaimOptions, netns: str = "pod") -> str:
    made = await rig.core.claim(device, rig.process.resolver.open(netns), options)
    return made.id


def in_pod(kernel: FakeKernel) -> tuple[set[int], set[tuple[str, int]]]:
    ns = kernel.netns("pod")
    return ns.tables(), ns.rules


async def test_a_routed_claim_gets_rules_from_its_addresses_and_its_routes_in_its_table(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    cid = await claim(rig, "mlx5_0", ROUTED)
    rail = kernel.link("rail0", "pod")
    assert rail is not None and rail.rail_sysctls
    assert rig.core.get_claim(cid).attached.route_table == 1000
    ns = kernel.netns("pod")
    assert ns.rules == {("10.0.0.5", 1000), ("2001:db8::5", 1000)}
    assert ns.routes == {
        (1000, "10.0.0.0/24", "", rail.ifindex),
        (1000, "2001:db8::/64", "", rail.ifindex),
        (1000, "10.9.0.0/16", "10.0.0.1", rail.ifindex),
    }


async def test_auto_gives_each_claim_of_a_netns_the_lowest_free_table(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.netns("pod").routes.add((1000, "192.0.2.0/24", "", 99))  # someone else's table
    rig = await rigs.start(kernel)
    first = await claim(rig, "mlx5_0", ROUTED)
    second = await claim(rig, "mlx5_1", replace(ROUTED, ifname="rail1", routes=(), addresses=(V4,)))
    tables = [rig.core.get_claim(c).attached.route_table for c in (first, second)]
    assert tables == [1001, 1002]


async def test_tables_are_per_netns_so_another_pod_starts_from_the_range_again(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("other")
    rig = await rigs.start(kernel)
    first = await claim(rig, "mlx5_0", ROUTED)
    second = await claim(rig, "mlx5_1", ROUTED, netns="other")
    assert {rig.core.get_claim(c).attached.route_table for c in (first, second)} == {1000}


async def test_a_table_chosen_by_number_is_the_claims(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    cid = await claim(rig, "mlx5_0", replace(ROUTED, table=7))
    assert rig.core.get_claim(cid).attached.route_table == 7 and in_pod(kernel)[0] == {7}


async def test_release_removes_rules_routes_and_sysctls(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    kept = await claim(rig, "mlx5_1", replace(ROUTED, ifname="rail1", table=2000))
    cid = await claim(rig, "mlx5_0", ROUTED)
    await rig.core.release(cid)
    assert in_pod(kernel) == ({2000}, {("10.0.0.5", 2000), ("2001:db8::5", 2000)})
    await rig.core.release(kept)
    assert in_pod(kernel) == (set(), set())


async def test_a_whole_claim_release_takes_its_routes_and_sysctls_home_with_the_netdev(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    cid = await claim(rig, "mlx5_0", replace(ROUTED, shared=False))
    await rig.core.release(cid)
    eth0 = kernel.link("eth0")
    assert eth0 is not None and not eth0.rail_sysctls
    assert in_pod(kernel) == (set(), set())


async def test_a_claim_whose_netns_died_has_nothing_to_remove(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    cid = await claim(rig, "mlx5_0", ROUTED)
    kernel.delete_netns("pod")
    await rig.seen.wait_released(cid)
    assert kernel.calls["remove_policy_routing"] == 0


async def test_a_table_another_claim_of_the_netns_has_is_refused(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    first = await claim(rig, "mlx5_0", replace(ROUTED, table=1500))
    with pytest.raises(InvalidArgs, match=f"routing table 1500 .* is taken by claim {first}"):
        await claim(rig, "mlx5_1", replace(ROUTED, ifname="rail1", table=1500))
    assert kernel.link("rail1", "pod") is None and len(rig.core.claims()) == 1


async def test_a_table_that_holds_routes_in_the_netns_already_is_refused(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.netns("pod").rules.add(("192.0.2.9", 1500))
    rig = await rigs.start(kernel)
    with pytest.raises(InvalidArgs, match=r"routing table 1500 .* holds routes or rules"):
        await claim(rig, "mlx5_0", replace(ROUTED, table=1500))
    assert rig.core.claims() == [] and kernel.links_in("pod") == []


async def test_a_range_with_no_room_is_refused(tmp_path: Path) -> None:
    kernel = two_nics()
    process = kernel.process()
    core = Core(
        process.net,
        process.rdma,
        process.resolver,
        Store(tmp_path),
        cgroups=kernel.cgroups,
        route_tables=range(5, 6),
    )
    kernel.attach(core.handle)
    await core.start()
    try:
        await core.claim("mlx5_0", process.resolver.open("pod"), ROUTED)
        with pytest.raises(InvalidArgs, match=r"no free routing table in 5-5 \(route_tables\)"):
            await core.claim("mlx5_1", process.resolver.open("pod"), replace(ROUTED, ifname="r1"))
        assert len(core.claims()) == 1 and len(kernel.links_in("pod")) == 1
    finally:
        await core.close()


async def test_a_claim_whose_routes_fail_is_rolled_back_whole(rigs: Rigs, tmp_path: Path) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    kernel.fail("add_policy_routing", KernelError(errno.ENETUNREACH, "no route to the gateway"))
    with pytest.raises(KernelError, match="no route to the gateway"):
        await claim(rig, "mlx5_0", replace(ROUTED, shared=False))
    await rig.quiesce()
    assert rig.core.claims() == [] and Store(tmp_path).load().claims == []
    assert kernel.links_in("pod") == [] and in_pod(kernel) == (set(), set())
    assert kernel.link("eth0") is not None


async def test_a_pending_routed_claim_found_at_start_is_undone_rules_and_all(rigs: Rigs) -> None:
    """The crash between installing the rules and writing the claim ACTIVE."""
    kernel = two_nics()
    rig = await rigs.start(kernel)
    # "chardevs" is the step after the routes: the daemon dies there.
    made = rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), ROUTED)
    restarted = await crash_at(rig, "chardevs", made)
    await restarted.quiesce()
    assert restarted.core.claims() == [] and in_pod(kernel) == (set(), set())
    assert kernel.links_in("pod") == []


# -- a table booked by one claim while another of its netns chooses -------------------------


async def test_two_claims_whose_table_choices_interleave_get_different_tables(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    choosing = kernel.pause("free_table")
    first = asyncio.create_task(claim(rig, "mlx5_0", ROUTED))
    await choosing.reached.wait()
    # The second books its table and stops before it is in the kernel.
    installing = kernel.pause("add_policy_routing")
    second = asyncio.create_task(claim(rig, "mlx5_1", replace(ROUTED, ifname="rail1")))
    await installing.reached.wait()
    choosing.go.set()
    first_id = await first
    installing.go.set()
    tables = [rig.core.get_claim(c).attached.route_table for c in (first_id, await second)]
    assert tables == [1001, 1000]


async def test_a_table_asked_for_that_another_claim_books_while_the_kernel_is_asked_is_refused(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    choosing = kernel.pause("free_table")
    first = asyncio.create_task(claim(rig, "mlx5_0", replace(ROUTED, table=7)))
    await choosing.reached.wait()
    installing = kernel.pause("add_policy_routing")
    second = asyncio.create_task(claim(rig, "mlx5_1", replace(ROUTED, ifname="rail1", table=7)))
    await installing.reached.wait()
    choosing.go.set()
    with pytest.raises(InvalidArgs, match=r"routing table 7 .* is taken by claim"):
        await first
    installing.go.set()
    assert rig.core.get_claim(await second).attached.route_table == 7


async def test_a_held_claim_attached_meanwhile_has_its_table_seen_by_another_claims_choice(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.hold("mlx5_1", POD_UID, HELD)
    choosing = kernel.pause("free_table")
    first = asyncio.create_task(claim(rig, "mlx5_0", ROUTED))
    await choosing.reached.wait()
    # The Attach books its table and stops before its netdev is in the netns.
    placing = kernel.pause("add_macvlan")
    attached = asyncio.create_task(attach_routed(rig))
    await placing.reached.wait()
    choosing.go.set()
    first_id = await first
    placing.go.set()
    (held,) = await attached
    assert [rig.core.get_claim(first_id).attached.route_table, held.attached.route_table] == [
        1001,
        1000,
    ]


async def test_a_held_claim_held_again_leaves_its_table_to_the_next_claim_of_its_netns(
    rig: Rig,
) -> None:
    held = await detached_routed_hold(rig)
    cid = await claim(rig, "mlx5_0", ROUTED)
    assert held.attachment is None and rig.core.get_claim(cid).attached.route_table == 1000


async def test_a_held_claim_attached_again_without_a_table_has_none(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await detached_routed_hold(rig)
    await rig.core.attach(POD_UID, rig.process.resolver.open("pod"), "", ClaimOptions())
    assert held.attached.route_table == 0 and in_pod(kernel) == (set(), set())


POD_UID = "pod-uid-1"
HELD = ClaimOptions(shared=True, ifname="rail1")  # a Hold takes no addresses, nor a table


async def attach_routed(rig: Rig) -> list[Claim]:
    """The pod's holds attached into `pod` with ROUTED's addresses and table."""
    options = ClaimOptions(addresses=ROUTED.addresses, table=TABLE_AUTO)
    return await rig.core.attach(POD_UID, rig.process.resolver.open("pod"), "", options)


async def detached_routed_hold(rig: Rig) -> Claim:
    """mlx5_1 held for the pod, attached with a table, then detached: held again."""
    await rig.core.hold("mlx5_1", POD_UID, HELD)
    (held,) = await attach_routed(rig)
    await rig.core.detach(held.id)
    return held
