"""Claims through the real bus and the real daemon, on real netns and veths (sim RDMA)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from dbus_fast import Variant

from testbed.daemon import BUS_NAME, DBusCallError
from testbed.net import (
    addresses,
    ip,
    is_up,
    link,
    netns_inode,
    netns_nsid,
)
from tests.support.sim_rig import Rig

CLAIM_IFACE = "io.rdmad1.Claim"
DEVICE_IFACE = "io.rdmad1.Device"


def opts(**kw: Variant) -> dict[str, Variant]:
    return kw


@pytest.fixture
def netns_process(netns: str) -> Iterator[int]:
    """A process living in `netns`, for pid: and /proc/PID/ns/net claims."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, "sh", "-c", "echo ready; exec sleep 3600"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n", "the process entered the netns"
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


async def claim(rig: Rig, device: str, netns: str, **kw: Variant) -> str:
    path: str = await rig.client.manager("Claim", "ssa{sv}", device, netns, kw)
    return path


async def claim_id(rig: Rig, path: str) -> str:
    value: str = await rig.client.prop(path, CLAIM_IFACE, "Id")
    return value


async def device_state(rig: Rig, device: str) -> str:
    path = await rig.client.manager("GetDevice", "s", device)
    value: str = await rig.client.prop(path, DEVICE_IFACE, "State")
    return value


async def test_list_devices_shows_each_device_with_its_netdev(rig: Rig) -> None:
    listed = await rig.client.manager("ListDevices")
    assert [(n, s, nd) for n, s, nd, _ in listed] == [
        ("sim0", "available", rig.nic("sim0")),
        ("sim1", "available", rig.nic("sim1")),
    ]


async def test_claim_by_run_netns_path_moves_renames_and_configures(rig: Rig, netns: str) -> None:
    nic = rig.nic("sim0")
    await claim(
        rig,
        "sim0",
        f"/run/netns/{netns}",
        ifname=Variant("s", "rdma0"),
        mtu=Variant("u", 1400),
        addresses=Variant("as", ["192.0.2.5/24"]),
    )
    inside = link("rdma0", netns)
    assert inside is not None and inside["mtu"] == 1400 and is_up(inside)
    assert "192.0.2.5/24" in addresses("rdma0", netns)
    assert link(nic) is None, "the netdev must have left init_net"
    assert await device_state(rig, "sim0") == "claimed"


async def test_claim_by_bare_name(rig: Rig, netns: str) -> None:
    await claim(rig, "sim0", netns)
    assert link(rig.nic("sim0"), netns) is not None, "keeps its host name by default"


async def test_claim_by_pid(rig: Rig, netns: str, netns_process: int) -> None:
    path = await claim(rig, "sim0", f"pid:{netns_process}")
    assert link(rig.nic("sim0"), netns) is not None
    assert await rig.client.prop(path, CLAIM_IFACE, "Netns") == f"net:[{netns_inode(netns)}]"


async def test_claim_by_proc_pid_path(rig: Rig, netns: str, netns_process: int) -> None:
    await claim(rig, "sim0", f"/proc/{netns_process}/ns/net")
    assert link(rig.nic("sim0"), netns) is not None


async def test_claim_fd_uses_the_callers_open_netns(rig: Rig, netns: str) -> None:
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        reply = await rig.client.call_raw(
            BUS_NAME,
            "/io/rdmad1",
            "io.rdmad1.Manager",
            "ClaimFd",
            "sha{sv}",
            ["sim0", 0, {}],
            unix_fds=[fd],
        )
    finally:
        os.close(fd)
    assert link(rig.nic("sim0"), netns) is not None
    assert await rig.client.prop(reply[0], CLAIM_IFACE, "NetnsPath") == ""


