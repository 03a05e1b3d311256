"""rdmactl, run as a real subprocess, against the real rdmad process (sim RDMA on real veths).

Each command goes over the private bus exactly as an operator's would; what it claims to have
done is checked independently with iproute2 (`ip`). Subprocesses are run with
asyncio, so the test's own D-Bus client (on this loop) keeps working, and with every signal at
its default (testbed.children), so that Ctrl-C reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from rdmad import __version__
from rdmad.bus.names import CLAIM_IFACE, MANAGER_PATH, device_path
from testbed.children import spawn
from testbed.daemon import ROOT
from testbed.net import addresses, is_up, link, netns_inode
from tests.support.sim_rig import Rig

RUN_TIMEOUT = 20.0


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.rc == 0, f"rdmactl failed ({self.rc}): {self.err}"
        return json.loads(self.out)


def argv(bus_address: str, *args: str, options_last: bool = False) -> list[str]:
    """The command line; with options_last, --bus-address follows the subcommand's own
    arguments, as users also type it."""
    bus = ["--bus-address", bus_address]
    ordered = [*args, *bus] if options_last else [*bus, *args]
    return [sys.executable, "-m", "rdmad.cli.main", *ordered]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


async def rdmactl_at(bus_address: str, *args: str, options_last: bool = False) -> Result:
    proc = await spawn(
        *argv(bus_address, *args, options_last=options_last),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env(),
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def rdmactl(rig: Rig, *args: str, options_last: bool = False) -> Result:
    return await rdmactl_at(rig.daemon.bus_address, *args, options_last=options_last)


async def claim_json(rig: Rig, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = (await rdmactl(rig, "--json", "claim", *args)).json()
    return data


def one_error_line(res: Result, exit_code: int, prefix: str) -> str:
    assert res.rc == exit_code, (res.rc, res.out, res.err)
    assert res.out == ""
    lines = res.err.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {lines!r}"
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# ---------------------------------------------------------------- read-only commands


async def test_list_table_shows_both_devices_with_state_and_netdev(rig: Rig) -> None:
    res = await rdmactl(rig, "list")
    assert res.rc == 0, res.err
    header, *rows = [line.split() for line in res.out.splitlines()]
    assert header == ["DEVICE", "STATE", "NETDEV"]
    assert rows == [
        ["sim0", "available", rig.nic("sim0")],
        ["sim1", "available", rig.nic("sim1")],
    ]


async def test_list_json_is_a_list_of_name_state_netdev_path(rig: Rig) -> None:
    assert (await rdmactl(rig, "--json", "list")).json() == [
        {
            "name": "sim0",
            "state": "available",
            "netdev": rig.nic("sim0"),
            "path": device_path("sim0"),
        },
        {
            "name": "sim1",
            "state": "available",
            "netdev": rig.nic("sim1"),
            "path": device_path("sim1"),
        },
    ]


async def test_status_json_has_version_mode_and_counts(rig: Rig) -> None:
    assert (await rdmactl(rig, "--json", "status")).json() == {
        "version": __version__,
        "netns_mode": "shared",
        "devices": 2,
        "claims": 0,
    }


async def test_show_json_has_every_device_property_in_snake_case(rig: Rig) -> None:
    data = (await rdmactl(rig, "--json", "show", "sim0")).json()
    nic = rig.nic("sim0")
    assert data["name"] == "sim0"
    assert data["state"] == "available"
    assert data["net_device"] == nic
    assert data["driver"] and data["link_layer"]
    assert isinstance(data["index"], int)
    assert isinstance(data["node_guid"], str)
    assert [p["netdev"] for p in data["ports"]] == [nic]
    assert set(data["ports"][0]) == {"port", "state", "phys_state", "netdev"}
    assert isinstance(data["char_devices"], list)
    assert data["claims"] == []
    assert data["path"] == device_path("sim0")
    assert {"pci_address", "numa_node", "netns"} <= set(data)


async def test_mode_prints_the_current_mode(rig: Rig) -> None:
    res = await rdmactl(rig, "mode")
    assert (res.rc, res.out) == (0, "shared\n"), res.err
    assert (await rdmactl(rig, "--json", "mode")).json() == {"netns_mode": "shared"}


@pytest.mark.parametrize("command", [["list"], ["claims"], ["status"], ["show", "sim0"], ["mode"]])
async def test_json_after_the_subcommand_prints_what_json_before_it_does(
    rig: Rig, command: list[str]
) -> None:
    before = (await rdmactl(rig, "--json", *command)).json()
    after = (await rdmactl(rig, *command, "--json", options_last=True)).json()
    assert after == before


# ---------------------------------------------------------------- claim and release


async def test_claim_moves_the_netdev_into_the_netns_with_the_given_settings(
    rig: Rig, netns: str
) -> None:
    nic = rig.nic("sim0")
    data = await claim_json(
        rig,
        "sim0",
        netns,
        "--ifname",
        "x",
        "--mtu",
        "1400",
        "--address",
        "192.0.2.9/24",
        "--owner",
        "e2e-test",
    )
    inside = link("x", netns)
    assert inside is not None and inside["mtu"] == 1400 and is_up(inside)
    assert addresses("x", netns) == {"192.0.2.9/24"}
    assert link(nic) is None, "the netdev left init_net"

    assert data["id"] and data["path"].endswith(data["id"])
    assert data["device"] == "sim0"
    assert data["interface_name"] == "x"
    assert data["owner"] == "e2e-test"
    assert data["shared"] is False
    assert data["char_devices"], "a claim hands out at least uverbs"
    for chardev in data["char_devices"]:
        assert set(chardev) == {"path", "major", "minor"}
    assert data["cdi_device"]


async def test_claims_json_lists_a_live_claim(rig: Rig, netns: str) -> None:
    made = await claim_json(rig, "sim0", netns, "--ifname", "x", "--owner", "e2e-test")
    listed = (await rdmactl(rig, "--json", "claims")).json()
    assert len(listed) == 1
    (row,) = listed
    assert set(row) == {
        "id",
        "device",
        "netns",
        "interface",
        "owner",
        "path",
        "route_table",
        "pod_cdi_name",
    }
    assert row["route_table"] == made["route_table"] == 0
    assert row["pod_cdi_name"] == made["pod_cdi_name"] == ""
    assert (row["id"], row["device"], row["interface"], row["owner"], row["path"]) == (
        made["id"],
        "sim0",
        "x",
        "e2e-test",
        made["path"],
    )
    assert row["netns"] == made["netns"] == f"net:[{netns_inode(netns)}]"


async def test_claim_pod_cdi_name_is_shown_by_claim_and_claims(rig: Rig, netns: str) -> None:
    made = await claim_json(rig, "sim0", netns, "--pod-cdi-name", "pod1")
    (row,) = (await rdmactl(rig, "--json", "claims")).json()
    assert made["pod_cdi_name"] == row["pod_cdi_name"] == "pod1"


async def test_release_gives_the_netdev_back_under_its_host_name(rig: Rig, netns: str) -> None:
    nic = rig.nic("sim0")
    made = await claim_json(rig, "sim0", netns, "--ifname", "x")
    assert link(nic) is None

    res = await rdmactl(rig, "--json", "release", made["id"])
    assert res.json() == {"released": made["id"]}
    assert link("x", netns) is None
    assert link(nic) is not None, "the host name is restored in init_net"
    assert (await rdmactl(rig, "--json", "claims")).json() == []
    listed = (await rdmactl(rig, "--json", "list")).json()
    assert listed[0]["state"] == "available" and listed[0]["netdev"] == nic


async def test_claim_and_release_take_the_global_options_after_their_arguments(
    rig: Rig, netns: str
) -> None:
    made = (await rdmactl(rig, "claim", "sim0", netns, "--json", options_last=True)).json()
    assert made["device"] == "sim0"
    res = await rdmactl(rig, "release", made["id"], "--json", options_last=True)
    assert res.json() == {"released": made["id"]}
    assert (await rdmactl(rig, "claims", "--json", options_last=True)).json() == []


async def test_claim_shared_creates_a_net1_macvlan_and_leaves_the_nic_home(
    rig: Rig, netns: str
) -> None:
    nic = rig.nic("sim0")
    data = await claim_json(rig, "sim0", netns, "--shared")
    assert data["shared"] is True
    inside = link("net1", netns)
    assert inside is not None
    assert inside["linkinfo"]["info_kind"] == "macvlan"
    assert link(nic) is not None, "a shared claim leaves the parent NIC in init_net"


# ---------------------------------------------------------------- errors and exit codes


async def test_unknown_device_exits_1_with_one_no_such_device_line(rig: Rig, netns: str) -> None:
    res = await rdmactl(rig, "claim", "nope9", netns)
    line = one_error_line(res, 1, "rdmactl: NoSuchDevice:")
    assert "nope9" in line
    res = await rdmactl(rig, "show", "nope9")
    one_error_line(res, 1, "rdmactl: NoSuchDevice:")


async def test_invalid_mtu_exits_1_with_invalid_args(rig: Rig, netns: str) -> None:
    res = await rdmactl(rig, "claim", "sim0", netns, "--mtu", "10")
    one_error_line(res, 1, "rdmactl: InvalidArgs:")
    assert link(rig.nic("sim0")) is not None, "nothing moved"


async def test_an_error_after_options_given_last_is_still_one_line(rig: Rig) -> None:
    res = await rdmactl(rig, "show", "nope9", "--json", options_last=True)
    one_error_line(res, 1, "rdmactl: NoSuchDevice:")


@pytest.mark.parametrize("options_last", [False, True])
async def test_wrong_bus_address_exits_3_with_one_line_and_a_hint(
    rig: Rig, options_last: bool
) -> None:
    res = await rdmactl_at(
        "unix:path=/nonexistent/rdmad-e2e-bus", "status", options_last=options_last
    )
    line = one_error_line(res, 3, "rdmactl: daemon unreachable:")
    assert "hint:" in line and "--bus-address" in line


async def test_usage_error_exits_2(rig: Rig) -> None:
    res = await rdmactl(rig, "claim", "sim0")  # no netns
    assert res.rc == 2 and "usage:" in res.err


async def test_mode_exclusive_while_a_netns_exists_exits_1_mode_busy(rig: Rig, netns: str) -> None:
    res = await rdmactl(rig, "mode", "exclusive")
    one_error_line(res, 1, "rdmactl: ModeBusy:")
    assert (await rdmactl(rig, "mode")).out == "shared\n", "the mode did not change"


# ---------------------------------------------------------------- monitor


@dataclass
class Monitor:
    proc: asyncio.subprocess.Process
    lines: asyncio.Queue[str]
    first: asyncio.Event


@pytest.fixture
async def monitor(rig: Rig) -> AsyncIterator[Monitor]:
    proc = await spawn(
        *argv(rig.daemon.bus_address, "--json", "monitor"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env(),
    )
    mon = Monitor(proc, asyncio.Queue(), asyncio.Event())

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            mon.lines.put_nowait(raw.decode())
            mon.first.set()

    reader = asyncio.create_task(read())
    try:
        yield mon
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def wait_subscribed(rig: Rig, mon: Monitor, netns: str, within: float = 15.0) -> None:
    """rdmactl monitor prints nothing until the first signal, and its AddMatch races with
    us. So make claim/release cycles of sim1 (through the test's own client) until the
    monitor prints anything: the first line proves the match rule is in place, and the bus
    delivers every later signal in order. No sleeps, bounded by `within`."""

    async def cycle() -> None:
        while not mon.first.is_set():
            path = await rig.client.manager("Claim", "ssa{sv}", "sim1", netns, {})
            claim_id = await rig.client.prop(path, CLAIM_IFACE, "Id")
            await rig.client.manager("Release", "s", claim_id)

    async with asyncio.timeout(within):
        await cycle()


async def next_signal(
    mon: Monitor, name: str, claim_id: str, within: float = 10.0
) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            line = await mon.lines.get()
            event = json.loads(line)  # every line is exactly one JSON object
            assert isinstance(event, dict), line
            assert set(event) == {"signal", "path", "args"}, event
            if event["signal"] == name and event["args"].get("claim_id") == claim_id:
                return event


async def test_monitor_json_prints_claimed_and_released_as_one_object_per_line(
    rig: Rig, netns: str, monitor: Monitor
) -> None:
    await wait_subscribed(rig, monitor, netns)

    made = await claim_json(rig, "sim0", netns)
    claimed = await next_signal(monitor, "Claimed", made["id"])
    assert claimed["path"] == MANAGER_PATH
    assert claimed["args"] == {"claim_id": made["id"], "device": "sim0", "path": made["path"]}

    assert (await rdmactl(rig, "release", made["id"])).rc == 0
    released = await next_signal(monitor, "Released", made["id"])
    assert released["args"]["device"] == "sim0"
    assert released["args"]["reason"]

    # Ctrl-C ends it cleanly.
    monitor.proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(RUN_TIMEOUT):
        assert await monitor.proc.wait() == 0


async def test_monitor_exits_quietly_when_its_reader_goes_away(rig: Rig, netns: str) -> None:
    # As in `rdmactl monitor | head -n 1`: the reader takes one line and closes the pipe.
    read_end, write_end = os.pipe()
    proc = await spawn(
        *argv(rig.daemon.bus_address, "--json", "monitor"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=write_end,
        stderr=asyncio.subprocess.PIPE,
        env=env(),
    )
    os.close(write_end)
    lines = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(lines), os.fdopen(read_end, "rb", 0)
    )
    mon = Monitor(proc, asyncio.Queue(), asyncio.Event())
    try:
        first = asyncio.create_task(lines.readline())
        first.add_done_callback(lambda _: mon.first.set())
        await wait_subscribed(rig, mon, netns)
        assert json.loads(first.result())["path"].startswith(MANAGER_PATH)
        transport.close()  # the reader is gone

        made = await claim_json(rig, "sim0", netns)  # signals to write to nobody
        async with asyncio.timeout(RUN_TIMEOUT):
            assert await proc.wait() == 141
        assert proc.stderr is not None
        assert await proc.stderr.read() == b"", "no traceback, no message"
        assert (await rdmactl(rig, "release", made["id"])).rc == 0
    finally:
        transport.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
