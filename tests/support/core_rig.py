"""The real Core over the in-memory kernel (tests/support/fake_kernel.py), started the way
rdmad.daemon.main starts it, with an observer that records what callers would be told."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rdmad.core.core import Core
from rdmad.core.observer import CoreObserver
from rdmad.core.store import State, Store
from rdmad.errors import KernelError
from rdmad.model import Claim, DeviceState, DeviceView, HostConfig, NetnsMode, ReleaseReason
from tests.support.fake_kernel import INIT, FakeKernel, Process

WAIT = 5.0


@dataclass
class Recorder(CoreObserver):
    """Everything the core told its observers, in order."""

    views: list[DeviceView] = field(default_factory=list)  # added or changed
    removed: list[str] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # claim ids
    changed: list[str] = field(default_factory=list)  # claim ids, each time one changed
    ended: list[tuple[str, ReleaseReason]] = field(default_factory=list)
    modes: list[NetnsMode] = field(default_factory=list)
    _told: asyncio.Event = field(default_factory=asyncio.Event)

    def _note(self) -> None:
        self._told.set()

    def device_added(self, view: DeviceView) -> None:
        self.views.append(view)
        self._note()

    def device_changed(self, view: DeviceView) -> None:
        self.views.append(view)
        self._note()

    def device_removed(self, view: DeviceView) -> None:
        self.removed.append(view.device.name)
        self._note()

    def claimed(self, claim: Claim) -> None:
        self.made.append(claim.id)
        self._note()

    def claim_changed(self, claim: Claim) -> None:
        self.changed.append(claim.id)
        self._note()

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        self.ended.append((claim.id, reason))
        self._note()

    def mode_changed(self, mode: NetnsMode) -> None:
        self.modes.append(mode)
        self._note()

    async def wait_for(self, what: Callable[[], bool], timeout: float = WAIT) -> None:
        async with asyncio.timeout(timeout):
            while not what():
                self._told.clear()
                await self._told.wait()

    async def wait_released(self, claim_id: str, timeout: float = WAIT) -> ReleaseReason:
        await self.wait_for(lambda: any(c == claim_id for c, _ in self.ended), timeout)
        return next(r for c, r in self.ended if c == claim_id)

    def mark(self) -> int:
        return len(self.views)

    def state_changes(self, device: str, since: int, was: DeviceState) -> list[str]:
        """The device's State as a bus client sees it change after `since` (a PropertiesChanged
        is sent only when the value differs from the last one)."""
        out, last = [], was
        for view in self.views[since:]:
            if view.device.name == device and view.state != last:
                last = view.state
                out.append(str(last))
        return out


class FlakyStore(Store):
    """The real state file, on a disk the test can fill: saves fail with ENOSPC while full."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.full = False
        self.fail_after = -1  # saves that succeed before the disk fills (-1: never fills)

    def save(self, state: State) -> None:
        self._disk()
        super().save(state)

    def save_claim(self, claim: Claim, *, live: bool, pending_restores: list[HostConfig]) -> None:
        self._disk()
        super().save_claim(claim, live=live, pending_restores=pending_restores)

    def _disk(self) -> None:
        if self.fail_after == 0:
            self.full = True
        self.fail_after -= 1
        if self.full:
            raise KernelError(errno.ENOSPC, f"cannot write state file {self.path}")


@dataclass
class Rig:
    """One daemon's Core on the fake kernel, and what it told its observers."""

    kernel: FakeKernel
    store: Store
    process: Process
    core: Core
    seen: Recorder
    rigs: Rigs

    async def crash(self) -> None:
        """As SIGKILL: no more events reach it, its fds close, its state file stays."""
        await self.stop()
        self.process.crash()

    async def quiesce(self) -> None:
        """Let whatever the last step set going (the events of it, the re-reads and view
        announcements they cause, the claims they end) run to its end (Core.quiesce), or
        fail the test if that takes longer than WAIT (a job stopped at a paused step)."""
        async with asyncio.timeout(WAIT):
            await self.core.quiesce()

    async def restart(self) -> Rig:
        """Crash it, then start a fresh daemon on the same kernel and state file."""
        await self.crash()
        return await self.rigs.start(self.kernel, self.store)

    async def stop(self) -> None:
        if self.kernel.sink == self.core.handle:
            self.kernel.attach(None)
        await self.core.close()

    def state(self, device: str) -> DeviceState:
        return self.core.device(device).state


class Rigs:
    """Starts daemons (each a Core on its own fake process) and stops them all at the end."""

    def __init__(self, state: Path) -> None:
        self._state = state  # the state directory of a daemon started without a store
        self._started: list[Rig] = []

    async def start(
        self,
        kernel: FakeKernel,
        store: Store | None = None,
        *,
        shared_limit: int = 16,
        announce: bool = True,
    ) -> Rig:
        """As rdmad.daemon.main: events subscribed first, then start, observers, and (unless
        `announce` is False: the daemon still taking its bus name) the Released of the
        claims ended since start. `store`: the test's own, else one on the test's state
        directory."""
        store = Store(self._state) if store is None else store
        process = kernel.process()
        core = Core(
            process.net,
            process.rdma,
            process.resolver,
            store,
            cgroups=kernel.cgroups,
            shared_limit=shared_limit,
        )
        kernel.attach(core.handle)
        await core.start()
        seen = Recorder()
        core.add_observer(seen)
        if announce:
            core.announce_startup()
        rig = Rig(kernel, store, process, core, seen, self)
        self._started.append(rig)
        return rig

    async def close(self) -> None:
        for rig in self._started:
            await rig.stop()


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[Rigs]:
    """Starts Cores, each on a fake kernel and (unless given another) a state directory in
    `tmp_path`, and stops them when the test ends."""
    started = Rigs(tmp_path)
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def rig(rigs: Rigs) -> Rig:
    """A Core started on two_nics() in shared mode, its state in `tmp_path`."""
    return await rigs.start(two_nics())


def two_nics(mode: NetnsMode = NetnsMode.SHARED) -> FakeKernel:
    """A host with mlx5_0 on eth0 and mlx5_1 on eth1 (hardware: their netdevs may move),
    each NIC configured (MTU 1500, up, one address), and a netns `pod` to claim into."""
    kernel = FakeKernel(mode)
    for n in (0, 1):
        kernel.add_nic(f"eth{n}", mtu=1500, addresses=(f"192.0.2.{n + 1}/24",))
        kernel.add_rdma(f"mlx5_{n}", f"eth{n}")
    kernel.add_netns("pod")
    return kernel


HostSide = dict[str, tuple[int, int, bool, tuple[str, ...]]]


def host_side(kernel: FakeKernel) -> HostSide:
    """init_net's netdevs: name -> (ifindex, MTU, admin state, addresses)."""
    return {
        x.name: (x.ifindex, x.mtu, x.up, x.addresses)
        for x in kernel.links.values()
        if x.netns == INIT
    }
