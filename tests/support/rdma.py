"""The real kernel's RDMA side, as an operator sees it, for tests inside the RDMA guest.

Independent of rdmad: everything is read with iproute2's `rdma` tool or from sysfs, so a
test compares rdmad's answers with the kernel's own. Used by tests/guest (fixtures in
tests/guest/conftest.py).

Waiting: never sleep. Wait on a D-Bus signal (`Client.wait_signal`) or re-check a kernel
condition after each udev event (`until`). testbed.net.eventually polls, and is only
for kernel state that nothing announces (the GID table).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from testbed.daemon import Client, DBusCallError
from testbed.net import ip, temp_veth, unique_name

# Python under TCG is slow: bounded, but generous. A wait ends at the first match.
WAIT = 60.0
T = TypeVar("T")
SYS_IB = Path("/sys/class/infiniband")


def kernel() -> str:
    """The guest's kernel series, "6.1" or "7.3" (set by the harness)."""
    return os.environ.get("RDMA_VM_KERNEL", "")


def in_netns(netns: str | None, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)


def sh(*cmd: str, netns: str | None = None, check: bool = True) -> str:
    """Run a command (inside `netns` if given); stdout. Raises with stderr on failure."""
    res = subprocess.run(in_netns(netns, *cmd), capture_output=True, text=True, timeout=WAIT)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(res.args)} failed: {res.stderr.strip()}")
    return res.stdout


async def ash(*cmd: str, netns: str | None = None) -> str:
    """`sh` without blocking the event loop, so a Client keeps receiving signals."""
    proc = await asyncio.create_subprocess_exec(
        *in_netns(netns, *cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err.decode().strip()}")
    return out.decode()


def rdma_json(*args: str, netns: str | None = None) -> list[dict[str, object]]:
    """`rdma -j ARGS...` parsed (inside `netns` if given)."""
    out = sh("rdma", "-j", *args, netns=netns).strip()
    return list(json.loads(out)) if out else []


def rdma_dev_names(netns: str | None = None) -> set[str]:
    """The RDMA devices `rdma dev` lists in init_net or in `netns`."""
    return {str(d["ifname"]) for d in rdma_json("dev", netns=netns)}


def rdma_netns_mode() -> str:
    """`rdma system`'s netns mode: "shared" or "exclusive"."""
    words = sh("rdma", "system").split()
    return words[words.index("netns") + 1]


def sysfs(path: Path | str) -> str:
    return Path(path).read_text().strip()


def char_nodes_of(device: str) -> set[str]:
    """/dev paths of every char device the kernel's classes bind to `device` (sysfs ibdev)."""
    out: set[str] = set()
    for cls in ("infiniband_verbs", "infiniband_mad"):
        base = Path("/sys/class", cls)
        if not base.is_dir():
            continue
        for node in base.iterdir():
            ibdev = node / "ibdev"
            if ibdev.exists() and sysfs(ibdev) == device:
                out.add(f"/dev/infiniband/{node.name}")
    return out


_STAT = (
    "import os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    st = os.stat(p)\n"
    "    print(p, os.major(st.st_rdev), os.minor(st.st_rdev))\n"
)


def stat_rdev(paths: list[str], netns: str | None = None) -> dict[str, tuple[int, int]]:
    """major:minor of each char device node, stat'ed by a process in `netns` (or here)."""
    out = sh(sys.executable, "-c", _STAT, *paths, netns=netns)
    return {p: (int(a), int(b)) for p, a, b in (line.split() for line in out.splitlines())}


def gid_ndevs(device: str, netns: str | None = None, port: int = 1) -> set[str]:
    """The netdevs the GID table of `device` port `port` names, read from sysfs in `netns`.
    Empty GID entries read as errors and are left out."""
    pattern = f"{SYS_IB}/{device}/ports/{port}/gid_attrs/ndevs/*"
    out = sh("sh", "-c", f"cat {pattern} 2>/dev/null; true", netns=netns)
    return {line.strip() for line in out.splitlines() if line.strip()}


@dataclass(frozen=True)
class Rxe:
    """A soft-RoCE device on the host end of a veth, both in init_net."""

    name: str
    netdev: str


@contextlib.contextmanager
def temp_rxe(prefix: str = "rxd") -> Iterator[Rxe]:
    """A fresh rxe device on a fresh veth (both ends up); both deleted afterwards."""
    with temp_netdev(prefix) as netdev:
        name = unique_name("rxe")
        sh("rdma", "link", "add", name, "type", "rxe", "netdev", netdev)
        try:
            yield Rxe(name, netdev)
        finally:
            sh("rdma", "link", "del", name, check=False)


async def set_netns_mode(client: Client, mode: str) -> None:
    """SetNetnsMode through rdmad, retrying while the kernel answers ModeBusy.

    A deleted netns dies asynchronously (cleanup_net) and announces nothing when it holds
    no RDMA device, so until it is gone the kernel keeps saying EBUSY. This is the one
    bounded retry loop: every other wait is on an event.
    """
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await client.manager("SetNetnsMode", "s", mode)
                return
            except DBusCallError as exc:
                if exc.name != "io.rdmad1.Error.ModeBusy":
                    raise
            await asyncio.sleep(0.05)


async def until(
    check: Callable[[], Awaitable[bool]], events: asyncio.Queue[T], within: float = WAIT
) -> None:
    """Wait until `check()` holds, re-checking after every event on `events`."""
    async with asyncio.timeout(within):
        while not await check():
            await events.get()


DEVICE_IFACE = "io.rdmad1.Device"
CLAIM_IFACE = "io.rdmad1.Claim"


async def all_props(client: Client, path: str, iface: str) -> dict[str, object]:
    """Properties.GetAll of one rdmad object, as plain values."""
    (props,) = await client.call_raw(
        "io.rdmad1", path, "org.freedesktop.DBus.Properties", "GetAll", "s", [iface]
    )
    return {name: variant.value for name, variant in props.items()}


async def device_props(client: Client, name: str) -> dict[str, object]:
    """Every io.rdmad1.Device property of the device `name`."""
    path = await client.manager("GetDevice", "s", name)
    return await all_props(client, str(path), DEVICE_IFACE)


async def listed(client: Client) -> dict[str, tuple[str, str, str]]:
    """ListDevices as {name: (state, netdev, object path)}."""
    return {n: (s, nd, p) for n, s, nd, p in await client.manager("ListDevices")}


async def known_to_rdmad(client: Client, name: str) -> None:
    """Return once rdmad lists `name` (made by a fixture, maybe before the daemon saw it)."""
    if name not in await listed(client):
        await client.wait_signal("DeviceAdded", lambda b: b[0] == name, timeout=WAIT)


@contextlib.contextmanager
def temp_netdev(prefix: str = "rnd") -> Iterator[str]:
    """The host end of a fresh veth pair, both ends up; deleted afterwards."""
    with temp_veth(prefix) as veth:
        ip("link", "set", veth.host, "up")
        ip("link", "set", veth.peer, "up")
        yield veth.host
