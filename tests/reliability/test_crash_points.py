"""SIGKILL-equivalent crash (os._exit(137) at CRASH_AT, testbed/faulty_rdmad.py) at
every step of a claim and of a release; after a restart each device is either home with its
host name and settings, or in its netns with the claim listed. Never in between, never
forgotten."""

from __future__ import annotations

from pathlib import Path

import pytest
from dbus_fast import Variant

from rdmad.model import RdmaLimit
from testbed.daemon import BUS_NAME, DBusCallError
from testbed.faulty_rdmad import CRASH_AT
from testbed.net import ip, link, temp_netns
from tests.reliability.conftest import reliability_rig, restart, settings_of
from tests.support.cgroup_tree import make_tree, written_line
from tests.support.fake_cgroups import NO_LIMIT
from tests.support.invariants import assert_invariants
from tests.support.sim_rig import Rig

CLAIM_IFACE = "io.rdmad1.Claim"
WHOLE = {
    "ifname": Variant("s", "rdma0"),
    "mtu": Variant("u", 1400),
    "addresses": Variant("as", ["192.0.2.5/24"]),
}
SHARED = {"shared": Variant("b", True), "addresses": Variant("as", ["192.0.2.6/24"])}
# Policy routing: a table, so a rule and routes in the netns between two steps.
ROUTED = {**SHARED, "table": Variant("u", 0), "routes": Variant("as", ["0.0.0.0/0,via=192.0.2.1"])}
# An RDMA limit in a cgroup (of a tree shaped as a cgroup2 mount: tests/support/cgroup_tree.py).
POD_CGROUP = "kubepods.slice/kubepods-pod1.slice"
LIMIT = RdmaLimit(hca_handle=1, hca_object=None)
LIMITED = {**SHARED, "cgroup": Variant("s", POD_CGROUP), "hca_handles": Variant("u", 1)}

# (kind, sim mode, claim options, steps of a claim in order, steps of a release in order)
KINDS = {
    "whole": (
        "shared",
        WHOLE,
        ["pending-written", "netdev-moved", "addresses-set", "netdev-placed", "active-written"],
        ["releasing-written", "netdev-moved-home", "netdev-returned", "released-written"],
    ),
    "exclusive": (
        "exclusive",
        WHOLE,
        [
            "pending-written",
            "rdma-moved",
            "netdev-moved",
            "addresses-set",
            "netdev-placed",
            "active-written",
        ],
        ["releasing-written", "netdev-moved-home", "netdev-returned", "released-written"],
    ),
    "shared": (
        "shared",
        SHARED,
        ["pending-written", "macvlan-created", "addresses-set", "netdev-placed", "active-written"],
        ["releasing-written", "netdev-returned", "released-written"],
    ),
    "routed": (
        "shared",
        ROUTED,
        [
            "pending-written",
            "macvlan-created",
            "addresses-set",
            "netdev-placed",
            "routes-installed",
            "active-written",
        ],
        ["releasing-written", "routes-removed", "netdev-returned", "released-written"],
    ),
    "limited": (
        "shared",
        LIMITED,
        [
            "pending-written",
            "macvlan-created",
            "addresses-set",
            "netdev-placed",
            "limit-written",
            "active-written",
        ],
        ["releasing-written", "limit-lifted", "netdev-returned", "released-written"],
    ),
}


def policy_rules(netns: str) -> list[str]:
    """The netns's rules that look up a table other than local, main and default."""
    rules = ip("rule", "show", netns=netns) + ip("-6", "rule", "show", netns=netns)
    return [r for r in rules.splitlines() if r.split()[-1] not in ("local", "main", "default")]


def prepare_host(rig: Rig) -> None:
    """Give the host netdev settings a release must restore."""
    nic = rig.nic("sim0")
    ip("link", "set", nic, "mtu", "1450")
    ip("addr", "add", "198.51.100.7/24", "dev", nic)
    ip("link", "set", nic, "up")


async def claim(rig: Rig, netns: str, options: dict[str, Variant]) -> str:
    path: str = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, options)
    return path


async def crash_once(rig: Rig, netns: str, op: str, options: dict[str, Variant]) -> str:
    """Make the call that hits the armed crash point; return the error the caller got."""
    if op == "release":
        path = await claim(rig, netns, options)
        cid = await rig.client.prop(path, "io.rdmad1.Claim", "Id")
        call = rig.client.manager("Release", "s", cid)
    else:
        call = claim(rig, netns, options)
    with pytest.raises(DBusCallError) as err:
        await call
    assert rig.daemon.proc is not None
    assert await rig.daemon.proc.wait() == 137, f"no crash:\n{rig.daemon.log()}"
    return err.value.name


