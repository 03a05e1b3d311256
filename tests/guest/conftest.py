"""Fixtures for the daemon tests in the RDMA guest (tests/guest/test_daemon_*.py).

The real rdmad process (`python -m rdmad.daemon.main`, kernel RDMA backend unless a module
overrides `sim_devices`) on a private dbus-daemon, one daemon per module: Python starts in
seconds under TCG. The tree is read-only in the guest, so the daemon's state, CDI specs and
log go to pytest's tmp dirs under /tmp (tmpfs in the guest).

Nothing here is autouse: test modules written by others share this directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from pathlib import Path

import pytest

from rdmad.core.events import Event
from rdmad.kernel.udev import UdevEvents
from testbed.daemon import Client, RdmadProcess
from tests.support.cgroup_tree import MOUNT as CGROUP2
from tests.support.rdma import Rxe, sh, temp_rxe

DAEMON_START = 180.0  # s: imports (dbus-fast, pyroute2, pyudev) over 9p under TCG, loaded host


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def in_guest() -> None:
    if os.environ.get("RDMA_VM_GUEST") != "1":
        pytest.fail("tests/guest runs only inside the RDMA QEMU guest (RDMA_VM_GUEST=1)")


@pytest.fixture(scope="module")
def sim_devices() -> str:
    """--sim-devices for the module's daemon; "" (the default) is the real kernel backend.
    A module overrides this fixture to bind the simulated RDMA half to real netdevs."""
    return ""


@pytest.fixture(scope="module")
def daemon_env() -> dict[str, str]:
    """Extra environment for the module's daemon (test-only knobs); a module overrides it."""
    return {}


@pytest.fixture(scope="module")
async def rdmad(
    bus_address: str,
    sim_devices: str,
    daemon_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RdmadProcess]:
    daemon = RdmadProcess(
        bus_address, tmp_path_factory.mktemp("rdmad"), sim_devices, env=daemon_env
    )
    await daemon.start(timeout=DAEMON_START)
    try:
        yield daemon
    finally:
        try:
            await daemon.stop()
        finally:
            await daemon.kill()


@pytest.fixture
def crash_rdmad(rdmad: RdmadProcess) -> Callable[[], Awaitable[None]]:
    """SIGKILL the module's daemon and start it again on the same state, as after a crash."""

    async def crash() -> None:
        await rdmad.kill()
        await rdmad.start(timeout=DAEMON_START)

    return crash


@pytest.fixture(scope="module")
async def client(rdmad: RdmadProcess, bus_address: str) -> AsyncIterator[Client]:
    c = await Client.connect(bus_address)
    yield c
    c.close()


@pytest.fixture
def daemon_log_on_failure(request: pytest.FixtureRequest, rdmad: RdmadProcess) -> Iterator[None]:
    """Print the daemon's log after a failed test (shown in pytest's failure report)."""
    start = len(rdmad.log())
    yield
    if request.node.stash.get(_CALL_FAILED, False):
        print(f"---- rdmad log during {request.node.name} ----\n{rdmad.log()[start:]}")


@pytest.fixture
def rxe() -> Iterator[Rxe]:
    """A soft-RoCE device on a fresh veth in init_net, removed afterwards."""
    with temp_rxe() as dev:
        yield dev


@pytest.fixture
async def udev_events() -> AsyncIterator[asyncio.Queue[Event]]:
    """Kernel uevents of the RDMA subsystems (rdmad's own source), subscribed before use."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    source = UdevEvents()
    await source.start(queue.put_nowait)
    yield queue
    await source.stop()


@pytest.fixture(scope="module")
def cgroup2() -> Path:
    """The guest's cgroup2 hierarchy, mounted if virtme-ng did not, with rdma available."""
    if not (CGROUP2 / "cgroup.controllers").exists():
        sh("mount", "-t", "cgroup2", "none", str(CGROUP2))
    assert "rdma" in (CGROUP2 / "cgroup.controllers").read_text().split()
    return CGROUP2


@pytest.fixture
def cgroup(cgroup2: Path, rxe: Rxe) -> Iterator[str]:
    name = f"rdmad-test-{rxe.name}"
    (cgroup2 / name).mkdir()
    try:
        yield name
    finally:
        with contextlib.suppress(OSError):
            (cgroup2 / name).rmdir()
