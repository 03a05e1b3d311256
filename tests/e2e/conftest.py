"""End-to-end fixtures: a private dbus-daemon, real veths and netns, the real rdmad process
with the simulated RDMA backend (explicitly chosen) bound to those veths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.sim_rig import Rig, running_rig


@pytest.fixture(autouse=True)
def _root(root: None) -> None:
    """Every test here needs root (the `root` marker, from tests/conftest.py)."""


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path) as r:
        yield r


@pytest.fixture
async def exclusive_rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, sim_mode="exclusive") as r:
        yield r
