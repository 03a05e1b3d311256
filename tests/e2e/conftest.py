"""End-to-end fixtures: a private dbus-daemon, real veths and netns, the real rdmad process
with the simulated RDMA backend (explicitly chosen) bound to those veths."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.daemon import Client, RdmadProcess
from tests.support.net import VethPair, require_root, temp_veth


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root()


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
    bus_address: str, workdir: Path, sim_mode: str = "shared", extra: list[str] | None = None
) -> AsyncIterator[Rig]:
    with temp_veth("e2") as a, temp_veth("e2") as b:
        nics = {"sim0": a, "sim1": b}
        spec = ",".join(f"{dev}={pair.host}" for dev, pair in nics.items())
        daemon = RdmadProcess(bus_address, workdir, spec, sim_mode, extra or [])
        await daemon.start()
        client = await Client.connect(bus_address)
        try:
            yield Rig(daemon, client, nics)
        finally:
            client.close()
            await daemon.kill()


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path) as r:
        yield r


@pytest.fixture
async def exclusive_rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, sim_mode="exclusive") as r:
        yield r