async def test_claim_returns_char_devices_and_cdi_name(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns, chardevs=Variant("as", ["uverbs", "umad"]))
    chardevs = await rig.client.prop(path, CLAIM_IFACE, "CharDevices")
    assert [c[0] for c in chardevs] == ["/dev/infiniband/uverbs0", "/dev/infiniband/umad0"]
    cid = await claim_id(rig, path)
    assert await rig.client.prop(path, CLAIM_IFACE, "CdiDevice") == f"rdmad.io/rdma={cid}"
    assert (rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").exists()


async def test_release_restores_name_mtu_addresses_and_admin_state(rig: Rig, netns: str) -> None:
    nic = rig.nic("sim0")
    ip("link", "set", nic, "mtu", "1450")
    ip("addr", "add", "198.51.100.7/24", "dev", nic)
    before = link(nic)
    assert before is not None
    path = await claim(rig, "sim0", netns, ifname=Variant("s", "rdma0"), mtu=Variant("u", 1300))
    mark = rig.client.mark()
    await rig.client.manager("Release", "s", await claim_id(rig, path))
    released = await rig.client.wait_signal("Released", since=mark)
    assert released[2] == "requested"
    after = link(nic)
    assert after is not None, "the netdev is back under its host name"
    assert after["ifindex"] == before["ifindex"]
    assert (after["mtu"], is_up(after)) == (1450, is_up(before))
    assert "198.51.100.7/24" in addresses(nic)
    assert link("rdma0", netns) is None
    assert await device_state(rig, "sim0") == "available"


async def test_release_via_claim_object(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns)
    await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")
    assert link(rig.nic("sim0")) is not None
    assert await rig.client.manager("ListClaims") == []


async def test_shared_claim_creates_a_macvlan_child_in_the_netns(rig: Rig, netns: str) -> None:
    nic = rig.nic("sim0")
    await claim(rig, "sim0", netns, shared=Variant("b", True))
    child = link("net1", netns)
    assert child is not None and child["linkinfo"]["info_kind"] == "macvlan"
    assert link(nic) is not None, "the parent stays in init_net"
    assert await device_state(rig, "sim0") == "shared"


async def test_several_netns_share_one_device(rig: Rig, netns: str) -> None:
    other = f"{netns}b"
    ip("netns", "add", other)
    try:
        await claim(rig, "sim0", netns, shared=Variant("b", True))
        await claim(rig, "sim0", other, shared=Variant("b", True))
        claims = await rig.client.manager("ListClaims")
        assert sorted(c[2] for c in claims) == sorted(
            f"net:[{netns_inode(n)}]" for n in (netns, other)
        )
    finally:
        ip("netns", "del", other, check=False)


async def test_releasing_a_shared_claim_deletes_its_macvlan(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns, shared=Variant("b", True))
    await rig.client.manager("Release", "s", await claim_id(rig, path))
    assert link("net1", netns) is None
    assert await device_state(rig, "sim0") == "available"


async def test_netns_deletion_ends_a_whole_device_claim(rig: Rig, netns: str) -> None:
    # A veth is destroyed with its netns (a physical NIC returns: tested in the guest).
    path = await claim(rig, "sim0", netns)
    cid = await claim_id(rig, path)
    mark = rig.client.mark()
    ip("netns", "del", netns)
    released = await rig.client.wait_signal("Released", lambda b: b[0] == cid, since=mark)
    assert released == [cid, "sim0", "netns-gone"]
    assert await rig.client.manager("ListClaims") == []


async def test_netns_deletion_ends_a_shared_claim(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns, shared=Variant("b", True))
    cid = await claim_id(rig, path)
    mark = rig.client.mark()
    ip("netns", "del", netns)
    await rig.client.wait_signal("Released", lambda b: b == [cid, "sim0", "netns-gone"], since=mark)
    assert link(rig.nic("sim0")) is not None
    assert await device_state(rig, "sim0") == "available"


async def test_claim_survives_sigkill_and_restart(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns)
    cid = await claim_id(rig, path)
    await rig.daemon.kill()
    await rig.daemon.start()
    claims = await rig.client.manager("ListClaims")
    assert [c[0] for c in claims] == [cid]
    assert link(rig.nic("sim0"), netns) is not None
    assert await device_state(rig, "sim0") == "claimed"


async def test_netns_deleted_while_daemon_down_is_reconciled_at_start(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns, shared=Variant("b", True))
    cid = await claim_id(rig, path)
    await rig.daemon.stop()
    ip("netns", "del", netns)
    mark = rig.client.mark()
    await rig.daemon.start()
    released = await rig.client.wait_signal("Released", lambda b: b[0] == cid, since=mark)
    assert released == [cid, "sim0", "reconciled"]
    assert await rig.client.manager("ListClaims") == []


async def test_a_new_netns_given_a_dead_claims_inode_and_nsid_is_not_the_claims(
    rig: Rig, netns: str
) -> None:
    # The kernel gives a dead netns's inode and nsid to the next ones made (a container's, on
    # a busy host) and runtimes reuse names: while rdmad is down, all three can come to name
    # a stranger. When the kernel hands the numbers over is its own timing (minutes, at
    # times, on 6.18: docs/kernel-notes.md), so the claim's record is given the stranger's
    # here, as if it had: only the cookie tells them apart.
    # The dead netns's nsid is freed by the kernel's cleanup, later: the stranger gets one
    # of its own, and the record is given that too.
    path = await claim(rig, "sim0", netns, shared=Variant("b", True))
    cid = await claim_id(rig, path)
    await rig.daemon.stop()
    ip("netns", "del", netns)
    ip("netns", "add", netns)
    ip("netns", "set", netns, "auto")
    record = rig.daemon.state_dir / "claims" / f"{cid}.json"
    saved = json.loads(record.read_text())
    saved["claim"]["nsid"] = netns_nsid(netns)
    saved["claim"]["netns_inode"] = netns_inode(netns)
    record.write_text(json.dumps(saved))
    mark = rig.client.mark()
    await rig.daemon.start()
    released = await rig.client.wait_signal("Released", lambda b: b[0] == cid, since=mark)
    assert released == [cid, "sim0", "reconciled"]
    assert await rig.client.manager("ListClaims") == []


async def test_sigterm_exits_cleanly_and_keeps_claims(rig: Rig, netns: str) -> None:
    await claim(rig, "sim0", netns)
    assert await rig.daemon.stop() == 0
    assert link(rig.nic("sim0"), netns) is not None, "claims are kernel state: they stay"


async def test_claimed_signal_carries_id_device_and_path(rig: Rig, netns: str) -> None:
    mark = rig.client.mark()
    path = await claim(rig, "sim1", netns)
    signal = await rig.client.wait_signal("Claimed", since=mark)
    assert signal == [await claim_id(rig, path), "sim1", path]


async def test_observers_see_claimed_then_available_and_no_passing_state(
    rig: Rig, netns: str
) -> None:
    # The device's own netdev leaving and coming back must not show as a state of its own
    # (e.g. "unavailable" while the netdev is between netns).
    device = await rig.client.manager("GetDevice", "s", "sim0")
    mark = rig.client.mark()
    path = await claim(rig, "sim0", netns)
    await rig.client.manager("Release", "s", await claim_id(rig, path))
    await rig.client.wait_property(device, "State", "available", since=mark)
    assert rig.client.property_changes(device, "State", since=mark) == ["claimed", "available"]


async def test_concurrent_claims_of_one_device_give_one_winner(rig: Rig, netns: str) -> None:
    other = f"{netns}c"
    ip("netns", "add", other)
    try:
        results = await asyncio.gather(
            claim(rig, "sim0", netns), claim(rig, "sim0", other), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, DBusCallError)]
        assert len(errors) == 1 and errors[0].name == "io.rdmad1.Error.DeviceBusy"
    finally:
        ip("netns", "del", other, check=False)


