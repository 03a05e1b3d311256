"""Netlink overrun: the rtnetlink event socket loses events (ENOBUFS). A claimed netns dies
inside a burst of link add/del while the daemon cannot read (SIGSTOP), with a tiny receive
buffer, so its RTM_DELNSID is among the lost. The daemon must notice, resynchronise from a
full dump, end the dead claims, and end with an inventory equal to the kernel's."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dbus_fast import Variant

from testbed.faulty_rdmad import RCVBUF
from testbed.net import eventually, ip, temp_netns, unique_name
from tests.reliability.conftest import reliability_rig, settings_of
from tests.support.invariants import assert_invariants

BURST = 300  # netdevs added and deleted while the daemon is stopped
OVERRUN = "events were lost (socket overrun): resynchronising"


def of(device: str) -> Callable[[list[Any]], bool]:
    return lambda body: bool(body[1] == device)


def burst(count: int) -> None:
    """`count` netdevs (veth pairs: no dummy module here) added, then deleted, in two
    `ip -batch` runs: fast, and no Python between the events."""
    names = [unique_name("ov", room=1) for _ in range(count // 2)]
    adds = [f"link add {n} type veth peer name {n}p" for n in names]
    dels = [f"link del {n}" for n in names]
    for lines in (adds, dels):
        with tempfile.NamedTemporaryFile("w", suffix=".batch") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            subprocess.run(["ip", "-batch", f.name], check=True)


async def test_overrun_is_detected_and_resynchronised_to_the_kernels_inventory(
    bus_address: str, tmp_path: Path
) -> None:
    env = {RCVBUF: "4096"}
    a, b = unique_name("ovns"), unique_name("ovns")
    ip("netns", "add", a)
    ip("netns", "add", b)
    try:
        async with reliability_rig(bus_address, tmp_path, 3, env=env) as rig:
            settings = settings_of(rig.nics)
            shared = {"shared": Variant("b", True)}
            await rig.client.manager("Claim", "ssa{sv}", "sim0", a, shared)
            await rig.client.manager("Claim", "ssa{sv}", "sim1", b, {})
            other = {**shared, "ifname": Variant("s", "net2")}
            kept = await rig.client.manager("Claim", "ssa{sv}", "sim2", a, other)
            kept_id = await rig.client.prop(kept, "io.rdmad1.Claim", "Id")
            await rig.client.manager("Release", "s", kept_id)
            mark = rig.client.mark()
            assert rig.daemon.proc is not None
            pid = rig.daemon.proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                burst(BURST)
                ip("netns", "del", a)
                ip("netns", "del", b)
            finally:
                os.kill(pid, signal.SIGCONT)
            await eventually(lambda: OVERRUN in rig.daemon.log(), 20, "the overrun to be logged")
            ended = {
                (await rig.client.wait_signal("Released", of(d), since=mark, timeout=20))[2]
                for d in ("sim0", "sim1")
            }
            assert ended == {"netns-gone"}
            assert await rig.client.manager("ListClaims") == []
            report = await assert_invariants(
                rig.client, rig.nics, {d: settings[d] for d in ("sim0", "sim2")}
            )
            resyncs = rig.daemon.log().count(OVERRUN)
            print(
                f"overrun: {BURST} links added+deleted + 2 netns deleted while stopped, "
                f"rcvbuf 4096: {resyncs} resync(s), 2 claims ended netns-gone, {report.summary()}"
            )
            # and the daemon still works on the resynchronised inventory
            with temp_netns("ov") as c:
                path = await rig.client.manager("Claim", "ssa{sv}", "sim2", c, {})
                await rig.client.call_raw("io.rdmad1", path, "io.rdmad1.Claim", "Release")
    finally:
        ip("netns", "del", a, check=False)
        ip("netns", "del", b, check=False)
