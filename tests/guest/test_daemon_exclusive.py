"""Whole-device claims of a real rxe device in exclusive netns mode, per kernel.

With `netdev` false only the RDMA device moves; the rxe's veth stays in init_net (moving
it would destroy the rxe). Kernel 7.3's rxe can change netns; 6.1's cannot (it lacks
disassociate_ucontext), and rdmad must say so and change nothing. Both kernels run in CI,
so each kernel's tests are selected by RDMA_VM_KERNEL and the other run covers the rest.

The module switches to exclusive mode once, before any test netns exists (the kernel
refuses the switch otherwise), and back to shared after every test netns is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from dbus_fast import Variant

from rdmad.core.events import Event
from testbed.daemon import Client, DBusCallError, RdmadProcess
from testbed.net import ip, link, netns_inode
from tests.support.rdma import (
    CLAIM_IFACE,
    Rxe,
    all_props,
    device_props,
    kernel,
    known_to_rdmad,
    listed,
    rdma_dev_names,
    rdma_netns_mode,
    set_netns_mode,
    stat_rdev,
    until,
)
from tests.support.traffic import (
    PINGPONG_ITERS,
    WRITE_BW_ITERS,
    cdi_env,
    gid_joined,
    ibv_devices,
    pingpong,
    pingpong_iters,
    sysfs_gid,
    write_bw,
    write_bw_iters,
)

pytestmark = [pytest.mark.guest, pytest.mark.usefixtures("in_guest", "daemon_log_on_failure")]

only_61 = pytest.mark.skipif(
    kernel() != "6.1", reason="the 6.1 branch: 7.3's rxe changes netns (tested above)"
)

NETDEV_FALSE = {"netdev": Variant("b", False)}


@pytest.fixture(scope="module", autouse=True)
async def exclusive(client: Client) -> AsyncIterator[None]:
    """Exclusive mode for the whole module; shared again once its netns are gone."""
    await set_netns_mode(client, "exclusive")
    assert rdma_netns_mode() == "exclusive"
    yield
    await set_netns_mode(client, "shared")


@pytest.fixture
async def exclusive_rxe(client: Client, rxe: Rxe) -> AsyncIterator[Rxe]:
    """An rxe device rdmad lists; claims on it released afterwards (netns still alive:
    tests request `netns` before this fixture)."""
    await known_to_rdmad(client, rxe.name)
    yield rxe
    for cid, dev, *_ in await client.manager("ListClaims"):
        if dev == rxe.name:
            try:
                await client.manager("Release", "s", cid)
            except DBusCallError as exc:
                assert exc.name == "io.rdmad1.Error.NoSuchClaim", exc


async def claim_rdma_only(client: Client, rxe: Rxe, netns: str) -> dict[str, object]:
    path = await client.manager("Claim", "ssa{sv}", rxe.name, netns, NETDEV_FALSE)
    return await all_props(client, str(path), CLAIM_IFACE)


def unchanged(rxe: Rxe) -> None:
    """The rxe device and its netdev are in init_net, as before any claim."""
    assert rxe.name in rdma_dev_names()
    assert link(rxe.netdev) is not None


async def test_claim_without_netdev_moves_only_the_rdma_device_into_the_netns(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    assert exclusive_rxe.name in rdma_dev_names(netns)
    assert exclusive_rxe.name not in rdma_dev_names()
    assert link(exclusive_rxe.netdev) is not None, "the netdev stays in init_net"
    label = f"net:[{netns_inode(netns)}]"
    assert claim["Netns"] == label
    props = await device_props(client, exclusive_rxe.name)
    assert (props["State"], props["Netns"]) == ("claimed", label)


async def test_the_claims_char_devices_exist_inside_the_netns_as_returned(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    nodes = claim["CharDevices"]
    assert isinstance(nodes, list) and nodes
    assert any(p.startswith("/dev/infiniband/uverbs") for p, _, _ in nodes)
    seen = stat_rdev([p for p, _, _ in nodes], netns)
    assert seen == {p: (major, minor) for p, major, minor in nodes}


async def test_release_moves_the_rdma_device_back_to_init_net(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    mark = client.mark()
    await client.manager("Release", "s", claim["Id"])
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], exclusive_rxe.name, "requested"]
    unchanged(exclusive_rxe)
    assert exclusive_rxe.name not in rdma_dev_names(netns)
    props = await device_props(client, exclusive_rxe.name)
    assert (props["State"], props["Netns"], props["Claims"]) == ("available", "init", [])


async def test_netns_deletion_brings_the_device_home_and_ends_the_claim(
    client: Client, netns: str, exclusive_rxe: Rxe, udev_events: asyncio.Queue[Event]
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    mark = client.mark()
    ip("netns", "del", netns)
    released = await client.wait_signal("Released", lambda b: b[0] == claim["Id"], since=mark)
    assert released == [claim["Id"], exclusive_rxe.name, "netns-gone"]

    async def home_and_available() -> bool:
        rows = await listed(client)
        here = exclusive_rxe.name in rdma_dev_names()
        return here and rows.get(exclusive_rxe.name, ("",))[0] == "available"

    # The kernel's rdma_dev_exit_net re-registers it in init_net: a uevent each step.
    await until(home_and_available, udev_events)
    unchanged(exclusive_rxe)
    assert await client.manager("ListClaims") == []


async def test_a_restarted_rdmad_lists_the_device_its_claim_moved_as_before(
    client: Client, crash_rdmad: Callable[[], Awaitable[None]], netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    before = await device_props(client, exclusive_rxe.name)
    await crash_rdmad()  # the device stays in the netns, and init_net no longer lists it
    assert (await listed(client))[exclusive_rxe.name][0] == "claimed"
    after = await device_props(client, exclusive_rxe.name)
    assert after == before and (after["State"], after["Netns"]) == ("claimed", claim["Netns"])


@pytest.mark.on_61
async def test_claim_with_its_netdev_is_not_supported_and_moves_nothing(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    with pytest.raises(DBusCallError) as err:
        await client.manager("Claim", "ssa{sv}", exclusive_rxe.name, netns, {})
    assert err.value.name == "io.rdmad1.Error.NotSupported"
    assert "netdev=false" in err.value.message
    assert "shared claim" in err.value.message
    unchanged(exclusive_rxe)
    assert link(exclusive_rxe.netdev, netns) is None
    assert await client.manager("ListClaims") == []
    assert (await listed(client))[exclusive_rxe.name][0] == "available"


@pytest.mark.on_61
@only_61
async def test_claim_without_netdev_is_not_supported_with_the_kernels_reason(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    with pytest.raises(DBusCallError) as err:
        await claim_rdma_only(client, exclusive_rxe, netns)
    assert err.value.name == "io.rdmad1.Error.NotSupported"
    assert "driver cannot change netns" in err.value.message
    unchanged(exclusive_rxe)
    assert rdma_dev_names(netns) == set()
    assert await client.manager("ListClaims") == []
    props = await device_props(client, exclusive_rxe.name)
    assert (props["State"], props["Netns"], props["Claims"]) == ("available", "init", [])


# ---------------------------------------------------------------- traffic through the claim


async def test_ibv_rc_pingpong_runs_over_the_claimed_device_inside_the_netns(
    client: Client, rdmad: RdmadProcess, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    env = cdi_env(rdmad.cdi_dir, str(claim["Id"]))
    assert env["RDMAD_DEVICE"] == exclusive_rxe.name
    run = await pingpong(netns, env["RDMAD_DEVICE"], int(env["RDMAD_GID_INDEX"]))
    assert run.both(pingpong_iters) == (PINGPONG_ITERS, PINGPONG_ITERS), run


async def test_ib_write_bw_runs_over_the_claimed_device_inside_the_netns(
    client: Client, rdmad: RdmadProcess, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    env = cdi_env(rdmad.cdi_dir, str(claim["Id"]))
    run = await write_bw(netns, env["RDMAD_DEVICE"], int(env["RDMAD_GID_INDEX"]))
    assert run.both(write_bw_iters) == (WRITE_BW_ITERS, WRITE_BW_ITERS), run


async def test_the_claims_gids_are_the_devices_table_as_the_netns_reads_it(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    gids = claim["Gids"]
    assert isinstance(gids, list) and gids
    for port, index, gid, _type, netdev in gids:
        assert sysfs_gid(exclusive_rxe.name, index, netns, port) == gid
        assert netdev == exclusive_rxe.netdev, "the netdev stayed in init_net"


async def test_an_address_added_on_the_netdev_at_home_joins_the_claims_gids(
    client: Client, netns: str, exclusive_rxe: Rxe
) -> None:
    path = await client.manager("Claim", "ssa{sv}", exclusive_rxe.name, netns, NETDEV_FALSE)
    mark = client.mark()
    ip("addr", "add", "198.51.100.6/24", "dev", exclusive_rxe.netdev)
    added = "0000:0000:0000:0000:0000:ffff:c633:6406"  # ::ffff:198.51.100.6
    entries = await gid_joined(client, added, mark)
    for port, index, gid, _type, netdev in entries:
        assert sysfs_gid(exclusive_rxe.name, index, netns, port) == gid
        assert netdev == exclusive_rxe.netdev
    assert added in {g[2] for g in await client.prop(str(path), CLAIM_IFACE, "Gids")}


async def test_after_release_the_old_netns_has_no_rdma_device_to_use(
    client: Client, rdmad: RdmadProcess, netns: str, exclusive_rxe: Rxe
) -> None:
    claim = await claim_rdma_only(client, exclusive_rxe, netns)
    env = cdi_env(rdmad.cdi_dir, str(claim["Id"]))
    assert ibv_devices(netns) == {exclusive_rxe.name}
    await client.manager("Release", "s", claim["Id"])
    assert ibv_devices(netns) == set()
    run = await pingpong(netns, exclusive_rxe.name, int(env["RDMAD_GID_INDEX"]))
    assert run.both(pingpong_iters) == (None, None), run
    assert f"IB device {exclusive_rxe.name} not found" in run.client.out, run