async def test_claim_and_release_are_logged_as_one_line_each_with_fields(
    rig: Rig, netns: str
) -> None:
    path = await claim(rig, "sim0", netns)
    cid = await claim_id(rig, path)
    mark = rig.client.mark()
    await rig.client.manager("Release", "s", cid)
    await rig.client.wait_signal("Released", since=mark)
    lines = [line for line in rig.daemon.log().splitlines() if f"claim={cid}" in line]
    label = f"net:[{netns_inode(netns)}]"
    assert len(lines) == 2, lines
    assert all(f"device=sim0 netns={label}" in line for line in lines)
    assert "claimed" in lines[0] and "reason=requested" in lines[1]


async def test_daemon_holds_no_fd_of_a_claimed_netns(rig: Rig, netns: str) -> None:
    # An open fd keeps a netns alive after `ip netns del`: rdmad must never pin one.
    await claim(rig, "sim0", netns, shared=Variant("b", True))
    await claim(rig, "sim1", netns)
    assert rig.daemon.proc is not None
    proc = f"/proc/{rig.daemon.proc.pid}"
    ns = _identity(f"/run/netns/{netns}")
    # stat, not readlink: an fd opened through a /run/netns bind mount reads as that path.
    held = [fd for fd in os.listdir(f"{proc}/fd") if _identity(f"{proc}/fd/{fd}") == ns]
    inside = [t for t in os.listdir(f"{proc}/task") if _identity(f"{proc}/task/{t}/ns/net") == ns]
    assert held == [] and inside == []


