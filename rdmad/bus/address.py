"""A D-Bus address checked before anything connects to it (rdmactl, rdmad-exporter,
rdmad-dra), and which bus those clients call rdmad on.

dbus-fast parses an address only in MessageBus's constructor, which needs a running loop,
and keeps its parser private. These are the rules that parser applies (dbus-fast 5.2.0), so
an address passes here exactly when MessageBus takes it; tests/bus/test_address.py holds
the two to the same answers.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

from dbus_fast import InvalidAddressError

SYSTEM_BUS = "unix:path=/var/run/dbus/system_bus_socket"  # the D-Bus specification's default

# The D-Bus spec's optionally-escaped bytes, less '*' (dbus-fast refuses it), plus '%'.
_VALUE = re.compile(r"[-0-9A-Za-z_/.%]*")


def check_bus_address(text: str) -> None:
    """Raise InvalidAddressError saying what is wrong with `text`, if anything.

    An address is `transport:key=value,...`; several are separated by ';'."""
    addresses = [a for a in text.split(";") if a]
    if not addresses:
        raise InvalidAddressError("no address in it")
    for address in addresses:
        _, colon, options = address.partition(":")
        if not colon:
            raise InvalidAddressError("no transport (such as 'unix:')")
        for option in filter(None, options.split(",")):
            key, equals, value = option.partition("=")
            if not equals:
                raise InvalidAddressError(f"option {key!r} has no value")
            if not _VALUE.fullmatch(value):
                raise InvalidAddressError(f"option {key!r} has characters that need %-escaping")
            if key != "abstract" and "\0" in unquote(value):
                raise InvalidAddressError(f"option {key!r} has a NUL byte")


def bus_address(given: str | None) -> str:
    """The bus to call rdmad on: `given` (--bus-address), else $DBUS_SYSTEM_BUS_ADDRESS, else
    the system bus. One that is not a D-Bus address raises ValueError naming where it came
    from: no retry would ever reach it, so it is the user's to fix, not "unreachable"."""
    for source, address in (
        ("--bus-address", given),
        ("$DBUS_SYSTEM_BUS_ADDRESS", os.environ.get("DBUS_SYSTEM_BUS_ADDRESS")),
    ):
        if address:
            try:
                check_bus_address(address)
            except InvalidAddressError as exc:
                raise ValueError(
                    f"{source}: {address!r} is not a D-Bus address ({exc}); "
                    f"for example {SYSTEM_BUS}"
                ) from exc
            return address
    return SYSTEM_BUS
