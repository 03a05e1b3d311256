"""Test doubles for the bus edge only: a core that satisfies rdmad.bus.objects.CoreAPI, and
the in-memory kernel's netns resolver. End-to-end tests use the real Core."""

from __future__ import annotations

import os

from rdmad.core.backend import NetnsResolver, NetnsTarget
from rdmad.core.observer import CoreObserver
from rdmad.core.opstats import OpStats
from rdmad.errors import NoSuchClaim, NoSuchDevice
from rdmad.model import (
    Attachment,
    CharDev,
    ChardevKind,
    Claim,
    ClaimOptions,
    ClaimPhase,
    Counters,
    CounterScope,
    DeviceState,
    DeviceView,
    Gid,
    HoldSpec,
    NetnsMode,
    Port,
    PortCounters,
    RdmaDevice,
    RdmaUsage,
    ReleaseReason,
)
from tests.support.fake_kernel import FakeKernel

NOBODY = 65534
DAEMON = 1  # the "daemon" and "sys" users of Debian's base-passwd
SYS = 3

MLX = RdmaDevice(
    index=1,
    name="mlx5_0",
    node_guid="0002:c903:0031:7a40",
    driver="mlx5_core",
    link_layer="Ethernet",
    ports=(Port(1, "ACTIVE", "LINK_UP", "ens1f0"),),
    netdev="ens1f0",
    netdev_ifindex=7,
    pci_address="0000:3b:00.0",
    numa_node=0,
    chardevs=("/dev/infiniband/uverbs0",),
)


def fake_resolver() -> NetnsResolver:
    """Resolves `ns1` (root's), `uid65534`, `uid1` and `uid3` (each made in that uid's
    user namespace), and an fd on the test's own netns (as a caller passes to ClaimFd)."""
    kernel = FakeKernel()
    kernel.add_netns("ns1")
    for uid in (NOBODY, DAEMON, SYS):
        kernel.add_netns(f"uid{uid}", owner_uid=uid)
    kernel.add_netns("callers-own", inode=os.stat("/proc/self/ns/net").st_ino)
    return kernel.process().resolver


class FakeCore:
    def __init__(self) -> None:
        self.netns_mode = NetnsMode.SHARED
        self.shared_limit = 16
        self.observers: list[CoreObserver] = []
        self.devs: dict[str, RdmaDevice] = {MLX.name: MLX}
        self.claims_by_id: dict[str, Claim] = {}
        self.fail_with: BaseException | None = None  # raised by the next mutating call
        self.last_options: ClaimOptions | None = None
        self.stats = OpStats()
        self.port_counters: dict[str, int] = {}  # port 1 of every device
        self.usage: RdmaUsage | None = None  # every claim's with a cgroup
        self._n = 0

    def _maybe_fail(self) -> None:
        if self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            raise exc

    def add_observer(self, observer: CoreObserver) -> None:
        self.observers.append(observer)

    def _view(self, dev: RdmaDevice) -> DeviceView:
        ids = tuple(c.id for c in self.claims_by_id.values() if c.device == dev.name)
        state = DeviceState.SHARED if ids else DeviceState.AVAILABLE
        return DeviceView(dev, state, "init", ids)

    def devices(self) -> list[DeviceView]:
        return [self._view(d) for d in self.devs.values()]

    def device(self, name: str) -> DeviceView:
        if name not in self.devs:
            raise NoSuchDevice(f"no RDMA device {name!r}")
        return self._view(self.devs[name])

    def claims(self) -> list[Claim]:
        return list(self.claims_by_id.values())

    async def device_counters(self, name: str) -> Counters:
        self.device(name)
        return Counters(CounterScope.DEVICE, (PortCounters(1, dict(self.port_counters)),))

    async def claim_counters(self, claim_id: str) -> Counters:
        claim = self.get_claim(claim_id)
        scope = CounterScope.DEVICE if claim.shared else CounterScope.CLAIM
        return Counters(scope, (PortCounters(1, dict(self.port_counters)),))

    def rdma_usage(self, claim_id: str) -> RdmaUsage | None:
        claim = self.get_claim(claim_id)
        return self.usage if claim.cgroup else None

    def get_claim(self, claim_id: str) -> Claim:
        if claim_id not in self.claims_by_id:
            raise NoSuchClaim(f"no claim {claim_id!r}")
        return self.claims_by_id[claim_id]

    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim:
        target.close()
        self._maybe_fail()
        self.device(device)
        self.last_options = options
        self._n += 1
        claim = Claim(
            id=f"c{self._n}",
            device=device,
            attachment=Attachment(target.inode, target.path, self._n),
            ifname=options.ifname or "net1",
            shared=options.shared,
            owner=options.owner,
            claimant=options.claimant,
            created_at_us=1_700_000_000_000_000,
            chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
            cdi_device=f"rdmad.io/rdma=c{self._n}",
            cgroup=options.cgroup,
            limit=options.limit,
        )
        self.claims_by_id[claim.id] = claim
        for o in self.observers:
            o.claimed(claim)
            o.device_changed(self.device(device))
        return claim

    async def hold(self, device: str, pod_uid: str, options: ClaimOptions) -> Claim:
        self._maybe_fail()
        self.device(device)
        self.last_options = options
        self._n += 1
        claim = Claim(
            id=f"c{self._n}",
            device=device,
            attachment=None,
            ifname=options.ifname or "net1",
            shared=options.shared,
            owner=options.owner,
            claimant=options.claimant,
            created_at_us=1_700_000_000_000_000,
            cdi_device=f"rdmad.io/rdma=c{self._n}",
            phase=ClaimPhase.HELD,
            hold=HoldSpec(pod_uid),
        )
        self.claims_by_id[claim.id] = claim
        for o in self.observers:
            o.claimed(claim)
        return claim

    async def attach(
        self, pod_uid: str, target: NetnsTarget, ifname: str, options: ClaimOptions
    ) -> list[Claim]:
        target.close()
        self._maybe_fail()
        self.last_options = options
        held = [
            c
            for c in self.claims_by_id.values()
            if c.hold and c.hold.pod_uid == pod_uid and (not ifname or c.ifname == ifname)
        ]
        for claim in held:
            claim.phase = ClaimPhase.ACTIVE
            claim.attachment = Attachment(target.inode, target.path, -1)
            for o in self.observers:
                o.claim_changed(claim)
        return held

    async def detach(self, claim_id: str) -> None:
        self._maybe_fail()
        claim = self.get_claim(claim_id)
        claim.phase, claim.attachment = ClaimPhase.HELD, None
        for o in self.observers:
            o.claim_changed(claim)

    async def release(self, claim_id: str) -> None:
        self._maybe_fail()
        claim = self.get_claim(claim_id)
        del self.claims_by_id[claim_id]
        for o in self.observers:
            o.released(claim, ReleaseReason.REQUESTED)
            o.device_changed(self.device(claim.device))

    async def set_netns_mode(self, mode: NetnsMode) -> None:
        self._maybe_fail()
        self.netns_mode = mode
        for o in self.observers:
            o.mode_changed(mode)

    # What the kernel would tell the real core, told to the observers as the core tells them.

    def plug(self, dev: RdmaDevice) -> None:
        self.devs[dev.name] = dev
        for o in self.observers:
            o.device_added(self._view(dev))

    def unplug(self, name: str) -> None:
        view = self._view(self.devs.pop(name))
        for o in self.observers:
            o.device_removed(view)

    def set_gids(self, claim_id: str, gids: tuple[Gid, ...]) -> None:
        claim = self.get_claim(claim_id)
        claim.attached.gids = gids
        for o in self.observers:
            o.claim_changed(claim)
