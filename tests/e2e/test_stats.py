"""`rdmactl stats` against the real rdmad with the simulated backend, whose devices count
their real veth's packets: frames sent with a packet socket show up in the counters."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from typing import Any

from pyroute2 import IPRoute

from testbed.children import spawn
from testbed.net import ip, link
from tests.e2e.test_rdmactl import RUN_TIMEOUT, argv, env, rdmactl
from tests.support.sim_rig import Rig

FRAMES = 25


def send_frames(ifname: str, n: int = FRAMES) -> None:
    """n broadcast Ethernet frames out of `ifname` (an ethertype nobody answers)."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((ifname, 0))
        frame = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x88\xb5" + b"\0" * 46
        for _ in range(n):
            s.send(frame)


def _up_and_running(ifnames: tuple[str, ...]) -> None:
    with IPRoute() as events:
        events.bind()  # subscribed before acting: no change goes unseen
        for name in ifnames:
            with open(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "w") as f:
                f.write("1")
            ip("link", "set", name, "up")
        # The kernel starts sending on a link (linkwatch) a moment after "up": until then
        # frames are dropped uncounted. Operstate UP, announced by RTM_NEWLINK, says it has.
        while any((link(n) or {}).get("operstate") != "UP" for n in ifnames):
            events.get()


async def quiet_up(*ifnames: str) -> None:
    """Up and sending, with IPv6 off: no autoconfiguration traffic sneaks in between reads."""
    await asyncio.wait_for(asyncio.to_thread(_up_and_running, ifnames), RUN_TIMEOUT)


def port1(entry: dict[str, Any]) -> dict[str, int]:
    (port,) = entry["ports"]
    assert port["port"] == 1
    counters: dict[str, int] = port["counters"]
    return counters


async def stats_json(rig: Rig, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = (await rdmactl(rig, "--json", "stats", *args)).json()
    return data


async def test_device_counters_rise_by_what_its_netdev_sent_and_received(rig: Rig) -> None:
    pair = rig.nics["sim0"]
    await quiet_up(pair.host, pair.peer)
    (before,) = (await stats_json(rig, "sim0"))["devices"]
    send_frames(pair.host)
    send_frames(pair.peer)
    data = await stats_json(rig, "sim0")
    (after,) = data["devices"]
    assert after["scope"] == "device" and data["claims"] == []
    assert port1(after)["sent_pkts"] - port1(before)["sent_pkts"] >= FRAMES
    assert port1(after)["rcvd_pkts"] - port1(before)["rcvd_pkts"] >= FRAMES


async def test_stats_without_a_target_lists_devices_claims_and_operations(rig: Rig) -> None:
    await rdmactl(rig, "claim", "sim1", "pid:1", "--shared")  # refused: init_net
    data = await stats_json(rig)
    assert [d["device"] for d in data["devices"]] == ["sim0", "sim1"]
    assert data["operations"]["claims"] == 0
    assert data["operations"]["errors"] == [
        {"operation": "claim", "error": "io.rdmad1.Error.InvalidNetns", "count": 1}
    ]


async def test_a_shared_claim_shows_its_devices_counters(rig: Rig, netns: str) -> None:
    claim = (await rdmactl(rig, "--json", "claim", "sim0", netns, "--shared")).json()
    (entry,) = (await stats_json(rig, claim["id"]))["claims"]
    assert (entry["claim"], entry["device"], entry["scope"]) == (claim["id"], "sim0", "device")
    assert set(port1(entry)) == {"sent_pkts", "rcvd_pkts"}


async def test_a_whole_claim_in_exclusive_mode_is_read_inside_its_netns(
    exclusive_rig: Rig, netns: str
) -> None:
    rig = exclusive_rig
    claim = (await rdmactl(rig, "--json", "claim", "sim0", netns, "--ifname", "net0")).json()
    ip("netns", "exec", netns, "ip", "link", "set", "net0", "up")
    await quiet_up(rig.nics["sim0"].peer)  # its UP means both ends carry
    (before,) = (await stats_json(rig, claim["id"]))["claims"]
    send_frames(rig.nics["sim0"].peer)  # from init_net to the claimed netdev in the netns
    (after,) = (await stats_json(rig, claim["id"]))["claims"]
    assert after["scope"] == "claim"
    assert port1(after)["rcvd_pkts"] - port1(before)["rcvd_pkts"] >= FRAMES


async def test_stats_of_an_unknown_name_is_a_named_error(rig: Rig) -> None:
    res = await rdmactl(rig, "stats", "nope0")
    assert res.rc == 1 and res.err.startswith("rdmactl: NoSuchDevice"), res.err


async def test_table_has_one_row_per_counter(rig: Rig) -> None:
    res = await rdmactl(rig, "stats", "sim1")
    assert res.rc == 0, res.err
    header, *rows = [line.split() for line in res.out.splitlines()]
    assert header == ["OBJECT", "SCOPE", "PORT", "COUNTER", "VALUE"]
    assert [r[:4] for r in rows] == [
        ["sim1", "device", "1", "rcvd_pkts"],
        ["sim1", "device", "1", "sent_pkts"],
    ]


async def test_watch_json_prints_rates_each_interval_and_ctrl_c_ends_it(rig: Rig) -> None:
    proc = await spawn(
        *argv(rig.daemon.bus_address, "--json", "stats", "sim0", "--watch", "--interval", "0.2"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env(),
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            frames = [json.loads(await proc.stdout.readline()) for _ in range(2)]
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    for frame in frames:
        (port,) = frame["devices"][0]["ports"]
        assert set(port["rates"]) == {"sent_pkts", "rcvd_pkts"}
        assert all(rate >= 0 for rate in port["rates"].values())
