"""7. A pod-start storm: K claims at once, from K clients, on K devices, each into its own
netns; whole-device claims, then shared ones. The kernel serialises netns moves (and netdev
creation and deletion) under the RTNL lock, so the floor is the same kernel operations sent
serially from one process (bench.claim.Raw). Reported per kind: the makespan, to the last
claim's reply, against the serial sequence's; the two take turns (bench.columns), each
followed by a pause that lets the kernel's RCU work drain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.claim import NS_ADDR, NS_IFNAME, NS_MTU, Raw, serially
from bench.columns import drained, take_turns
from bench.common import (
    Params,
    Results,
    Row,
    at_once,
    claim_options,
    client,
    ip_batch,
    many_veths,
    rdmad,
    run_prefix,
)
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


async def _bursts(
    p: Params, clients: list[Client], hosts: list[str], spaces: list[str], shared: bool
) -> dict[str, list[float]]:
    opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR], shared=shared)
    claims = [
        (c, f"sim{i}", ns, opts) for i, (c, ns) in enumerate(zip(clients, spaces, strict=True))
    ]
    async with contextlib.AsyncExitStack() as opened:
        raws = [
            await opened.enter_async_context(Raw(h, ns, shared))
            for h, ns in zip(hosts, spaces, strict=True)
        ]
        cols = [
            drained("rdmad", lambda: at_once(claims), DRAIN_S),
            drained("raw", lambda: serially(raws), DRAIN_S),
        ]
        return (await take_turns(cols, p.bursts, 0)).t


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    k = p.burst
    with many_veths(k, "b", up=True) as nics, many_netns(k) as spaces:
        async with rdmad(bus, nics.sim_spec()), contextlib.AsyncExitStack() as stack:
            # Claimants subscribe to no signals (rdmad-cni, `rdmactl claim`); one watcher
            # (a node agent, `rdmactl monitor`) gets them all. With every one of 64 clients
            # subscribed, the broker and the clients handled 64x each signal, and the shared
            # burst took 2-6x the serial sequence for that alone.
            clients = [
                await stack.enter_async_context(client(bus, signals=False)) for _ in range(k)
            ]
            await stack.enter_async_context(client(bus))  # the watcher
            for kind, shared in (("whole-device", False), ("shared", True)):
                t = await _bursts(p, clients, nics.hosts, spaces, shared)
                _report(res, k, kind, t["rdmad"], t["raw"])


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
