"""Faults while claims live: the netns dies mid-claim or mid-release (the daemon is paused
at a known step with RDMAD_TEST_PAUSE_AT while the test deletes the netns), the device is
hot-unplugged while claimed, the netdev is renamed behind the daemon's back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from rdmad.core.core import Core
from rdmad.core.events import RdmaChanged
from rdmad.core.observer import CoreObserver
from rdmad.core.store import Store
from rdmad.kernel.cgroup import KernelCgroups
from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_events import RtnlEventSource
from rdmad.kernel.sim import SimRdma
from rdmad.model import Claim, ClaimOptions, ReleaseReason
from testbed.daemon import DBusCallError
from testbed.faulty_rdmad import PAUSE_AT
from testbed.net import eventually, ip, link, temp_veth
from tests.reliability.conftest import is_stopped, reliability_rig, settings_of
from tests.support.invariants import (
    DaemonView,
    HostSettings,
    assert_invariants,
    compare,
    host_settings,
)
from tests.support.sim_rig import Rig

Settings = Mapping[str, HostSettings]
OPTIONS = {
    "whole": {"ifname": Variant("s", "rdma0"), "addresses": Variant("as", ["192.0.2.9/24"])},
    "shared": {"shared": Variant("b", True)},
}

SETTINGS: dict[str, Callable[[Settings], Settings | None]] = {
    "whole": lambda _s: None,
    "shared": lambda s: s,
}


@contextlib.asynccontextmanager
async def paused_at(rig: Rig) -> AsyncIterator[None]:
    """Wait until the daemon has stopped itself at its armed step; SIGCONT it on exit."""
    assert rig.daemon.proc is not None
    pid = rig.daemon.proc.pid
    await eventually(lambda: is_stopped(pid), 10, "the daemon to pause at its step")
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def outcome(call: asyncio.Future[Any]) -> str:
    try:
        await call
        return "ok"
    except DBusCallError as e:
        return e.name


@pytest.mark.parametrize("kind", ["whole", "shared"])
async def test_netns_dying_during_a_claim_ends_with_no_claim_and_no_stranded_device(
    bus_address: str, tmp_path: Path, netns: str, kind: str
) -> None:
    env = {PAUSE_AT: "netdev-placed"}
    async with reliability_rig(bus_address, tmp_path, 1, env=env) as rig:
        settings = settings_of(rig.nics)
        mark = rig.client.mark()
        call = asyncio.ensure_future(
            rig.client.manager("Claim", "ssa{sv}", "sim0", netns, OPTIONS[kind])
        )
        async with paused_at(rig):
            ip("netns", "del", netns)  # the daemon's open fd keeps it alive until it is done
        result = await outcome(call)
        if result == "ok":  # it completed in a dying netns: ended as soon as it is gone
            ended = await rig.client.wait_signal("Released", since=mark)
            assert ended[2] == "netns-gone"
        assert await rig.client.manager("ListClaims") == []
        # a whole-device veth dies with its netns: its host settings are moot
        report = await assert_invariants(rig.client, rig.nics, SETTINGS[kind](settings))
        print(f"netns died mid-{kind}-claim: call -> {result}, {report.summary()}")
        assert rig.daemon.proc is not None and rig.daemon.proc.returncode is None


@pytest.mark.parametrize("kind", ["whole", "shared"])
async def test_netns_dying_during_a_release_ends_the_claim_and_strands_nothing(
    bus_address: str, tmp_path: Path, netns: str, kind: str
) -> None:
    env = {PAUSE_AT: "releasing-written"}
    async with reliability_rig(bus_address, tmp_path, 1, env=env) as rig:
        settings = settings_of(rig.nics)
        path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, OPTIONS[kind])
        cid = await rig.client.prop(path, "io.rdmad1.Claim", "Id")
        mark = rig.client.mark()
        call = asyncio.ensure_future(rig.client.manager("Release", "s", cid))
        async with paused_at(rig):
            ip("netns", "del", netns)
        result = await outcome(call)
        released = await rig.client.wait_signal("Released", lambda b: b[0] == cid, since=mark)
        assert await rig.client.manager("ListClaims") == []
        report = await assert_invariants(rig.client, rig.nics, SETTINGS[kind](settings))
        print(
            f"netns died mid-{kind}-release: call -> {result}, signal {released[2]}, "
            f"{report.summary()}"
        )


async def test_netdev_renamed_inside_the_netns_still_comes_home_under_its_host_name(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    async with reliability_rig(bus_address, tmp_path, 1) as rig:
        settings = settings_of(rig.nics)
        path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, OPTIONS["whole"])
        ip("link", "set", "rdma0", "name", "hijack0", netns=netns)  # someone else's rename
        await rig.client.manager(
            "Release", "s", await rig.client.prop(path, "io.rdmad1.Claim", "Id")
        )
        assert link("hijack0", netns) is None
        await assert_invariants(rig.client, rig.nics, settings, [netns])


class ReleasedObserver(CoreObserver):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, ReleaseReason]] = asyncio.Queue()

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        self.queue.put_nowait((claim.id, reason))


async def test_device_removed_while_claimed_is_released_as_device_removed(
    tmp_path: Path, netns: str
) -> None:
    # Hot-unplug cannot be driven from outside a daemon process on this host (no RDMA
    # hardware), so the real Core runs in-process: real rtnetlink backend and events, real
    # netns and veth, the simulated RDMA device unplugged through the simulator.
    resolver = KernelNetnsResolver()
    net = await RtnlBackend.create(resolver)
    source = RtnlEventSource()
    with temp_veth("rl") as pair:
        settings = {"sim0": host_settings(pair.host)}
        sim = SimRdma([("sim0", pair.host)], resolver, net.channel)
        core = Core(net, sim, resolver, Store(tmp_path), cgroups=KernelCgroups())
        observer = ReleasedObserver()
        core.add_observer(observer)
        await source.start(core.handle)
        try:
            await core.start()
            core.announce_startup()
            claim = await core.claim("sim0", resolver.open(netns), ClaimOptions(ifname="rdma0"))
            sim.remove_device("sim0")  # what udev's "remove infiniband/sim0" reports
            core.handle(RdmaChanged("remove infiniband/sim0"))
            got = await asyncio.wait_for(observer.queue.get(), 10)
            assert got == (claim.id, ReleaseReason.DEVICE_REMOVED)
            assert core.claims() == [] and core.devices() == []
            # A real unplug takes the netdev too; here it stays, and must be home.
            view = DaemonView({}, [])
            report = compare(view, {}, None, [netns])
            assert link(pair.host) is not None, "the netdev came back to init_net"
            assert host_settings(pair.host) == settings["sim0"]
            print(f"device removed while claimed: Released {got[1]}, {report.summary()}")
            assert not report.problems
        finally:
            await source.stop()
            await core.close()
            await net.close()
            resolver.close()
