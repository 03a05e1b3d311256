"""Fixtures for tests against the real kernel. Every test here needs root."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rtnl import RtnlBackend
from testbed.net import VethPair, temp_veth


@pytest.fixture(autouse=True)
def _root(root: None) -> None:
    """Every test here needs root (the `root` marker, from tests/conftest.py)."""


@pytest.fixture
def channel() -> Iterator[NlChannel]:
    """An rtnetlink channel in init_net, as the daemon opens it (strict checking)."""
    c = NlChannel.open(socket.NETLINK_ROUTE)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def veth() -> Iterator[VethPair]:
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
