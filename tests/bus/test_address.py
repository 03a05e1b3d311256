"""A bus address passes check_bus_address exactly when dbus-fast's MessageBus takes it."""

from __future__ import annotations

import pytest
from dbus_fast import InvalidAddressError
from dbus_fast.aio import MessageBus

from rdmad.bus.address import check_bus_address

TAKEN = [
    "unix:path=/run/dbus/system_bus_socket",
    "unix:abstract=rdmad%00x",  # an abstract name may hold NUL
    "unix:path=/tmp/a%20b,guid=0123abcd",
    "tcp:host=localhost,port=12345",
    "unix:path=/nonexistent;unix:path=/run/dbus/system_bus_socket",
    "unix:path=/x;",  # an empty entry is skipped
    "unix:",  # no options: MessageBus finds out at connect
    "nosuch:path=/x",  # an unknown transport: likewise
]
REFUSED = [
    ";",
    "foo",
    "/run/dbus/system_bus_socket",
    "unix:path",
    "unix:path=/a b",  # needs %-escaping
    "unix:path=/a*b",  # the spec allows '*' unescaped; dbus-fast does not
    "unix:path=/a%00b",
    "unix:path=/ok;foo",
]


@pytest.mark.parametrize("address", TAKEN + REFUSED)
async def test_the_check_agrees_with_message_bus(address: str) -> None:
    # MessageBus parses its address as it is built (before any I/O); building one needs a
    # running loop, which is why rdmactl's argument check cannot use it.
    try:
        MessageBus(bus_address=address)
        bus_takes_it = True
    except InvalidAddressError:
        bus_takes_it = False
    try:
        check_bus_address(address)
        check_takes_it = True
    except InvalidAddressError:
        check_takes_it = False
    assert (check_takes_it, bus_takes_it) == (address in TAKEN, address in TAKEN)


def test_a_refused_address_says_what_is_wrong() -> None:
    with pytest.raises(InvalidAddressError, match="'path' has no value"):
        check_bus_address("unix:path")
