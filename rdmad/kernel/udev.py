"""Event sources for RDMA changes: udev (uevents) and the RDMA netlink monitor.

Both are served by the event loop (loop.add_reader), never by a polling thread. Each event
names the device it concerns where it can, so that the core re-reads that device only.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from typing import Any

import pyudev

from rdmad.core.backend import EventSink
from rdmad.core.events import Event, RdmaChanged, Resync
from rdmad.errors import NotSupported
from rdmad.kernel import rdma_nl as nl
from rdmad.kernel.netlink import Message
from rdmad.kernel.nl_events import NetlinkEvents
from rdmad.kernel.nlsocket import NlChannel

# infiniband: the devices; infiniband_verbs/_mad: their uverbs/umad/issm char devices.
# Netdevs are rtnetlink's business, so "net" is not subscribed.
RDMA_SUBSYSTEMS = ("infiniband", "infiniband_verbs", "infiniband_mad")
UDEV_CONTROL = "/run/udev/control"


def new_monitor() -> Any:
    """A pyudev monitor of udevd's events when udevd runs (they arrive after the /dev nodes
    exist), else of the kernel's."""
    source = "udev" if os.path.exists(UDEV_CONTROL) else "kernel"
    return pyudev.Monitor.from_netlink(pyudev.Context(), source=source)


def event_from_uevent(action: str, subsystem: str, sys_name: str) -> RdmaChanged:
    """An RDMA uevent names its device: infiniband/NAME is the device, and the char devices
    (infiniband_verbs/uverbsN, infiniband_mad/umadN, issmN) are the device's nodes."""
    hint = f"{action} {subsystem}/{sys_name}"
    if subsystem == "infiniband":
        return RdmaChanged(hint, device=sys_name)
    return RdmaChanged(hint, chardev=sys_name)


class UdevEvents:
    """Implements rdmad.core.backend.EventSource over a pyudev monitor."""

    def __init__(self) -> None:
        self._monitor: Any = None
        self._sink: EventSink | None = None

    async def start(self, sink: EventSink) -> None:
        monitor = new_monitor()
        for subsystem in RDMA_SUBSYSTEMS:
            monitor.filter_by(subsystem)
        monitor.start()  # subscribed from here on: the caller may enumerate now
        self._monitor, self._sink = monitor, sink
        asyncio.get_running_loop().add_reader(monitor.fileno(), self._readable)

    async def stop(self) -> None:
        if self._monitor is not None:
            asyncio.get_running_loop().remove_reader(self._monitor.fileno())
            self._monitor = None

    def _socket_error(self) -> int:
        """SO_ERROR of the monitor's socket (read on a dup, so the monitor keeps its fd)."""
        assert self._monitor is not None
        with socket.socket(fileno=os.dup(self._monitor.fileno())) as sock:
            return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def _readable(self) -> None:
        assert self._monitor is not None and self._sink is not None
        while True:
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as e:
                # pyudev's poll() turns POLLERR into an OSError without errno, before any
                # recv: take the socket's pending error (ENOBUFS after an overrun) ourselves,
                # which also clears it (else the fd stays readable and this repeats forever).
                if (e.errno or self._socket_error()) != errno.ENOBUFS:
                    raise
                self._sink(Resync("udev"))  # uevents were dropped: re-read everything
                continue
            if device is None:
                return
            if device.subsystem in RDMA_SUBSYSTEMS:
                self._sink(event_from_uevent(device.action, device.subsystem, device.sys_name))


def event_from_monitor(msg: Message) -> Event | None:
    """The RdmaChanged a MONITOR notification means, or None for another message."""
    if nl.cmd_of(msg.type) != nl.Cmd.MONITOR:
        return None
    ev = nl.monitor_event(msg)
    kind = nl.EventType(ev.event).name if ev.event < len(nl.EventType) else str(ev.event)
    return RdmaChanged(f"{kind.lower()} {ev.dev_name or ev.dev_index}", ev.dev_name)


class RdmaMonitorEvents(NetlinkEvents):
    """Implements rdmad.core.backend.EventSource over RDMA netlink MONITOR (newer kernels).

    Notifications arrive on the RDMA_NL_GROUP_NOTIFY multicast group of an init_net socket.
    """

    def __init__(self) -> None:
        groups = (nl.RDMA_NL_GROUP_NOTIFY,)
        super().__init__("rdma-monitor", nl.NETLINK_RDMA, groups, event_from_monitor)

    @staticmethod
    async def supported() -> bool:
        """Whether the kernel has MONITOR (SYS_GET carries SYS_ATTR_MONITOR_MODE)."""
        try:
            sock = NlChannel.open(nl.NETLINK_RDMA)
        except OSError:
            return False
        try:
            (msg,) = await sock.request(nl.get_sys)
            return nl.sys_info(msg).monitor
        finally:
            sock.close()

    async def start(self, sink: EventSink) -> None:
        if not await self.supported():
            raise NotSupported("this kernel has no RDMA netlink monitor")
        await super().start(sink)
