"""KernelRdma and the RDMA event sources against a real RDMA kernel (inside the QEMU guest).

Each test makes its own soft-RoCE device on a veth it creates, and removes both after.
Kernel 6.1's rxe cannot change netns; 7.3's can (docs/kernel-notes.md), so the move tests are
per kernel. Waits are bounded waits on udev events, re-checking the condition on each.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from rdmad.core.events import Event, RdmaChanged
from rdmad.errors import ModeBusy, NotSupported
from rdmad.kernel.netns import KernelNetnsResolver, NetnsHandle
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rdma import KernelRdma
from rdmad.kernel.udev import RdmaMonitorEvents
from rdmad.model import ChardevKind, NetnsMode, RdmaDevice
from testbed.net import fixed_mac

pytestmark = [pytest.mark.guest, pytest.mark.on_61]

KERNEL = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
RXE_MOVES = KERNEL >= (7, 0)  # rxe gained disassociate_ucontext (netns moves) after 6.1
WAIT = 60.0  # seconds: Python under TCG is slow; the wait ends at the first matching event


@pytest.fixture(autouse=True)
def _only_in_the_guest() -> None:
    if os.environ.get("RDMA_VM_GUEST") != "1":
        pytest.fail("tests/guest runs only inside the RDMA QEMU guest (RDMA_VM_GUEST=1)")


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def rdma_json(*args: str, netns: str | None = None) -> list[dict[str, object]]:
    prefix = ("ip", "netns", "exec", netns) if netns else ()
    out = sh(*prefix, "rdma", "-j", *args).stdout.strip()
    return list(json.loads(out)) if out else []


def read_sysfs(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def rdev(st_rdev: int) -> tuple[int, int]:
    return os.major(st_rdev), os.minor(st_rdev)


@pytest.fixture
def veth() -> Iterator[str]:
    sh("ip", "link", "add", "vrt0", "address", fixed_mac(), "type", "veth", "peer", "name", "vrt1")
    sh("ip", "link", "set", "vrt0", "up")
    sh("ip", "link", "set", "vrt1", "up")
    yield "vrt0"
    sh("ip", "link", "del", "vrt0", check=False)


@pytest.fixture
def rxe(veth: str) -> Iterator[str]:
    sh("rdma", "link", "add", "rxe_t0", "type", "rxe", "netdev", veth)
    yield "rxe_t0"
    sh("rdma", "link", "del", "rxe_t0", check=False)


@pytest.fixture
async def backend(resolver: KernelNetnsResolver) -> AsyncIterator[KernelRdma]:
    rtnl = NlChannel.open(socket.NETLINK_ROUTE)
    b = KernelRdma(rtnl, init_netns_fd=resolver.init_fd)
    yield b
    await b.close()
    rtnl.close()


@pytest.fixture
def resolver() -> Iterator[KernelNetnsResolver]:
    r = KernelNetnsResolver()
    yield r
    r.close()


@pytest.fixture
def netns(resolver: KernelNetnsResolver) -> Iterator[Callable[[str], NetnsHandle]]:
    made: list[str] = []

    def make(name: str) -> NetnsHandle:
        sh("ip", "netns", "add", name)
        made.append(name)
        return resolver.open(name)

    yield make
    for name in made:
        sh("ip", "netns", "del", name, check=False)


async def set_mode_once_netns_are_gone(backend: KernelRdma, mode: NetnsMode) -> None:
    """SYS_SET until the kernel stops answering EBUSY. A deleted netns dies asynchronously
    (cleanup_net) and announces nothing when it holds no RDMA device, so this is the one
    bounded poll in this file."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                return await backend.set_netns_mode(mode)
            except ModeBusy:
                await asyncio.sleep(0.05)


@pytest.fixture
async def exclusive(backend: KernelRdma) -> AsyncIterator[None]:
    """Exclusive mode for one test. Request it *before* `netns`, so that the netns are
    deleted before shared mode is restored."""
    await set_mode_once_netns_are_gone(backend, NetnsMode.EXCLUSIVE)
    yield
    await set_mode_once_netns_are_gone(backend, NetnsMode.SHARED)


