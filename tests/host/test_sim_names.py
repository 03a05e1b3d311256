"""The simulated backend looks netdevs up in init_net through one long-lived socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from rdmad.kernel.sim import _IfNames
from testbed.net import VethPair, ip


@pytest.fixture
def names() -> Iterator[_IfNames]:
    looked_up = _IfNames()
    try:
        yield looked_up
    finally:
        looked_up.close()


def test_it_finds_a_netdev_by_name_and_by_index_as_the_libc_calls_do(
    names: _IfNames, veth: VethPair
) -> None:
    index = names.index_of(veth.host)
    assert index == socket.if_nametoindex(veth.host)
    assert names.name_of(index) == veth.host


def test_it_follows_a_rename(names: _IfNames, veth: VethPair) -> None:
    index = names.index_of(veth.host)
    ip("link", "set", "dev", veth.host, "name", veth.host + "r")
    try:
        assert names.name_of(index) == veth.host + "r"
    finally:
        ip("link", "set", "dev", veth.host + "r", "name", veth.host)


def test_a_missing_or_impossible_netdev_is_index_0_and_no_name(names: _IfNames) -> None:
    assert names.index_of("rdmad-no-such") == 0
    assert names.index_of("x" * 16) == 0  # longer than IFNAMSIZ allows
    assert names.index_of("") == 0
    assert names.name_of(0) is None
    assert names.name_of(2**31 - 1) is None
