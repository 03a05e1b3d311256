"""4. Throughput: 64 clients claiming and releasing at once (each its own device, one
netns), and ListDevices calls/s from 1 and from 64 concurrent clients.

The clients share this one Python process, so on 2 cores the client side competes with the
daemon and dbus-daemon for CPU: the numbers are a lower bound of what the daemon can do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path

from bench.common import (
    Params,
    Results,
    Row,
    claim,
    claim_options,
    many_veths,
    ms_since,
    rdmad,
    release,
)
from bench.stats import spread
from tests.support.daemon import Client, DBusCallError
from tests.support.net import temp_netns


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    k = p.clients
    with many_veths(k, "t") as nics, temp_netns("rbt") as netns:
        async with rdmad(bus, nics.sim_spec()) as _d:
            clients = [await Client.connect(bus) for _ in range(k)]
            try:
                lat: list[float] = []
                failed: Counter[str] = Counter()

                async def churn(c: Client, dev: str) -> int:
                    done = 0
                    for _ in range(p.rounds):
                        # A failure is a finding (reported), not a reason to stop the others.
                        try:
                            t0 = time.perf_counter()
                            cid = await claim(c, dev, netns, claim_options(mtu=1400))
                            lat.append(ms_since(t0))
                            done += 1
                            t0 = time.perf_counter()
                            await release(c, cid)
                            lat.append(ms_since(t0))
                            done += 1
                        except DBusCallError as e:
                            failed[f"{e.name.rsplit('.', 1)[-1]}: {e.message[:60]}"] += 1
                    return done

                t0 = time.perf_counter()
                ops = sum(
                    await asyncio.gather(*(churn(c, f"sim{i}") for i, c in enumerate(clients)))
                )
                wall = time.perf_counter() - t0
                await _release_leftovers(clients[0])
                res.dists[f"Claim+release under {k} concurrent clients"] = lat
                errors = "; ".join(f"{n}x {msg}" for msg, n in failed.most_common(3))
                res.rows.append(
                    Row(
                        f"4. Claim/release throughput, {k} clients",
                        f"{ops / wall:.0f} ops/s ({ops} ok); per op {spread(lat)}"
                        + (f"; **{sum(failed.values())} failed**: {errors}" if failed else ""),
                        target="no errors under concurrency",
                        met=not failed,
                    )
                )

                for n_clients in (1, k):
                    count = 0
                    lost: list[str] = []
                    stop_at = time.perf_counter() + p.list_seconds

                    async def lister(c: Client, stop_at: float, lost: list[str]) -> None:
                        nonlocal count
                        while time.perf_counter() < stop_at and not lost:
                            try:
                                await c.manager("ListDevices")
                            except DBusCallError as e:
                                lost.append(e.name)  # e.g. NoReply: the daemon left the bus
                                return
                            count += 1

                    t0 = time.perf_counter()
                    await asyncio.gather(*(lister(c, stop_at, lost) for c in clients[:n_clients]))
                    rate = count / (time.perf_counter() - t0)
                    res.rows.append(
                        Row(
                            f"4. ListDevices throughput, {n_clients} client(s), N={k}",
                            f"{rate:.0f} calls/s"
                            + (f"; **daemon stopped answering: {lost[0]}**" if lost else ""),
                            target="daemon survives the load",
                            met=not lost,
                        )
                    )
                    res.curves.setdefault("list_rate", {"n": [], "calls_per_s": []})
                    res.curves["list_rate"]["n"].append(float(n_clients))
                    res.curves["list_rate"]["calls_per_s"].append(rate)
                    if lost:
                        break
            finally:
                for c in clients:
                    with contextlib.suppress(Exception):
                        c.close()


async def _release_leftovers(c: Client) -> None:
    """Claims whose release failed: release them now, one at a time."""
    for row in await c.manager("ListClaims"):
        with contextlib.suppress(DBusCallError):
            await release(c, str(row[0]))
