"""Counters after real RDMA traffic, per kernel: rdmad's GetCounters, `rdmactl stats --json`
and a real scrape of rdmad-exporter agree with each other and with what the tool sent.

The traffic: ibv_rc_pingpong, server and client on the same rxe device over its parent's
link-local GID, run inside the claim's netns. Each side sends PINGPONG_ITERS one-packet
messages, so the device sends and receives at least 2 * PINGPONG_ITERS packets (acks come on
top).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dbus_fast import Variant

from rdmad.bus.names import device_path
from testbed.daemon import ROOT, Client, RdmadProcess
from testbed.net import eventually, link_local_usable, temp_netns
from tests.support.exporter import running_exporter
from tests.support.rdma import (
    CLAIM_IFACE,
    SYS_IB,
    WAIT,
    Rxe,
    known_to_rdmad,
    set_netns_mode,
    sysfs,
)
from tests.support.traffic import PINGPONG_ITERS, pingpong, pingpong_iters

pytestmark = [pytest.mark.guest, pytest.mark.usefixtures("in_guest", "daemon_log_on_failure")]

EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


async def rdmactl_stats(bus_address: str, target: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rdmad.cli.main", "--bus-address", bus_address, "--json", "stats",
        target, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err.decode()
    data: dict[str, Any] = json.loads(out)
    return data


async def counters(client: Client, path: str, iface: str) -> tuple[str, dict[str, int]]:
    scope, ports = await client.call_raw("io.rdmad1", path, iface, "GetCounters")
    (port,) = [c for p, c in ports if p == 1]
    return str(scope), dict(port)


@pytest.fixture
async def ready_rxe(client: Client, rxe: Rxe) -> AsyncIterator[Rxe]:
    """An rxe rdmad lists, with its link-local GID in place; its claims released after."""
    await known_to_rdmad(client, rxe.name)
    await eventually(lambda: sysfs(f"{SYS_IB}/{rxe.name}/ports/1/gids/0") != EMPTY_GID, WAIT)
    await eventually(lambda: link_local_usable(rxe.netdev), WAIT)
    yield rxe
    for cid, dev, *_ in await client.manager("ListClaims"):
        if dev == rxe.name:
            await client.manager("Release", "s", cid)


@pytest.mark.on_61
async def test_a_shared_claims_traffic_shows_in_bus_rdmactl_and_exporter_alike(
    client: Client, rdmad: RdmadProcess, netns: str, ready_rxe: Rxe
) -> None:
    dev = ready_rxe.name
    path = await client.manager("Claim", "ssa{sv}", dev, netns, {"shared": Variant("b", True)})
    _, before = await counters(client, device_path(dev), "io.rdmad1.Device")
    run = await pingpong(netns, dev, 0)  # the parent's link-local GID, which 6.1's rxe carries
    assert run.both(pingpong_iters) == (PINGPONG_ITERS, PINGPONG_ITERS), run
    scope, claim_after = await counters(client, str(path), CLAIM_IFACE)
    _, dev_after = await counters(client, device_path(dev), "io.rdmad1.Device")
    async with running_exporter(rdmad.bus_address) as exporter:
        samples = await exporter.scrape()
    (shown,) = (await rdmactl_stats(rdmad.bus_address, dev))["devices"]
    assert scope == "device"  # a shared claim counts with its device
    for name in ("sent_pkts", "rcvd_pkts"):
        assert dev_after[name] - before[name] >= 2 * PINGPONG_ITERS, (name, before, dev_after)
        assert claim_after[name] == dev_after[name]
        assert shown["ports"][0]["counters"][name] == dev_after[name]
        key = (f"rdmad_port_{name}_total", (("device", dev), ("port", "1")))
        assert samples[key] == dev_after[name]


async def test_in_exclusive_mode_a_device_in_the_claims_netns_is_read_there(
    client: Client, rxe: Rxe
) -> None:
    await known_to_rdmad(client, rxe.name)
    await set_netns_mode(client, "exclusive")
    try:
        with temp_netns("gm") as netns:
            path = await client.manager(
                "Claim", "ssa{sv}", rxe.name, netns, {"netdev": Variant("b", False)}
            )
            scope, values = await counters(client, str(path), CLAIM_IFACE)
            _, via_device = await counters(client, device_path(rxe.name), "io.rdmad1.Device")
            await client.manager("Release", "s", str(path).rsplit("/", 1)[1])
    finally:
        await set_netns_mode(client, "shared")
    assert scope == "claim"
    assert {"sent_pkts", "rcvd_pkts"} <= set(values) and set(via_device) == set(values)