def _identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


async def test_shared_claim_lists_the_gids_of_its_childs_address(rig: Rig, netns: str) -> None:
    path = await claim(
        rig,
        "sim0",
        netns,
        shared=Variant("b", True),
        ifname=Variant("s", "net1"),
        addresses=Variant("as", ["192.0.2.10/24"]),
    )
    gids = await rig.client.prop(path, CLAIM_IFACE, "Gids")
    mapped = "0000:0000:0000:0000:0000:ffff:c000:020a"  # ::ffff:192.0.2.10
    assert [(g[2], g[3], g[4]) for g in gids] == [
        (mapped, "IB/RoCE v1", "net1"),
        (mapped, "RoCE v2", "net1"),
    ]


async def test_cdi_spec_names_the_device_and_its_roce_v2_gid_index(rig: Rig, netns: str) -> None:
    path = await claim(
        rig,
        "sim0",
        netns,
        shared=Variant("b", True),
        addresses=Variant("as", ["192.0.2.10/24"]),
    )
    v2 = [g for g in await rig.client.prop(path, CLAIM_IFACE, "Gids") if g[3] == "RoCE v2"]
    cid = await claim_id(rig, path)
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").read_text())
    assert spec["cdiVersion"] == "0.5.0", "podman 4.3 parses up to 0.5.0"
    env = spec["devices"][0]["containerEdits"]["env"]
    assert f"NCCL_IB_GID_INDEX={v2[0][1]}" in env
    assert f"RDMAD_GID_INDEX={v2[0][1]}" in env
    assert "NCCL_IB_HCA==sim0:1" in env and "RDMAD_DEVICE=sim0" in env


async def test_whole_device_claim_lists_the_devices_gids(rig: Rig, netns: str) -> None:
    path = await claim(rig, "sim0", netns)
    gids = await rig.client.prop(path, CLAIM_IFACE, "Gids")
    assert [(g[0], g[1], g[3]) for g in gids] == [(1, 0, "IB/RoCE v1"), (1, 1, "RoCE v2")]


async def test_an_address_added_in_the_netns_joins_the_claims_gids_and_its_cdi_spec(
    rig: Rig, netns: str
) -> None:
    path = await claim(
        rig,
        "sim0",
        netns,
        shared=Variant("b", True),
        ifname=Variant("s", "net1"),
        addresses=Variant("as", ["192.0.2.10/24"]),
    )
    cid = await claim_id(rig, path)
    mark = rig.client.mark()
    ip("addr", "add", "198.51.100.5/24", "dev", "net1", netns=netns)
    added = "0000:0000:0000:0000:0000:ffff:c633:6405"  # ::ffff:198.51.100.5
    body = await rig.client.wait_signal(
        "PropertiesChanged",
        lambda b: "Gids" in b[1] and added in {g[2] for g in b[1]["Gids"].value},
        since=mark,
    )
    assert {g[2] for g in body[1]["Gids"].value} == {
        "0000:0000:0000:0000:0000:ffff:c000:020a",
        added,
    }
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert any(e.startswith("NCCL_IB_GID_INDEX=") for e in env)


async def test_the_claims_address_removed_leaves_its_gids_and_its_cdi_spec(
    rig: Rig, netns: str
) -> None:
    path = await claim(
        rig,
        "sim0",
        netns,
        shared=Variant("b", True),
        ifname=Variant("s", "net1"),
        addresses=Variant("as", ["192.0.2.10/24"]),
    )
    cid = await claim_id(rig, path)
    mark = rig.client.mark()
    ip("addr", "del", "192.0.2.10/24", "dev", "net1", netns=netns)
    await rig.client.wait_property(path, "Gids", [], since=mark)
    spec = json.loads((rig.daemon.cdi_dir / f"rdmad.io-rdma-{cid}.json").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert not any(e.startswith("NCCL_IB_GID_INDEX=") for e in env)
