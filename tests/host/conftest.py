"""Fixtures for tests against the real kernel. What makes links or netns needs root: the
`veth` fixture and tests/conftest.py's `netns` request it, and a module or test that makes
them itself says so (`usefixtures("root")`)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rtnl import RtnlBackend
from testbed.net import VethPair, temp_veth


@pytest.fixture
def channel() -> Iterator[NlChannel]:
    """An rtnetlink channel in init_net, as the daemon opens it (strict checking)."""
    c = NlChannel.open(socket.NETLINK_ROUTE)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def veth(root: None) -> Iterator[VethPair]:
    with temp_veth() as pair:
        yield pair


@pytest.fixture
def resolver() -> Iterator[KernelNetnsResolver]:
    r = KernelNetnsResolver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
async def rtnl(resolver: KernelNetnsResolver) -> AsyncIterator[RtnlBackend]:
    backend = await RtnlBackend.create(resolver)
    try:
        yield backend
    finally:
        await backend.close()
