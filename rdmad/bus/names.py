"""Every name rdmad puts on the bus, in one place (bleak's `defs` module, systemd's
bus_label_escape for object paths)."""

from __future__ import annotations

import functools

from dbus_fast import Message

BUS_NAME = "io.rdmad1"
MANAGER_PATH = "/io/rdmad1"
DEVICE_PREFIX = MANAGER_PATH + "/device"
CLAIM_PREFIX = MANAGER_PATH + "/claim"

MANAGER_IFACE = "io.rdmad1.Manager"
DEVICE_IFACE = "io.rdmad1.Device"
CLAIM_IFACE = "io.rdmad1.Claim"

DBUS_NAME = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
OBJECT_MANAGER_IFACE = "org.freedesktop.DBus.ObjectManager"

_HEX = "0123456789abcdef"


def bus_daemon_call(member: str, signature: str, body: list[object]) -> Message:
    """A method call to the bus daemon itself."""
    return Message(
        destination=DBUS_NAME,
        path=DBUS_PATH,
        interface=DBUS_NAME,
        member=member,
        signature=signature,
        body=body,
    )


def name_owner_changed_rule(name: str | None = None) -> str:
    """The match rule for the bus daemon's NameOwnerChanged signal, of `name` alone when
    given (its arg0), else of every name."""
    rule = (
        f"type='signal',sender='{DBUS_NAME}',interface='{DBUS_NAME}',"
        f"member='NameOwnerChanged',path='{DBUS_PATH}'"
    )
    return rule if name is None else f"{rule},arg0='{name}'"


def _plain(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


@functools.lru_cache(maxsize=8192)
def escape_label(text: str) -> str:
    """Make `text` one valid object-path element, as systemd's bus_label_escape does:
    ASCII letters and digits stay, every other byte becomes _XX (lower-case hex), and the
    empty string becomes "_".

    Cached: ListDevices escapes every device name on every call, and this byte loop was
    over half of its time at 1024 devices (docs/performance.md). Names are few and stable."""
    if not text:
        return "_"
    out: list[str] = []
    for byte in text.encode("utf-8", "surrogateescape"):
        ch = chr(byte)
        if _plain(ch):
            out.append(ch)
        else:
            out.append("_" + _HEX[byte >> 4] + _HEX[byte & 15])
    return "".join(out)


def _label(text: str) -> str:
    # A plain name is its own label, with no cache entry: claim ids are new with each claim,
    # and caching them cost a claim the byte loop and pushed the device names out.
    return text if text.isascii() and text.isalnum() else escape_label(text)


def device_path(name: str) -> str:
    return f"{DEVICE_PREFIX}/{_label(name)}"


def claim_path(claim_id: str) -> str:
    return f"{CLAIM_PREFIX}/{_label(claim_id)}"
