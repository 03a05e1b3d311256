"""rdmad in the test process, so that a simulated device can be hot-plugged: the real Core,
rtnetlink backend and bus service on the test's bus, and a sim whose device stays out of
the kernel's view until plug(), and leaves it at unplug() (each with the udev event the
kernel's device makes). No outside process can plug a sim device into a running daemon."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from rdmad.bus.service import connect_bus, start_service
from rdmad.core.core import Core
from rdmad.core.events import RdmaChanged
from rdmad.core.store import Store
from rdmad.kernel.cgroup import KernelCgroups
from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_events import RtnlEventSource
from rdmad.kernel.sim import SimRdma
from rdmad.model import RdmaDevice


class UnpluggedSim(SimRdma):
    """A SimRdma whose `unplugged` devices the kernel does not show until plug()."""

    def __init__(
        self,
        devices: list[tuple[str, str]],
        resolver: KernelNetnsResolver,
        rtnl: NlChannel,
        unplugged: set[str],
    ) -> None:
        super().__init__(devices, resolver, rtnl)
        self._unplugged = set(unplugged)

    async def list_devices(self) -> list[RdmaDevice]:
        return [d for d in await super().list_devices() if d.name not in self._unplugged]

    async def get_device(self, index: int) -> RdmaDevice | None:
        device = await super().get_device(index)
        return None if device is None or device.name in self._unplugged else device

    def plug(self, name: str) -> RdmaChanged:
        """The device appears; returns the event udev reports for it."""
        self._unplugged.discard(name)
        return RdmaChanged(f"add infiniband/{name}")

    def unplug(self, name: str) -> RdmaChanged:
        """The device goes (hot-unplug, driver unbound); returns udev's event for it."""
        self._unplugged.add(name)
        return RdmaChanged(f"remove infiniband/{name}")


class HotplugRdmad:
    def __init__(self, core: Core, sim: UnpluggedSim) -> None:
        self.core = core
        self.sim = sim

    def plug(self, name: str) -> None:
        self.core.handle(self.sim.plug(name))

    def unplug(self, name: str) -> None:
        self.core.handle(self.sim.unplug(name))


@contextlib.asynccontextmanager
async def hotplug_rdmad(
    bus_address: str, workdir: Path, devices: list[tuple[str, str]], unplugged: set[str]
) -> AsyncIterator[HotplugRdmad]:
    resolver = KernelNetnsResolver()
    net = await RtnlBackend.create(resolver)
    sim = UnpluggedSim(devices, resolver, net.channel, unplugged)
    core = Core(net, sim, resolver, Store(workdir / "state"), cgroups=KernelCgroups())
    source = RtnlEventSource()
    await source.start(core.handle)
    await core.start()
    bus = await connect_bus(bus_address)
    service = await start_service(bus, core, resolver)
    core.announce_startup()
    try:
        yield HotplugRdmad(core, sim)
    finally:
        await service.stop()
        bus.disconnect()
        await source.stop()
        await core.quiesce()
        await core.close()
        await sim.close()
        await net.close()
        resolver.close()
