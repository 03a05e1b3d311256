"""RdmaBackend over the kernel's RDMA netlink (rdma_nl codec on an NlChannel) and sysfs."""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable

from rdmad.core.backend import NetnsTarget, Placement
from rdmad.errors import (
    ModeBusy,
    NoSuchDevice,
    NotSupported,
    RdmadError,
    Unavailable,
)
from rdmad.kernel import rdma_nl as nl
from rdmad.kernel import rdma_stats
from rdmad.kernel.netlink import Build, Message, kernel_error
from rdmad.kernel.netns import move_from_netns, run_in_netns
from rdmad.kernel.nlsocket import NlChannel, open_socket, transact
from rdmad.kernel.rdma_gids import claim_gids
from rdmad.kernel.rdma_sysfs import sysfs_facts
from rdmad.model import CharDev, ChardevKind, Gid, NetnsMode, Port, PortCounters, RdmaDevice

DEV_DIR = "/dev/infiniband"
_SOFTWARE_DRIVERS = {nl.DRIVER_ID_RXE: "rxe", nl.DRIVER_ID_SIW: "siw"}
# Without ib_uverbs there is no driver id; a software device's protocol still says which.
_SOFTWARE_BY_PROTOCOL = {"roce": "rxe", "iw": "siw"}
_LINK_LAYER_BY_PROTOCOL = {
    "ib": "InfiniBand",
    "opa": "InfiniBand",
    "roce": "Ethernet",
    "iw": "Ethernet",
}
# The kernel's "no such device here" answers (the index is looked up in the socket's netns).
_GONE = (errno.EINVAL, errno.ENODEV, errno.ENOENT)


def _gone(name: str) -> NoSuchDevice:
    return NoSuchDevice(f"RDMA device {name} went away while its counters were read")


def _index_by_name(messages: list[Message], name: str) -> int | None:
    return next((d.index for d in map(nl.dev_info, messages) if d.name == name), None)


