"""Every error rdmad reports, in one hierarchy.

Each class carries the D-Bus error name the bus edge replies with, so the core can raise
without knowing about D-Bus and the edge maps errors in one place. When callers get each
one: docs/dbus-api.md, "Errors".
"""

from __future__ import annotations

import errno
import os

_PREFIX = "io.rdmad1.Error."


class RdmadError(Exception):
    """Base of every error a caller can see. The message is shown to humans as is."""

    dbus_name = _PREFIX + "Failed"


class NoSuchDevice(RdmadError):
    dbus_name = _PREFIX + "NoSuchDevice"


class NoSuchClaim(RdmadError):
    dbus_name = _PREFIX + "NoSuchClaim"


class DeviceBusy(RdmadError):
    dbus_name = _PREFIX + "DeviceBusy"


class InvalidNetns(RdmadError):
    """Not a network namespace, init_net itself, or not found."""

    dbus_name = _PREFIX + "InvalidNetns"


class NotSupported(RdmadError):
    """The kernel said EOPNOTSUPP, or the subsystem is in the wrong mode."""

    dbus_name = _PREFIX + "NotSupported"


class NoSuchCgroup(RdmadError):
    """A claim's cgroup does not exist (or is no cgroup v2 directory)."""

    dbus_name = _PREFIX + "NoSuchCgroup"


class ModeBusy(RdmadError):
    """SetNetnsMode while other network namespaces exist (kernel EBUSY)."""

    dbus_name = _PREFIX + "ModeBusy"


class Unavailable(RdmadError):
    """No RDMA subsystem is present."""

    dbus_name = _PREFIX + "Unavailable"


class KernelError(RdmadError):
    """Any other kernel failure; the errno name and text are in the message."""

    dbus_name = _PREFIX + "KernelError"

    def __init__(self, err: int, what: str) -> None:
        self.errno = err
        name = errno.errorcode.get(err, f"E{err}")
        super().__init__(f"{what}: {name} ({os.strerror(err)})")


class InvalidArgs(RdmadError):
    dbus_name = "org.freedesktop.DBus.Error.InvalidArgs"


class AccessDenied(RdmadError):
    dbus_name = "org.freedesktop.DBus.Error.AccessDenied"


def from_errno(err: int, what: str) -> RdmadError:
    """Map a kernel errno from an operation on `what` to the named error a caller sees."""
    if err in (errno.EOPNOTSUPP, errno.ENOTSUP):
        return NotSupported(f"{what}: the kernel does not support this ({os.strerror(err)})")
    # EPERM too: the kernel refused the daemon (no CAP_NET_ADMIN, a seccomp or LSM rule),
    # which is not the caller's fault, so it is not AccessDenied.
    return KernelError(err, what)
