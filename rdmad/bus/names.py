"""Every name rdmad puts on the bus, in one place (bleak's `defs` module, systemd's
bus_label_escape for object paths)."""

from __future__ import annotations

import functools

from rdmad.errors import (
    ALL_ERRORS,
    AccessDenied,
    DeviceBusy,
    InvalidArgs,
    InvalidNetns,
    KernelError,
    ModeBusy,
    NoSuchClaim,
    NoSuchDevice,
    NotSupported,
    RdmadError,
    Unavailable,
)

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

# Error names. The classes in rdmad.errors are the source of truth; these are for clients.
ERROR_FAILED = RdmadError.dbus_name
ERROR_NO_SUCH_DEVICE = NoSuchDevice.dbus_name
ERROR_NO_SUCH_CLAIM = NoSuchClaim.dbus_name
ERROR_DEVICE_BUSY = DeviceBusy.dbus_name
ERROR_INVALID_NETNS = InvalidNetns.dbus_name
ERROR_NOT_SUPPORTED = NotSupported.dbus_name
ERROR_MODE_BUSY = ModeBusy.dbus_name
ERROR_UNAVAILABLE = Unavailable.dbus_name
ERROR_KERNEL = KernelError.dbus_name
ERROR_INVALID_ARGS = InvalidArgs.dbus_name
ERROR_ACCESS_DENIED = AccessDenied.dbus_name
ERROR_NAMES: frozenset[str] = frozenset([RdmadError.dbus_name, *(e.dbus_name for e in ALL_ERRORS)])

_HEX = "0123456789abcdef"


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


def unescape_label(label: str) -> str:
    """Invert escape_label. Raises ValueError on text escape_label cannot produce."""
    if label == "_":
        return ""
    raw = bytearray()
    i = 0
    while i < len(label):
        ch = label[i]
        if ch == "_":
            pair = label[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise ValueError(f"bad escape in object-path label {label!r}")
            raw.append(int(pair, 16))
            i += 3
        elif _plain(ch):
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"character {ch!r} cannot appear in an object-path label")
    return raw.decode("utf-8", "surrogateescape")


def device_path(name: str) -> str:
    return f"{DEVICE_PREFIX}/{escape_label(name)}"


def claim_path(claim_id: str) -> str:
    return f"{CLAIM_PREFIX}/{escape_label(claim_id)}"


def label_of(path: str) -> str:
    """The unescaped last element of a device or claim path."""
    return unescape_label(path.rsplit("/", 1)[-1])
