"""Fixtures for the reliability suite: the real daemon (sim RDMA on real veths) with test
fault injection, N devices, and helpers to wait on a process state without sleeping blind.

The rig of tests/support/sim_rig.py is reused, not copied (`bus_address` and `netns` come from
tests/conftest.py): `reliability_rig` builds the same `Rig` with more devices and the fault
variables of testbed/faulty_rdmad.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from testbed.daemon import Client, RdmadProcess
from testbed.net import VethPair, temp_veth
from tests.support.invariants import HostSettings, host_settings
from tests.support.sim_rig import Rig


@pytest.fixture(autouse=True)
def _root(root: None) -> None:
    """Every test here needs root (the `root` marker, from tests/conftest.py)."""


@contextlib.asynccontextmanager
async def reliability_rig(
    bus: str,
    workdir: Path,
    devices: int = 2,
    *,
    sim_mode: str = "shared",
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> AsyncIterator[Rig]:
    """A running daemon with `devices` sim devices on fresh veths; killed afterwards."""
    with contextlib.ExitStack() as stack:
        nics = {f"sim{i}": stack.enter_context(temp_veth("rl")) for i in range(devices)}
        spec = ",".join(f"{dev}={pair.host}" for dev, pair in nics.items())
        daemon = RdmadProcess(bus, workdir, spec, sim_mode, extra or [], env or {})
        await daemon.start()
        client = await Client.connect(bus)
        try:
            yield Rig(daemon, client, nics)
        finally:
            client.close()
            await daemon.kill()


def settings_of(nics: dict[str, VethPair]) -> dict[str, HostSettings]:
    return {dev: host_settings(pair.host) for dev, pair in nics.items()}


def is_stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except FileNotFoundError:
        return False


async def restart(rig: Rig, env: dict[str, str] | None = None) -> None:
    """Start the rig's daemon again (after a crash), with `env` replacing the test env."""
    rig.daemon.env = env or {}
    await rig.daemon.start()
