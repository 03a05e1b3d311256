"""7. A pod-start storm: K claims requested at once, from K clients, on K devices, each into
its own netns; whole-device claims, then shared ones.

The kernel serialises netns moves (and netdev creation and deletion) under the RTNL lock,
and threads sending moves at once only make each wait longer. So the floor is the same
kernel operations sent serially from one process (raw pyroute2, bench.claim.Raw and
bench.shared.RawShared), started at the same moment. Reported per kind: the makespan, until
the last claim has its reply, against the serial sequence's. Bursts alternate which of the
two goes first; a pause after each lets the kernel's RCU work from the previous one drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from bench.claim import NS_ADDR, NS_IFNAME, NS_MTU, Raw
from bench.common import (
    Params,
    Results,
    Row,
    claim,
    claim_options,
    ip_batch,
    many_veths,
    ms_since,
    rdmad,
    release,
    run_prefix,
)
from bench.shared import RawShared
from bench.stats import pct, spread
from testbed.daemon import Client

FLAT = 1.15
DRAIN_S = 0.5  # after a burst and its releases: 2K moves' RCU work is a lot


@contextlib.contextmanager
def many_netns(k: int) -> Iterator[list[str]]:
    prefix = run_prefix() + "b"
    names = [f"{prefix}n{i}" for i in range(k)]
    try:
        ip_batch([f"netns add {n}" for n in names])
        yield names
    finally:
        ip_batch([f"netns del {n}" for n in names], force=True)


async def _rdmad_burst(
    clients: list[Client], devices: list[str], spaces: list[str], shared: bool
) -> float:
    """Until the last claim's reply (ms), all sent at once, one per device; then released."""
    opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR], shared=shared)
    t0 = time.perf_counter()
    ids = await asyncio.gather(
        *(claim(c, d, ns, opts) for c, d, ns in zip(clients, devices, spaces, strict=True))
    )
    took = ms_since(t0)
    await asyncio.gather(*map(release, clients, ids))
    return took


async def _raw_serial(raws: list[Raw]) -> float:
    """Until the last claim is done (ms), sent one after another; then released."""
    t0 = time.perf_counter()
    for raw in raws:
        await raw.claim()
    took = ms_since(t0)
    for raw in raws:
        await raw.release()
    return took


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    k = p.burst
    with many_veths(k, "b", up=True) as nics, many_netns(k) as spaces:
        devices = [f"sim{i}" for i in range(k)]
        async with rdmad(bus, nics.sim_spec()) as _d:
            # Claimants subscribe to no signals (rdmad-cni, `rdmactl claim`); one watcher
            # (a node agent, `rdmactl monitor`) gets them all. With every one of 64 clients
            # subscribed, the broker and the clients handled 64x each signal, and the shared
            # burst took 2-6x the serial sequence for that alone.
            clients = [await Client.connect(bus, signals=False) for _ in range(k)]
            watcher = await Client.connect(bus)
            try:
                for kind, shared in (("whole-device", False), ("shared", True)):
                    cls = RawShared if shared else Raw
                    ours: list[float] = []
                    floor: list[float] = []
                    async with contextlib.AsyncExitStack() as opened:
                        raws = [
                            await opened.enter_async_context(cls.opened(h, ns))
                            for h, ns in zip(nics.hosts, spaces, strict=True)
                        ]
                        for b in range(p.bursts):
                            for first in (b % 2 == 0, b % 2 != 0):
                                if first:
                                    ours.append(
                                        await _rdmad_burst(clients, devices, spaces, shared)
                                    )
                                else:
                                    floor.append(await _raw_serial(raws))
                                await asyncio.sleep(DRAIN_S)
                    _report(res, k, kind, ours, floor)
            finally:
                for c in [*clients, watcher]:
                    c.close()


def _report(res: Results, k: int, kind: str, spans: list[float], floor: list[float]) -> None:
    ratios = {q: pct(spans, q) / pct(floor, q) for q in (50, 90)}
    res.dists[f"Burst of {k} {kind} claims: makespan"] = spans
    res.rows.append(
        Row(
            f"7. Burst of {k} {kind} claims at once: makespan ({len(spans)} bursts)",
            spread(spans),
            f"{spread(floor)} (serial, one process)",
            "-",
            f"rdmad/serial p50 {ratios[50]:.2f}, p90 {ratios[90]:.2f}",
            f"rdmad/serial <= {FLAT} at p50 and p90",
            all(r <= FLAT for r in ratios.values()),
        )
    )