async def until(check: Callable[[], Awaitable[bool]], events: asyncio.Queue[Event]) -> None:
    """Wait until `check()` holds, re-checking after every event (bounded by WAIT)."""
    async with asyncio.timeout(WAIT):
        while not await check():
            await events.get()


async def device(backend: KernelRdma, name: str) -> RdmaDevice | None:
    return next((d for d in await backend.list_devices() if d.name == name), None)


# ---------------------------------------------------------------- inventory


async def test_devices_match_rdma_dev_and_sysfs(backend: KernelRdma, rxe: str) -> None:
    ours = {d.name: d for d in await backend.list_devices()}
    tool = {str(d["ifname"]): d for d in rdma_json("dev")}
    assert set(ours) == set(tool) == set(os.listdir("/sys/class/infiniband"))
    for name, dev in ours.items():
        assert dev.index == tool[name]["ifindex"]
        assert dev.node_guid == tool[name]["node_guid"]
        assert dev.node_guid == read_sysfs(f"/sys/class/infiniband/{name}/node_guid")


async def test_ports_match_rdma_link(backend: KernelRdma, rxe: str) -> None:
    ours = {(d.name, p.index): p for d in await backend.list_devices() for p in d.ports}
    tool = {(str(p["ifname"]), p["port"]): p for p in rdma_json("link")}
    assert set(ours) == set(tool)
    for key, port in ours.items():
        assert port.state == tool[key]["state"]
        assert port.phys_state == tool[key]["physical_state"]
        assert port.netdev == tool[key].get("netdev", "")


async def test_rxe_is_a_virtual_ethernet_device_on_its_netdev(
    backend: KernelRdma, rxe: str, veth: str
) -> None:
    dev = await device(backend, rxe)
    assert dev is not None
    assert (dev.driver, dev.virtual, dev.link_layer) == ("rxe", True, "Ethernet")
    assert (dev.netdev, dev.netdev_ifindex) == (veth, socket.if_nametoindex(veth))
    assert (dev.pci_address, dev.parent) == ("", "")
    assert any(p.startswith("/dev/infiniband/uverbs") for p in dev.chardevs)


async def test_chardevs_are_the_dev_nodes(backend: KernelRdma, rxe: str) -> None:
    sh("modprobe", "ib_umad")
    dev = await device(backend, rxe)
    assert dev is not None
    kinds = (ChardevKind.UVERBS, ChardevKind.RDMA_CM, ChardevKind.UMAD)
    nodes = await backend.chardevs(dev, kinds, None)
    assert {n.kind for n in nodes} == set(kinds)
    for node in nodes:
        assert rdev(os.stat(node.path).st_rdev) == (node.major, node.minor), node


async def test_a_chardev_the_device_lacks_is_not_supported(backend: KernelRdma, rxe: str) -> None:
    sh("modprobe", "ib_umad")
    dev = await device(backend, rxe)
    assert dev is not None
    with pytest.raises(NotSupported, match="no issm char device"):
        await backend.chardevs(dev, (ChardevKind.ISSM,), None)


# ---------------------------------------------------------------- netns mode


async def test_netns_mode_matches_rdma_system(backend: KernelRdma) -> None:
    tool = sh("rdma", "system").stdout.split()
    assert tool[tool.index("netns") + 1] == await backend.netns_mode()


async def test_exclusive_mode_is_set_while_no_other_netns_exists(backend: KernelRdma) -> None:
    await backend.set_netns_mode(NetnsMode.EXCLUSIVE)
    try:
        assert await backend.netns_mode() is NetnsMode.EXCLUSIVE
        assert "netns exclusive" in sh("rdma", "system").stdout
    finally:
        await backend.set_netns_mode(NetnsMode.SHARED)
    assert await backend.netns_mode() is NetnsMode.SHARED


# ---------------------------------------------------------------- moving rxe


@pytest.mark.skipif(RXE_MOVES, reason="rxe on this kernel can change netns")
async def test_rxe_move_is_not_supported_and_changes_nothing(
    backend: KernelRdma, rxe: str, exclusive: None, netns: Callable[[str], NetnsHandle]
) -> None:
    dev = await device(backend, rxe)
    assert dev is not None
    with netns("rt_nope") as target, pytest.raises(NotSupported, match="driver cannot change"):
        await backend.move(dev.index, target)
    assert await device(backend, rxe) == dev


