"""Test-session rules shared by every test directory.

- tests/guest runs only inside the QEMU RDMA guest (tests/guest/harness/run-guest-tests.sh);
  the host session leaves it out.
- Tests that need root, a bus or the guest fail loudly under CI=true when they cannot run:
  a skipped test is not a pass.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.bus import start_private_bus
from tests.support.net import temp_netns

collect_ignore_glob = [] if os.environ.get("RDMA_VM_GUEST") == "1" else ["guest/*"]


@pytest.fixture(scope="session")
def bus_address() -> Iterator[str]:
    """A private dbus-daemon with the system bus's policy, for the whole session."""
    with start_private_bus() as bus:
        yield bus.address


@pytest.fixture
def netns() -> Iterator[str]:
    """A named netns (/run/netns/NAME), deleted afterwards."""
    with temp_netns() as name:
        yield name
