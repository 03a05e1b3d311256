"""2. Netns-death reclaim: from the netns's deletion to Released(netns-gone), against the
kernel's own RTM_DELNSID as the floor.

The netns is deleted in-process exactly as `ip netns del` does it (umount2 MNT_DETACH +
unlink), so t0 is the moment its last reference drops, not a process spawn. The bench and
the daemon both hear about the death through netlink, and both timestamps are taken on
this process's event loop, so delivery costs cancel out.

On this host the claimed netdevs are veths: the kernel destroys them with the netns, so
"back under its host name" cannot happen here (a note in results.md). Each whole-device rep
therefore needs its own veth and sim device; shared (macvlan) claims reuse one parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import time
from collections.abc import Callable
from pathlib import Path

from dbus_fast import Message, MessageType, Variant
from pyroute2 import AsyncIPRoute
from pyroute2.netlink.rtnl import RTM_DELNSID

from bench.common import (
    Params,
    Results,
    Row,
    claim,
    claim_options,
    client,
    many_veths,
    rdmad,
)
from bench.stats import JUDGED, p99_text, pct, spread
from tests.support.net import ip, unique_name

RTNLGRP_NSID = 28
MNT_DETACH = 2
TIMEOUT_S = 10.0


class Clock:
    """perf_counter timestamps of RTM_DELNSID (by nsid) and Released (by claim id)."""

    def __init__(self) -> None:
        self.delnsid: dict[int, float] = {}
        self.released: dict[str, tuple[float, str]] = {}
        self.changed = asyncio.Event()

    def on_dbus(self, msg: Message) -> None:
        if msg.message_type == MessageType.SIGNAL and msg.member == "Released":
            self.released[str(msg.body[0])] = (time.perf_counter(), str(msg.body[2]))
            self.changed.set()

    async def listen_nsid(self, ready: asyncio.Event) -> None:
        ipr = AsyncIPRoute()
        try:
            await ipr.bind(groups=1 << (RTNLGRP_NSID - 1))
            ready.set()
            while True:
                async for msg in ipr.get():
                    if msg["header"]["type"] == RTM_DELNSID:
                        self.delnsid[int(msg.get_attr("NETNSA_NSID"))] = time.perf_counter()
                        self.changed.set()
        finally:
            ipr.close()

    async def both(self, nsid: int, claim_id: str) -> tuple[float, float]:
        async with asyncio.timeout(TIMEOUT_S):
            while nsid not in self.delnsid or claim_id not in self.released:
                self.changed.clear()
                await self.changed.wait()
        at, reason = self.released.pop(claim_id)
        assert reason == "netns-gone", reason
        return self.delnsid.pop(nsid), at


_libc = ctypes.CDLL(None, use_errno=True)


def netns_del(name: str) -> None:
    """What `ip netns del NAME` does: detach the bind mount, remove the file."""
    path = f"/run/netns/{name}".encode()
    if _libc.umount2(path, MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount2 {name}: {os.strerror(err)}")
    os.unlink(path)


async def nsid_of(ipr: AsyncIPRoute, name: str) -> int:
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        got = await ipr.get_netnsid(fd=fd)
    finally:
        os.close(fd)
    return int(got["nsid"])


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    n = p.warmup + p.reps
    with many_veths(n + 1, "r") as nics:
        clock = Clock()
        ready = asyncio.Event()
        listener = asyncio.create_task(clock.listen_nsid(ready))
        ipr = AsyncIPRoute()
        await ipr.setup_endpoint()
        try:
            await ready.wait()
            async with rdmad(bus, nics.sim_spec()) as _d, client(bus) as c:
                c.bus.add_message_handler(clock.on_dbus)
                shared_dev = f"sim{n}"
                kinds: list[tuple[str, Callable[[int], str], dict[str, Variant]]] = [
                    ("whole device", lambda i: f"sim{i}", claim_options(mtu=1400)),
                    ("shared (macvlan)", lambda _i: shared_dev, claim_options(shared=True)),
                ]
                for kind, device_of, opts in kinds:
                    floor: list[float] = []
                    got: list[float] = []
                    gap: list[float] = []
                    for i in range(n):
                        name = unique_name("rbd")
                        ip("netns", "add", name)
                        try:
                            cid = await claim(c, device_of(i), name, opts)
                            nsid = await nsid_of(ipr, name)
                        except BaseException:
                            ip("netns", "del", name, check=False)
                            raise
                        t0 = time.perf_counter()
                        netns_del(name)
                        t_nsid, t_rel = await clock.both(nsid, cid)
                        if i >= p.warmup:
                            floor.append((t_nsid - t0) * 1000)
                            got.append((t_rel - t0) * 1000)
                            gap.append((t_rel - t_nsid) * 1000)
                    res.dists[f"Reclaim {kind}: RTM_DELNSID (floor)"] = floor
                    res.dists[f"Reclaim {kind}: Released(netns-gone)"] = got
                    res.rows.append(
                        Row(
                            f"2. Netns death -> Released(netns-gone), {kind}",
                            spread(got),
                            f"{spread(floor)} (RTM_DELNSID)",
                            "-",
                            f"rdmad - floor, per rep: p50 {pct(gap, 50):.2f}, p90"
                            f" {pct(gap, 90):.2f} ms; {p99_text(gap)}",
                            "within 20 ms of the floor at p50 and p90",
                            all(
                                pct(gap, q) <= 20.0 and pct(got, q) - pct(floor, q) <= 20.0
                                for q in JUDGED
                            ),
                        )
                    )
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            ipr.close()
    res.notes.append(
        "Netns death, netdev half: a veth (like any virtual netdev) is destroyed with its "
        "netns, so 'netdev back under its host name with its settings' cannot happen on "
        "this host and is not measured here. It needs a physical NIC (the QEMU guest's "
        "virtio NIC, tests/guest), where timings under TCG emulation are not comparable."
    )
