"""Fixtures for the daemon tests in the RDMA guest (tests/guest/test_daemon_*.py).

The real rdmad process (`python -m rdmad.daemon.main`, kernel RDMA backend) on the session's
private dbus-daemon, ONE daemon for the whole guest run: its start costs about 20 s under
TCG, so each module that keeps the default set-up borrows it, and must hand it back with no
claim left (checked when the module ends). A module that defines its own `sim_devices`,
`daemon_env` or `bus_address` fixture gets a daemon of its own, for the module, on a bus
of its own (io.rdmad1 on the session's bus is the session daemon's). The tree is
read-only in the guest, so the daemon's state, CDI specs and log go to pytest's tmp dirs
under /tmp (tmpfs in the guest).

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
from testbed.bus import start_private_bus
from testbed.daemon import Client, RdmadProcess
from tests.support.cgroup_tree import MOUNT as CGROUP2
from tests.support.rdma import Rxe, kernel, sh, temp_rxe

DAEMON_START = 180.0  # s: imports (dbus-fast, pyroute2, pyudev) over 9p under TCG, loaded host


ON_61 = "on_61"  # the marker of what the 6.1 guest runs


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{ON_61}: runs in the 6.1 guest too: what differs by kernel (rxe's refusals to change "
        "netns, the parent-GID shared mode, the kernel facts, the rdma cgroup controller) and "
        "a few common flows. The 7.3 guest runs every guest test; 6.1 only these.",
    )


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """In the 6.1 guest, a test module that never names the marker has no test to run there:
    not even imported (the CRI and DRA ones import grpc and the kubernetes client, tens of
    seconds under TCG)."""
    if kernel() != "6.1" or collection_path.parent != Path(__file__).parent:
        return None
    if not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    return ON_61 not in collection_path.read_text() or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the 6.1 guest, deselect (reported as such) the guest tests not marked on_61."""
    if kernel() != "6.1":
        return
    here = Path(__file__).parent
    keep: list[pytest.Item] = []
    off: list[pytest.Item] = []
    for item in items:
        runs = here not in item.path.parents or item.get_closest_marker(ON_61) is not None
        (keep if runs else off).append(item)
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each guest module's seconds (set-ups, calls, teardowns), the run's cost by module."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport) and report.nodeid.startswith("tests/guest/"):
                module = report.nodeid.split("::", 1)[0]
                seconds[module] = seconds.get(module, 0.0) + report.duration
    if seconds:
        terminalreporter.write_sep("=", "guest seconds by module")
        for module, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{s:8.1f}s {module}")


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


# A module defining one of these fixtures configures its daemon: it gets one of its own.
OWN_DAEMON_FIXTURES = ("sim_devices", "daemon_env", "bus_address")


@contextlib.asynccontextmanager
async def running_rdmad(
    bus_address: str, workdir: Path, sim_devices: str = "", env: dict[str, str] | None = None
) -> AsyncIterator[RdmadProcess]:
    daemon = RdmadProcess(bus_address, workdir, sim_devices, env=env or {})
    await daemon.start(timeout=DAEMON_START)
    try:
        yield daemon
    finally:
        try:
            await daemon.stop()
        finally:
            await daemon.kill()


@pytest.fixture(scope="session")
async def session_rdmad(
    bus_address: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RdmadProcess]:
    """The guest run's default daemon (kernel backend, no test knob), lent to each module."""
    async with running_rdmad(bus_address, tmp_path_factory.mktemp("rdmad")) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def rdmad(request: pytest.FixtureRequest) -> RdmadProcess:
    """The module's daemon: the session's, or its own if the module configures one. (Not a
    coroutine: an async fixture cannot set up another one while the event loop runs it.)"""
    own = any(hasattr(request.module, name) for name in OWN_DAEMON_FIXTURES)
    daemon: RdmadProcess = request.getfixturevalue("own_rdmad" if own else "borrowed_rdmad")
    return daemon


@pytest.fixture(scope="module")
async def own_rdmad(
    request: pytest.FixtureRequest,
    bus_address: str,
    sim_devices: str,
    daemon_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RdmadProcess]:
    """A daemon of the module's own, on the module's bus if it defines one, else on a private
    dbus-daemon of its own: on the session's bus, io.rdmad1 is the session daemon's."""
    workdir = tmp_path_factory.mktemp("rdmad")
    with contextlib.ExitStack() as stack:
        if not hasattr(request.module, "bus_address"):
            bus_address = stack.enter_context(start_private_bus()).address
        async with running_rdmad(bus_address, workdir, sim_devices, daemon_env) as daemon:
            yield daemon


@pytest.fixture(scope="module")
async def borrowed_rdmad(session_rdmad: RdmadProcess) -> AsyncIterator[RdmadProcess]:
    yield session_rdmad
    await handed_back(session_rdmad)


async def handed_back(daemon: RdmadProcess) -> None:
    """A module that borrowed the session's daemon leaves it running, with no claim."""
    assert daemon.proc is not None and daemon.proc.returncode is None, daemon.log()[-6000:]
    client = await Client.connect(daemon.bus_address, signals=False)
    try:
        claims = list(await client.manager("ListClaims"))
    finally:
        client.close()
    assert claims == [], f"the module left claims in the session's rdmad: {claims}"


@pytest.fixture
def crash_rdmad(rdmad: RdmadProcess) -> Callable[[], Awaitable[None]]:
    """SIGKILL the module's daemon and start it again on the same state, as after a crash."""

    async def crash() -> None:
        await rdmad.kill()
        await rdmad.start(timeout=DAEMON_START)

    return crash


@pytest.fixture(scope="module")
async def client(rdmad: RdmadProcess) -> AsyncIterator[Client]:
    c = await Client.connect(rdmad.bus_address)
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
