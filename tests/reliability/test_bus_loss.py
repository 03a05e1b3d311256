"""Losing the bus: rdmad exits so that systemd restarts it (Restart=on-failure), and its
claims, which are kernel state, survive into the next instance."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dbus_fast import Variant

from rdmad.daemon.main import EXIT_BUS
from testbed.bus import start_private_bus
from testbed.daemon import Client, RdmadProcess
from testbed.faulty_rdmad import PAUSE_AT
from testbed.net import link, temp_veth
from tests.reliability.conftest import reliability_rig, restart, settings_of
from tests.reliability.test_faults import paused_at
from tests.support.invariants import assert_invariants
from tests.support.sim_rig import Rig


async def test_bus_daemon_death_makes_rdmad_exit_for_a_restart_and_keeps_claims(
    tmp_path: Path, netns: str
) -> None:
    with temp_veth("rl") as pair:
        nics = {"sim0": pair}
        with start_private_bus() as bus:
            daemon = RdmadProcess(bus.address, tmp_path, f"sim0={pair.host}")
            await daemon.start()
            client = await Client.connect(bus.address)
            try:
                path = await client.manager(
                    "Claim", "ssa{sv}", "sim0", netns, {"ifname": Variant("s", "rdma0")}
                )
                cid = await client.prop(path, "io.rdmad1.Claim", "Id")
                bus.process.kill()  # the bus daemon dies
                assert daemon.proc is not None
                assert await daemon.proc.wait() == EXIT_BUS, daemon.log()
                assert "lost the bus connection" in daemon.log()
            finally:
                client.close()
                await daemon.kill()
        assert link("rdma0", netns) is not None, "the claim stays in the kernel meanwhile"
        with start_private_bus() as bus:  # "systemd restarts both"
            daemon.bus_address = bus.address
            await daemon.start()
            client = await Client.connect(bus.address)
            try:
                assert [c[0] for c in await client.manager("ListClaims")] == [cid]
                report = await assert_invariants(client, nics, None, [netns])
                print(f"bus lost: rdmad exit {EXIT_BUS}, claim kept, {report.summary()}")
            finally:
                client.close()
                await daemon.kill()


async def test_a_second_rdmad_cannot_take_the_name_and_the_first_keeps_serving(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    with temp_veth("rl") as pair:
        first = RdmadProcess(bus_address, tmp_path / "a", f"sim0={pair.host}")
        (tmp_path / "a").mkdir()
        await first.start()
        client = await Client.connect(bus_address)
        try:
            await client.manager("Claim", "ssa{sv}", "sim0", netns, {})
            (tmp_path / "b").mkdir()
            second = RdmadProcess(bus_address, tmp_path / "b", f"sim0={pair.host}")
            with pytest.raises(RuntimeError, match=f"exited with {EXIT_BUS}"):
                await second.start()
            assert len(await client.manager("ListClaims")) == 1
            await assert_invariants(client, {"sim0": pair}, None, [netns])
        finally:
            client.close()
            await first.kill()


@pytest.mark.parametrize("step", ["pending-written", "netdev-placed", "active-written"])
async def test_bus_daemon_death_mid_claim_makes_rdmad_exit_with_no_traceback_and_strand_nothing(
    tmp_path: Path, netns: str, step: str
) -> None:
    """The claim's kernel steps finish; its reply, signals and any call to the bus daemon
    meet a closed connection, which rdmad logs in one line, not a traceback per message."""
    with start_private_bus() as bus:
        async with reliability_rig(bus.address, tmp_path, 1, env={PAUSE_AT: step}) as rig:
            settings = settings_of(rig.nics)
            options = {"ifname": Variant("s", "rdma0")}
            call = asyncio.ensure_future(
                rig.client.manager("Claim", "ssa{sv}", "sim0", netns, options)
            )
            async with paused_at(rig):
                bus.process.kill()  # the bus daemon dies while rdmad is mid-claim
                bus.process.wait()
            with pytest.raises((EOFError, OSError)):
                await call  # the client's connection went with the bus
            assert rig.daemon.proc is not None
            assert await rig.daemon.proc.wait() == EXIT_BUS, rig.daemon.log()
            log = rig.daemon.log()
            assert "lost the bus connection" in log
            assert "Traceback" not in log, log
            with start_private_bus() as new_bus:  # "systemd restarts both"
                await restart_on(rig, new_bus.address)
                listed = await rig.client.manager("ListClaims")
                report = await assert_invariants(rig.client, rig.nics, settings, [netns])
                print(
                    f"bus lost at {step}: {len(listed)} claim(s) after restart, {report.summary()}"
                )


async def restart_on(rig: Rig, address: str) -> None:
    """The rig's rdmad started again, unarmed, on the bus at `address`, and its client there."""
    rig.client.close()
    rig.daemon.bus_address = address
    await restart(rig)
    rig.client = await Client.connect(address)
