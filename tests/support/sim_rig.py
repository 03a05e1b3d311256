"""The real rdmad process with the simulated RDMA backend (explicitly chosen) bound to
fresh veths (two unless asked), and a client on its bus: the rig of the e2e, CNI and
reliability suites."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from testbed.daemon import Client, RdmadProcess
from testbed.net import VethPair, temp_veth


@dataclass
class Rig:
    """A running rdmad, a client on its bus, and the veths behind its two sim devices."""

    daemon: RdmadProcess
    client: Client
    nics: dict[str, VethPair]  # sim device name -> its veth (host end is the netdev)

    def nic(self, device: str) -> str:
        return self.nics[device].host


@contextlib.asynccontextmanager
async def running_rig(
    bus_address: str,
    workdir: Path,
    sim_mode: str = "shared",
    extra: list[str] | None = None,
    pci: dict[str, str] | None = None,
    devices: int = 2,
) -> AsyncIterator[Rig]:
    """sim0, sim1... (`devices` of them) on new veths (`pci`: their PCI addresses, by
    device name)."""
    with contextlib.ExitStack() as stack:
        nics = {f"sim{n}": stack.enter_context(temp_veth("sr")) for n in range(devices)}
        at = pci or {}
        spec = ",".join(
            f"{dev}={pair.host}" + (f"@{at[dev]}" if dev in at else "")
            for dev, pair in nics.items()
        )
        daemon = RdmadProcess(bus_address, workdir, spec, sim_mode, extra or [])
        await daemon.start()
        client = await Client.connect(bus_address)
        try:
            yield Rig(daemon, client, nics)
        finally:
            client.close()
            await daemon.kill()
