"""Test-session rules shared by every test directory.

- tests/guest runs only inside the QEMU RDMA guest (tests/guest/harness/run-guest-tests.sh);
  the host session leaves it out.
- What a test needs beyond Python is a marker: root, bus, guest, podman, containerd. The
  fixtures that provide those things set it (`NEEDS`, below), so `-m "not root and ..."`
  (`make check`) selects exactly the tests that run unprivileged; a module that needs one
  without a fixture says so in its `pytestmark`.
- Tests that need root, a bus, podman, containerd or the guest fail loudly under CI=true
  when they cannot run: a skipped test is not a pass.
- Nothing of the caller's session reaches a test or its children: not the settings rdmad and
  its tools read from the environment, nor the umask, nor an ignored SIGCHLD (see
  `pytest_configure`); children a test signals start with every signal at its default
  (testbed/children.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from testbed.bus import start_private_bus
from testbed.net import require_root, temp_netns

collect_ignore_glob = [] if os.environ.get("RDMA_VM_GUEST") == "1" else ["guest/*"]

# What rdmad, rdmactl, rdmad-exporter and rdmad-dra read from their environment, and what
# turns the podman of tests/cni into a client of some other podman.
SETTINGS_FROM_THE_ENVIRONMENT = (
    "DBUS_SYSTEM_BUS_ADDRESS",
    "RUNTIME_DIRECTORY",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
    "NODE_NAME",
    "POD_UID",
    "CONTAINER_HOST",
    "CONTAINER_CONNECTION",
)


# The fixture that provides a thing -> the marker of the tests that get it, directly or through
# another fixture. Each fails loudly under CI=true when it cannot provide.
NEEDS = {
    "root": "root",
    "bus_address": "bus",
    "private_bus": "bus",
    "policy_bus": "bus",
    "podman": "podman",
    "containerd_node": "containerd",
    "in_guest": "guest",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with what its fixtures need (fixturenames is their closure)."""
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & NEEDS.keys():
            item.add_marker(NEEDS[fixture])


def pytest_configure(config: pytest.Config) -> None:
    """What the caller's session may hold, undone before the tests are collected
    (rdmad.daemon.config reads its defaults on import)."""
    # Ignored, as a caller may leave it, the kernel reaps every child at once and each exit
    # status reads 0.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # systemd's umask for a service: under a caller's 077 the CDI specs rdmad writes and the
    # private bus's socket would be for root only.
    os.umask(0o022)
    # A desktop's bus address, a CI runner's NOTIFY_SOCKET under systemd: each test sets what
    # it is about.
    for name in SETTINGS_FROM_THE_ENVIRONMENT:
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def root() -> None:
    """Root: real netns, veths, another uid. Requested by each fixture or module that needs it."""
    require_root()


@pytest.fixture(scope="session")
def bus_address() -> Iterator[str]:
    """A private dbus-daemon with the system bus's policy, for the whole session."""
    with start_private_bus() as bus:
        yield bus.address


@pytest.fixture
def netns(root: None) -> Iterator[str]:
    """A named netns (/run/netns/NAME), deleted afterwards."""
    with temp_netns() as name:
        yield name
