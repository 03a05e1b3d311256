"""Contract tests of rdmad-dra: the kubelet's side of its gRPC sockets and a loopback API
server that validates every ResourceSlice (testbed/dra/kubelet.py, testbed/dra/apiserver.py).
A test that needs rdmad gets `rig` (sim RDMA devices on real veths, a private bus; a module
may override it with its own options) and `plugin`, the real rdmad-dra process on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin, running_plugin
from tests.support.sim_rig import Rig, running_rig

DRIVER = "rdma.rdmad.io"
NODE = "node-a"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer(NODE, DRIVER)
    with server.running():
        yield server
        assert server.invalid == [], "the plugin sent slices the API server refuses"


@pytest.fixture
async def rig(root: None, bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path) as r:
        yield r


@pytest.fixture
async def plugin(api: ApiServer, rig: Rig, tmp_path: Path) -> AsyncIterator[Plugin]:
    async with running_plugin(api, rig.daemon.bus_address, tmp_path / "dra") as p:
        yield p
