"""argparse types and options shared by rdmad's command-line tools (rdmactl, rdmad-exporter,
rdmad-dra)."""

from __future__ import annotations

import argparse
from typing import Any


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_bus_address(p: argparse.ArgumentParser | argparse._ArgumentGroup, **kw: Any) -> None:
    """--bus-address, as every client of rdmad takes it (rdmad.bus.address.bus_address)."""
    p.add_argument(
        "--bus-address",
        metavar="ADDRESS",
        help="D-Bus address of rdmad's bus (default: $DBUS_SYSTEM_BUS_ADDRESS, else the "
        "system bus)",
        **kw,
    )
