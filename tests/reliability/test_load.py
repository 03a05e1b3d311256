"""Load: 64 clients claiming and releasing in parallel against 32 devices, and an event
storm of 500 netdevs created and destroyed while claims run. Figures go to the test log."""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dbus_fast import Variant

from testbed.daemon import Client, DBusCallError
from testbed.net import ip, unique_name
from tests.reliability.conftest import reliability_rig, settings_of
from tests.reliability.test_overrun import burst
from tests.support.invariants import assert_invariants
from tests.support.sim_rig import Rig

CLIENTS, DEVICES, ROUNDS = 64, 32, 4
CALL_TIMEOUT = 30.0  # an unanswered call is a failure, not a hang
ALLOWED_ERRORS = {"io.rdmad1.Error.DeviceBusy"}  # contention is the only expected refusal


@contextlib.contextmanager
def many_netns(count: int) -> Iterator[list[str]]:
    names = [unique_name("ld") for _ in range(count)]
    with tempfile.NamedTemporaryFile("w", suffix=".batch") as f:
        f.write("".join(f"netns add {n}\n" for n in names))
        f.flush()
        subprocess.run(["ip", "-batch", f.name], check=True)
    try:
        yield names
    finally:
        for n in names:
            ip("netns", "del", n, check=False)


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    calls: int = 0
    shared_ids: dict[str, bool] = field(default_factory=dict)
    samples: dict[str, set[str]] = field(default_factory=dict)  # error name -> messages

    def line(self, what: str) -> str:
        lat = sorted(self.latencies)
        p50 = lat[len(lat) // 2] * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        errors = dict(self.errors) or "none"
        return f"{what}: calls={self.calls} errors={errors} p50={p50:.1f}ms p99={p99:.1f}ms"


async def timed(stats: Stats, client: Client, member: str, sig: str, *body: object) -> object:
    stats.calls += 1
    start = time.perf_counter()
    try:
        return await asyncio.wait_for(client.manager(member, sig, *body), CALL_TIMEOUT)
    except DBusCallError as e:
        stats.errors[e.name] += 1
        stats.samples.setdefault(e.name, set()).add(f"{member}: {e.message}")
        return None
    finally:
        stats.latencies.append(time.perf_counter() - start)


async def worker(
    address: str, netns: str, seed: int, rounds: int, devices: int, stats: Stats
) -> None:
    rng = random.Random(seed)
    client = await Client.connect(address)
    try:
        for _ in range(rounds):
            device = f"sim{rng.randrange(devices)}"
            shared = rng.random() < 0.5
            options = {"shared": Variant("b", True)} if shared else {}
            path = await timed(stats, client, "Claim", "ssa{sv}", device, netns, options)
            if path is None:
                continue
            claim_id = str(path).rsplit("/", 1)[1]
            stats.shared_ids[claim_id] = shared
            await timed(stats, client, "Release", "s", claim_id)
    finally:
        client.close()


def double_claims(rig: Rig, since: int, shared_ids: dict[str, bool]) -> list[str]:
    """Replay Claimed/Released in the order the daemon sent them; a whole claim next to any
    other claim of the same device is a double claim."""
    holders: dict[str, dict[str, bool]] = {}
    found = []
    for msg in rig.client.signals[since:]:
        if msg.member == "Claimed":
            cid, device = msg.body[0], msg.body[1]
            held = holders.setdefault(device, {})
            whole = not shared_ids.get(cid, False)
            if held and (whole or not all(held.values())):
                found.append(f"{device}: {cid} claimed while held by {held}")
            held[cid] = not whole
        elif msg.member == "Released":
            holders.get(msg.body[1], {}).pop(msg.body[0], None)
    return found


async def test_64_clients_claiming_and_releasing_32_devices_in_parallel(
    bus_address: str, tmp_path: Path
) -> None:
    async with reliability_rig(bus_address, tmp_path, DEVICES) as rig:
        settings = settings_of(rig.nics)
        stats = Stats()
        mark = rig.client.mark()
        with many_netns(CLIENTS) as names:
            start = time.perf_counter()
            await asyncio.gather(
                *(worker(bus_address, n, i, ROUNDS, DEVICES, stats) for i, n in enumerate(names))
            )
            wall = time.perf_counter() - start
            print(stats.line(f"load {CLIENTS} clients x {ROUNDS} rounds on {DEVICES} devices"))
            print(f"load wall time {wall:.1f}s")
            assert set(stats.errors) <= ALLOWED_ERRORS, stats.samples
            assert stats.calls == len(stats.latencies), "every call was answered"
            doubles = double_claims(rig, mark, stats.shared_ids)
            assert doubles == [], doubles
            assert await rig.client.manager("ListClaims") == []
            report = await assert_invariants(rig.client, rig.nics, settings, names)
            print(f"load: double claims=0, stranded={report.stranded}")


async def test_event_storm_of_500_netdevs_while_claims_run_leaves_a_correct_inventory(
    bus_address: str, tmp_path: Path
) -> None:
    async with reliability_rig(bus_address, tmp_path, 4) as rig:
        settings = settings_of(rig.nics)
        stats = Stats()
        with many_netns(8) as names:
            storm = asyncio.ensure_future(asyncio.to_thread(burst, 500))
            workers = [worker(bus_address, n, 100 + i, 6, 4, stats) for i, n in enumerate(names)]
            await asyncio.gather(storm, *workers)
            print(stats.line("event storm (500 netdevs) + 8 clients x 6 rounds on 4 devices"))
            assert set(stats.errors) <= ALLOWED_ERRORS, stats.samples
            assert await rig.client.manager("ListClaims") == []
            report = await assert_invariants(rig.client, rig.nics, settings, names)
            # The inventory still drives claims: every device can be claimed right now.
            for i in range(4):
                path = await rig.client.manager("Claim", "ssa{sv}", f"sim{i}", names[i], {})
                await rig.client.call_raw("io.rdmad1", path, "io.rdmad1.Claim", "Release")
            print(f"event storm: stranded={report.stranded}")