async def test_move_in_shared_mode_says_so(
    backend: KernelRdma, rxe: str, netns: Callable[[str], NetnsHandle]
) -> None:
    dev = await device(backend, rxe)
    assert dev is not None
    with netns("rt_shared") as target, pytest.raises(NotSupported, match="shared mode"):
        await backend.move(dev.index, target)


@pytest.mark.skipif(not RXE_MOVES, reason="rxe on this kernel cannot change netns")
async def test_move_into_netns_and_home_again(
    backend: KernelRdma, rxe: str, exclusive: None, netns: Callable[[str], NetnsHandle]
) -> None:
    dev = await device(backend, rxe)
    assert dev is not None
    with netns("rt_a") as target:
        await backend.move(dev.index, target)
        assert await device(backend, rxe) is None
        assert rxe in [d["ifname"] for d in rdma_json("dev", netns="rt_a")]

        inside = await backend.chardevs(dev, (ChardevKind.UVERBS,), target)
        assert [rdev(os.stat(n.path).st_rdev) for n in inside] == [
            (n.major, n.minor) for n in inside
        ]

        await backend.move_home(rxe, target)
    assert rdma_json("dev", netns="rt_a") == []
    home = await device(backend, rxe)
    assert home is not None and home.netdev == dev.netdev
    (uverbs,) = await backend.chardevs(home, (ChardevKind.UVERBS,), None)
    assert rdev(os.stat(uverbs.path).st_rdev) == (uverbs.major, uverbs.minor)


@pytest.mark.skipif(not RXE_MOVES, reason="rxe on this kernel cannot change netns")
async def test_netns_deletion_brings_the_device_home(
    backend: KernelRdma,
    rxe: str,
    exclusive: None,
    netns: Callable[[str], NetnsHandle],
    udev_events: asyncio.Queue[Event],
) -> None:
    dev = await device(backend, rxe)
    assert dev is not None
    with netns("rt_b") as target:
        await backend.move(dev.index, target)
    assert await device(backend, rxe) is None
    sh("ip", "netns", "del", "rt_b")

    async def home() -> bool:
        return await device(backend, rxe) is not None

    await until(home, udev_events)


# ---------------------------------------------------------------- events


async def test_udev_reports_rdma_link_add_and_del(
    veth: str, udev_events: asyncio.Queue[Event]
) -> None:
    sh("rdma", "link", "add", "rxe_u0", "type", "rxe", "netdev", veth)
    try:
        assert await _next_hint(udev_events, "add infiniband/rxe_u0")
    finally:
        sh("rdma", "link", "del", "rxe_u0")
    assert await _next_hint(udev_events, "remove infiniband/rxe_u0")


async def test_rdma_monitor_reports_rdma_link_add(veth: str) -> None:
    if not await RdmaMonitorEvents.supported():
        pytest.skip("this kernel has no RDMA netlink monitor")
    queue: asyncio.Queue[Event] = asyncio.Queue()
    source = RdmaMonitorEvents()
    await source.start(queue.put_nowait)
    try:
        sh("rdma", "link", "add", "rxe_m0", "type", "rxe", "netdev", veth)
        sh("rdma", "link", "del", "rxe_m0")
        assert await _next_hint(queue, "register rxe_m0")
    finally:
        await source.stop()


async def _next_hint(events: asyncio.Queue[Event], hint: str) -> bool:
    async def scan() -> bool:
        while True:
            ev = await events.get()
            if isinstance(ev, RdmaChanged) and ev.hint == hint:
                return True

    return await asyncio.wait_for(scan(), WAIT)


# Last: the netns it creates dies asynchronously, and until then mode changes stay EBUSY.
async def test_mode_change_with_another_netns_is_mode_busy(
    backend: KernelRdma, netns: Callable[[str], NetnsHandle]
) -> None:
    netns("rt_busy").close()
    with pytest.raises(ModeBusy, match="other network namespaces exist"):
        await backend.set_netns_mode(NetnsMode.EXCLUSIVE)
    assert await backend.netns_mode() is NetnsMode.SHARED