class KernelRdma:
    """Implements rdmad.core.backend.RdmaBackend for the running kernel.

    `init_netns_fd` is an fd of init_net (the daemon's own netns), kept open by its owner:
    the NET_NS_FD of every move home. `rtnl` is init_net's rtnetlink channel: a shared
    claim's GID entries follow its netdev's addresses.
    """

    def __init__(self, rtnl: NlChannel, *, init_netns_fd: int) -> None:
        self._rtnl = rtnl
        self._init_fd = init_netns_fd
        self._sock: NlChannel | None = None

    # -- plumbing ---------------------------------------------------------------------

    def _socket(self) -> NlChannel:
        if self._sock is None or self._sock.closed:
            try:
                self._sock = NlChannel.open(nl.NETLINK_RDMA)
            except OSError as e:
                raise kernel_error(e, "opening RDMA netlink") from e
        return self._sock

    async def _request(
        self, build: Build, what: str, sock: NlChannel | None = None
    ) -> list[Message]:
        s = sock or self._socket()
        try:
            return await s.request(build)
        except OSError as e:
            if e.errno == errno.ECONNREFUSED and s is self._sock:
                s.close()  # ib_core went away under us; reopen on the next call
                self._sock = None
            raise kernel_error(e, what) from e

    # -- RdmaBackend ------------------------------------------------------------------

    async def netns_mode(self) -> NetnsMode:
        try:
            (msg,) = await self._request(nl.get_sys, "reading the RDMA netns mode")
        except Unavailable:
            return NetnsMode.UNAVAILABLE
        return NetnsMode.SHARED if nl.sys_info(msg).netns_shared else NetnsMode.EXCLUSIVE

    async def set_netns_mode(self, mode: NetnsMode) -> None:
        """`mode`: shared or exclusive (rdmad.options.parse_netns_mode)."""
        build = functools.partial(nl.set_netns_mode, shared=mode is NetnsMode.SHARED)
        try:
            await self._request(build, f"setting the RDMA netns mode to {mode}")
        except RdmadError as e:
            if getattr(e, "errno", None) == errno.EBUSY:
                raise ModeBusy(
                    f"cannot switch the RDMA subsystem to {mode} mode while other network "
                    "namespaces exist (the kernel answers EBUSY): stop the containers and "
                    "delete the other namespaces (ip netns del ...), or persist "
                    f"'options ib_core netns_mode={int(mode is NetnsMode.SHARED)}' in "
                    "/etc/modprobe.d and reboot"
                ) from e
            raise

    async def list_devices(self) -> list[RdmaDevice]:
        devices = await self._request(nl.get_dev, "listing RDMA devices")
        out = []
        for info in map(nl.dev_info, devices):
            try:
                out.append(await self._describe(info))
            except RdmadError as e:
                if getattr(e, "errno", None) in _GONE:
                    continue  # unregistered or moved away while we looked
                raise
        return out

    async def get_device(self, index: int) -> RdmaDevice | None:
        try:
            (msg,) = await self._request(
                functools.partial(nl.get_dev, index=index), f"reading RDMA device {index}"
            )
            return await self._describe(nl.dev_info(msg))
        except RdmadError as e:
            if getattr(e, "errno", None) in _GONE:
                return None
            raise

    async def move(self, index: int, target: NetnsTarget) -> None:
        build = functools.partial(nl.set_dev_netns, index=index, netns_fd=target.fd)

        def from_init_net() -> None:
            # Socket and sending thread both in init_net: the device's current netns.
            with open_socket(nl.NETLINK_RDMA, blocking=True) as sock:
                transact(sock, build)

        what = f"moving RDMA device {index} to {target.path or 'netns'}"
        await self._send_move(self._init_fd, from_init_net, what, f"RDMA device {index}")

    async def move_home(self, name: str, source: NetnsTarget) -> None:
        init_fd = self._init_fd

        def in_source() -> None:
            # The kernel moves from the sending thread's netns and finds the device in the
            # socket's netns: both must be `source`, so create and send from in there.
            with open_socket(nl.NETLINK_RDMA, blocking=True) as sock:
                index = _index_by_name(transact(sock, nl.get_dev, 1), name)
                if index is None:
                    raise NoSuchDevice(f"no RDMA device {name} in {source.path or 'that netns'}")
                transact(
                    sock, functools.partial(nl.set_dev_netns, index=index, netns_fd=init_fd), 2
                )

        what = f"moving RDMA device {name} back to init_net"
        await self._send_move(source.fd, in_source, what, f"{name} home")

    async def _send_move(
        self, from_fd: int, send: Callable[[], None], what: str, moving: str
    ) -> None:
        """Send a move on the mover thread from the netns at `from_fd`; a refusal names the
        reason the kernel does not tell (see _why_not)."""
        try:
            await move_from_netns(from_fd, send)
        except OSError as e:
            mapped = kernel_error(e, what)
            if isinstance(mapped, NotSupported):
                raise NotSupported(f"cannot move {moving}: {await self._why_not()}") from e
            raise mapped from e

    async def chardevs(
        self,
        device: RdmaDevice,
        kinds: tuple[ChardevKind, ...],
        inside: NetnsTarget | None,
    ) -> tuple[CharDev, ...]:
        sock = self._socket() if inside is None else await self._open_in(inside)
        try:
            return await self._chardevs(sock, device, kinds)
        finally:
            if sock is not self._sock:
                sock.close()

    async def gids(
        self, device: str, inside: NetnsTarget | None, netdev: Placement | None
    ) -> tuple[Gid, ...]:
        return await claim_gids(device, inside, netdev, self._rtnl)

    async def counters(
        self, device: RdmaDevice, inside: NetnsTarget | None
    ) -> tuple[PortCounters, ...]:
        # In init_net when it is there (a whole-device claim in shared mode leaves it), where
        # sysfs shows it too; else in the claim's netns (exclusive mode moved it there).
        try:
            return await self._counters(self._socket(), device, in_init_net=True)
        except NoSuchDevice:
            if inside is None:
                raise
        sock = await self._open_in(inside)
        try:
            return await self._counters(sock, device, in_init_net=False)
        finally:
            sock.close()

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- helpers ----------------------------------------------------------------------

    async def _open_in(self, target: NetnsTarget) -> NlChannel:
        try:
            sock = await run_in_netns(target.fd, functools.partial(open_socket, nl.NETLINK_RDMA))
            return NlChannel(sock)
        except OSError as e:
            raise kernel_error(e, f"opening RDMA netlink in {target.path or 'netns'}") from e

    async def _why_not(self) -> str:
        """EOPNOTSUPP has two causes the kernel does not tell apart: ask which one."""
        if await self.netns_mode() is NetnsMode.SHARED:
            return (
                "the RDMA subsystem is in shared mode; devices move between network "
                "namespaces only in exclusive mode (SetNetnsMode exclusive)"
            )
        return "the driver cannot change netns (it lacks disassociate_ucontext support)"

    async def _describe(self, info: nl.DevInfo) -> RdmaDevice:
        ports_msgs = await self._request(
            functools.partial(nl.get_ports, index=info.index), f"listing ports of {info.name}"
        )
        ports = sorted(map(nl.port_info, ports_msgs), key=lambda p: p.port)
        facts = sysfs_facts(info.name)
        uverbs = await self._try_chardev("uverbs", info.index)
        nodes = [uverbs] if uverbs else []
        for p in ports:
            for kind in ("umad", "issm"):
                node = await self._try_chardev(kind, info.index, p.port)
                if node:
                    nodes.append(node)
        driver = facts.driver
        if facts.virtual:
            by_id = _SOFTWARE_DRIVERS.get(uverbs.driver_id) if uverbs else None
            driver = by_id or _SOFTWARE_BY_PROTOCOL.get(info.protocol, "")
        port1 = next((p for p in ports if p.port == 1), None)
        return RdmaDevice(
            index=info.index,
            name=info.name,
            node_guid=info.node_guid,
            driver=driver,
            link_layer=facts.link_layer or _LINK_LAYER_BY_PROTOCOL.get(info.protocol, ""),
            ports=tuple(Port(p.port, p.state, p.phys_state, p.netdev) for p in ports),
            netdev=port1.netdev if port1 else "",
            netdev_ifindex=port1.netdev_index if port1 and port1.netdev else 0,
            pci_address=facts.pci_address,
            numa_node=facts.numa_node,
            chardevs=tuple(f"{DEV_DIR}/{n.name}" for n in nodes),
            parent=facts.parent,
            virtual=facts.virtual,
        )

    async def _try_chardev(
        self, kind: str, index: int, port: int | None = None
    ) -> nl.ChardevInfo | None:
        """A device's char device, or None when its client is absent (e.g. no ib_umad)."""
        build = functools.partial(nl.get_chardev, kind=kind, index=index, port=port)
        try:
            (msg,) = await self._request(build, f"reading the {kind} char device")
        except RdmadError as e:
            if isinstance(e, NotSupported) or getattr(e, "errno", None) in _GONE:
                return None
            raise
        return nl.chardev_info(msg)

    async def _chardevs(
        self, sock: NlChannel, device: RdmaDevice, kinds: tuple[ChardevKind, ...]
    ) -> tuple[CharDev, ...]:
        there = await self._find(sock, device)
        index, nports = there.index, there.ports
        out: list[CharDev] = []
        for kind in kinds:
            for index_arg, port in self._chardev_args(kind, index, nports):
                build = functools.partial(
                    nl.get_chardev, kind=str(kind), index=index_arg, port=port
                )
                what = f"reading the {kind} char device of {device.name}"
                try:
                    (msg,) = await self._request(build, what, sock)
                except NotSupported as e:
                    raise NotSupported(
                        f"{device.name} has no {kind} char device: its kernel client is not "
                        f"loaded or does not serve this device (rxe has no issm)"
                    ) from e
                info = nl.chardev_info(msg)
                out.append(CharDev(kind, f"{DEV_DIR}/{info.name}", info.major, info.minor))
        return tuple(out)

    async def _find(self, sock: NlChannel, device: RdmaDevice) -> nl.DevInfo:
        """`device` as the netns `sock` is in sees it. Asked by the index we know, and taken
        only if the name matches: never trust an index from before a move. Else (or if the
        kernel does not know it there) looked up by name in a listing of every device there,
        which on a node with many devices costs a message each."""
        try:
            (msg,) = await self._request(
                functools.partial(nl.get_dev, index=device.index), "reading RDMA devices", sock
            )
            info = nl.dev_info(msg)
            if info.name == device.name:
                return info
        except RdmadError as e:
            if getattr(e, "errno", None) not in _GONE:
                raise
        listing = await self._request(nl.get_dev, "listing RDMA devices", sock)
        found = next((d for d in map(nl.dev_info, listing) if d.name == device.name), None)
        if found is None:
            raise NoSuchDevice(f"RDMA device {device.name} is not visible there")
        return found

    async def _counters(
        self, sock: NlChannel, device: RdmaDevice, *, in_init_net: bool
    ) -> tuple[PortCounters, ...]:
        try:
            info = await self._find(sock, device)
        except NoSuchDevice as e:
            raise _gone(device.name) from e
        out = []
        for port in range(1, info.ports + 1):
            build = functools.partial(rdma_stats.get_port_stats, index=info.index, port=port)
            try:
                what = f"reading the counters of {device.name}"
                (msg,) = await self._request(build, what, sock)
                counters = rdma_stats.port_stats(msg).counters
            except RdmadError as e:
                # EINVAL also means "this port has no hw counters": tell it from "gone".
                if not isinstance(e, NotSupported) and getattr(e, "errno", None) not in _GONE:
                    raise
                try:
                    again = await self._find(sock, device)
                except NoSuchDevice:
                    raise _gone(device.name) from e
                if again.index != info.index:
                    raise _gone(device.name) from e
                counters = {}
            # This process's sysfs shows init_net's devices only (the class is netns-tagged).
            if in_init_net:
                sysfs = rdma_stats.sysfs_port_counters(device.name, port)
                counters = sysfs | counters
            out.append(PortCounters(port, counters))
        return tuple(out)

    @staticmethod
    def _chardev_args(
        kind: ChardevKind, index: int, nports: int
    ) -> list[tuple[int | None, int | None]]:
        if kind is ChardevKind.RDMA_CM:
            return [(None, None)]
        if kind is ChardevKind.UVERBS:
            return [(index, None)]
        return [(index, port) for port in range(1, nports + 1)]
