"""A small blocking client of rdmad's io.rdmad1 API (jeepney: no event loop to start)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from jeepney import DBusAddress, DBusErrorResponse, new_method_call
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.wrappers import unwrap_msg

from rdmad.cni.spec import RDMAD_FAILED, TRY_AGAIN_LATER, CniError

BUS_NAME = "io.rdmad1"
MANAGER = DBusAddress("/io/rdmad1", BUS_NAME, "io.rdmad1.Manager")
OBJECTS = DBusAddress("/io/rdmad1", BUS_NAME, "org.freedesktop.DBus.ObjectManager")
DEVICE_IFACE = "io.rdmad1.Device"
CLAIM_IFACE = "io.rdmad1.Claim"
SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
# A claim moves a netdev between netns (tens of ms); this bounds a wedged daemon only.
CALL_TIMEOUT_S = 30.0

# Bus errors that mean "rdmad is not there right now": the runtime may try again.
_NOT_THERE = (
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Timeout",
    "org.freedesktop.DBus.Error.TimedOut",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
)
# rdmad's own errors, each its CNI code (100 and up); anything else is RDMAD_FAILED.
ERROR_CODES = {
    "io.rdmad1.Error.Failed": 100,
    "io.rdmad1.Error.NoSuchDevice": 101,
    "io.rdmad1.Error.DeviceBusy": 102,
    "io.rdmad1.Error.InvalidNetns": 103,
    "io.rdmad1.Error.NotSupported": 104,
    "io.rdmad1.Error.Unavailable": 105,
    "io.rdmad1.Error.KernelError": 106,
    "io.rdmad1.Error.NoSuchClaim": 107,
    "io.rdmad1.Error.ModeBusy": 108,
    "org.freedesktop.DBus.Error.InvalidArgs": 109,
    "org.freedesktop.DBus.Error.AccessDenied": 110,
}


class Device(NamedTuple):
    name: str
    driver: str
    link_layer: str
    netdev: str
    pci_address: str
    numa_node: int
    state: str
    claims: int


class ClaimRow(NamedTuple):
    """A live claim as ListClaims lists it."""

    id: str
    device: str
    netns: str  # net:[INODE]
    ifname: str
    owner: str


def bus_address(configured: str) -> str:
    """The config's busAddress, else the system bus (DBUS_SYSTEM_BUS_ADDRESS if set)."""
    return configured or os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "") or SYSTEM_BUS


class Rdmad:
    """One connection; every call raises CniError with the code the spec wants."""

    def __init__(self, conn: DBusConnection) -> None:
        self._conn = conn

    @classmethod
    def connect(cls, address: str) -> Rdmad:
        try:
            return cls(open_dbus_connection(address))
        except (OSError, ValueError) as exc:
            raise CniError(
                TRY_AGAIN_LATER, "rdmad is not reachable", f"bus {address}: {exc}"
            ) from None

    def close(self) -> None:
        self._conn.close()

    def _call(self, address: DBusAddress, method: str, sig: str = "", *body: Any) -> Any:
        msg = new_method_call(address, method, sig or None, body)
        try:
            reply = self._conn.send_and_get_reply(msg, timeout=CALL_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise CniError(TRY_AGAIN_LATER, "rdmad did not answer", str(exc)) from None
        try:
            return unwrap_msg(reply)
        except DBusErrorResponse as exc:
            raise _cni_error(exc) from None

    def version(self) -> str:
        props = DBusAddress("/io/rdmad1", BUS_NAME, "org.freedesktop.DBus.Properties")
        (variant,) = self._call(props, "Get", "ss", "io.rdmad1.Manager", "Version")
        return str(variant[1])

    def devices(self) -> list[Device]:
        """Every device with the properties a selector reads, in one call."""
        (managed,) = self._call(OBJECTS, "GetManagedObjects")
        devices = []
        for ifaces in managed.values():
            if DEVICE_IFACE in ifaces:
                p = {k: v[1] for k, v in ifaces[DEVICE_IFACE].items()}
                devices.append(
                    Device(
                        p["Name"],
                        p["Driver"],
                        p["LinkLayer"],
                        p["NetDevice"],
                        p["PciAddress"],
                        p["NumaNode"],
                        p["State"],
                        len(p["Claims"]),
                    )
                )
        return devices

    def claims(self) -> list[ClaimRow]:
        (rows,) = self._call(MANAGER, "ListClaims")
        return [ClaimRow(*row[:5]) for row in rows]

    def claim(self, device: str, netns: str, options: dict[str, tuple[str, Any]]) -> ClaimRow:
        """Make a claim; returns it as ListClaims would list it."""
        (path,) = self._call(MANAGER, "Claim", "ssa{sv}", device, netns, options)
        props = DBusAddress(path, BUS_NAME, "org.freedesktop.DBus.Properties")
        (p,) = self._call(props, "GetAll", "s", CLAIM_IFACE)
        return ClaimRow(
            p["Id"][1], p["Device"][1], p["Netns"][1], p["InterfaceName"][1], p["Owner"][1]
        )

    def release(self, claim_id: str) -> bool:
        """Release a claim; False when it had already ended (DEL is idempotent)."""
        try:
            self._call(MANAGER, "Release", "s", claim_id)
        except CniError as exc:
            if exc.code == ERROR_CODES["io.rdmad1.Error.NoSuchClaim"]:
                return False
            raise
        return True


def _cni_error(exc: DBusErrorResponse) -> CniError:
    name = str(exc.name)
    text = str(exc.data[0]) if exc.data else ""
    if name in _NOT_THERE:
        return CniError(TRY_AGAIN_LATER, "rdmad is not running", f"{name}: {text}")
    return CniError(ERROR_CODES.get(name, RDMAD_FAILED), f"{name}: {text}")
