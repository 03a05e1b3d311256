"""Contract tests of rdmad-dra: the kubelet's side of its gRPC sockets and a loopback API
server that validates every ResourceSlice (tests/dra/kubelet.py, tests/dra/apiserver.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dra.apiserver import ApiServer

DRIVER = "rdma.rdmad.io"
NODE = "node-a"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer(NODE, DRIVER)
    with server.running():
        yield server
        assert server.invalid == [], "the plugin sent slices the API server refuses"