@pytest.mark.parametrize("op", ["claim", "release"])
@pytest.mark.parametrize("kind", list(KINDS))
async def test_crash_at_every_step_leaves_each_device_home_or_claimed(
    bus_address: str, tmp_path: Path, netns: str, kind: str, op: str
) -> None:
    """One daemon per step, chained: each restart after a crash is armed for the next step,
    so every restart is also a reconciliation under test."""
    mode, options, claim_steps, release_steps = KINDS[kind]
    steps = claim_steps if op == "claim" else release_steps
    env = {CRASH_AT: steps[0]}
    cgroups = make_tree(tmp_path / "cgroup", POD_CGROUP)
    extra = ["--cgroup-root", str(cgroups)]
    async with reliability_rig(
        bus_address, tmp_path, 1, sim_mode=mode, env=env, extra=extra
    ) as rig:
        prepare_host(rig)
        settings = settings_of(rig.nics)
        for i, step in enumerate(steps):
            error = await crash_once(rig, netns, op, options)
            assert error == "org.freedesktop.DBus.Error.NoReply", error
            await restart(rig, {CRASH_AT: steps[i + 1]} if i + 1 < len(steps) else {})
            claims = await rig.client.manager("ListClaims")
            report = await assert_invariants(rig.client, rig.nics, settings, [netns])
            held = "claimed" if claims else "home"
            print(f"{kind:9} {op:7} crash@{step:18} -> {held}, stranded={report.stranded}")
            line = written_line(cgroups, POD_CGROUP, "sim0")
            if op == "claim" and step == "active-written":
                assert len(claims) == 1, "a claim written ACTIVE survives the crash"
                assert line == (LIMIT if kind == "limited" else None)
                await rig.client.call_raw(BUS_NAME, claims[0][5], "io.rdmad1.Claim", "Release")
            else:
                assert line in (None, NO_LIMIT), f"crash at {step} left the limit {line}"
                # Every earlier claim step is undone at start; every release step finished.
                assert claims == [], f"crash at {step} must not leave a claim: {claims}"
                assert link(rig.nic("sim0")) is not None
                assert policy_rules(netns) == [], f"crash at {step} left rules"
        # The last daemon is not armed: the device still works end to end.
        path = await claim(rig, netns, options)
        await rig.client.call_raw(BUS_NAME, path, "io.rdmad1.Claim", "Release")
        await assert_invariants(rig.client, rig.nics, settings, [netns])


async def test_a_give_back_the_kernel_refuses_at_restart_leaves_rdmad_serving_the_claim(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    """Killed mid-release; while it is down, the claimed netdev leaves the claim's netns
    (someone moved it on), so the restart's give-back finds no netdev to bring home: rdmad
    still comes up, says so in its status, shows the claim not-returned with the kernel's
    reason, refuses a Release while the netdev is away, and releases it once it is back."""
    env = {CRASH_AT: "releasing-written"}
    async with reliability_rig(bus_address, tmp_path, 1, env=env) as rig:
        prepare_host(rig)
        settings = settings_of(rig.nics)
        await crash_once(rig, netns, "release", WHOLE)
        with temp_netns("away") as away:
            ip("link", "set", "rdma0", "netns", away, netns=netns)
            await restart(rig)
            ready = [m for m in rig.daemon.notified if "READY=1" in m.split("\n")][-1]
            assert "could not give back 1 claim at start" in ready, ready
            ((claim_id, *_, path),) = await rig.client.manager("ListClaims")
            assert await rig.client.prop(path, CLAIM_IFACE, "State") == "not-returned"
            failure = await rig.client.prop(path, CLAIM_IFACE, "Failure")
            assert "bringing rdma0 home" in failure and "ENODEV" in failure, failure
            with pytest.raises(DBusCallError):
                await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")
            assert [c[0] for c in await rig.client.manager("ListClaims")] == [claim_id]
            ip("link", "set", "rdma0", "netns", netns, netns=away)
        since = rig.client.mark()
        await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")
        released = await rig.client.wait_signal("Released", lambda b: b[0] == claim_id, since=since)
        assert released[2] == "requested"
        assert await rig.client.manager("ListClaims") == []
        await assert_invariants(rig.client, rig.nics, settings, [netns])


async def test_a_netdev_a_killed_release_brought_home_is_restored_though_its_netns_then_died(
    bus_address: str, tmp_path: Path
) -> None:
    """Killed right after the release's move home (the netdev arrives down, without its
    addresses), then the claim's netns deleted while rdmad is down: the netdev is a virtual
    one (a veth here; a bond or a VLAN under RoCE on hardware), which would have died with
    the netns had it still been there, but it is home. The restart gives it its host
    settings back (found by the chaos soak: it stayed down, without its address)."""
    env = {CRASH_AT: "netdev-moved-home"}
    async with reliability_rig(bus_address, tmp_path, 1, env=env) as rig:
        prepare_host(rig)
        settings = settings_of(rig.nics)
        with temp_netns("dying") as netns:
            await crash_once(rig, netns, "release", WHOLE)
        await restart(rig)
        assert await rig.client.manager("ListClaims") == []
        await assert_invariants(rig.client, rig.nics, settings)


async def test_a_release_killed_after_its_end_was_saved_is_told_by_the_next_start(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    """Killed between the release's end saved and its Released sent: the next start sends
    it, with the release's own reason (found by the chaos soak: a claim acknowledged, then
    gone without a Released)."""
    async with reliability_rig(bus_address, tmp_path, 1, env={CRASH_AT: "released-written"}) as rig:
        path = await claim(rig, netns, SHARED)
        claim_id = await rig.client.prop(path, CLAIM_IFACE, "Id")
        since = rig.client.mark()
        with pytest.raises(DBusCallError):
            await rig.client.manager("Release", "s", claim_id)
        assert rig.daemon.proc is not None
        assert await rig.daemon.proc.wait() == 137, f"no crash:\n{rig.daemon.log()}"
        await restart(rig)
        released = await rig.client.wait_signal("Released", lambda b: b[0] == claim_id, since=since)
        assert released[2] == "requested"
        assert await rig.client.manager("ListClaims") == []
