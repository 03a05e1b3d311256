"""rtnetlink: NetdevBackend over rtnl_msgs requests on NlChannels.

One channel lives in init_net. Work inside a claimant's netns goes through a netlink socket
created there by a netns worker thread and closed right after the operation, so the daemon
never keeps a claimed netns alive. Netns moves are sent by a worker thread too
(rtnl_msgs.move_link_blocking): the kernel holds the sender in send() for tens of ms, which
must not stall the event loop. (Figures: docs/performance.md only, dated by their runs.)

Kernel facts that shape this module (measured on 6.18):
- A move with IFLA_NET_NS_FD + IFLA_IFNAME only renames *during* the move when the current
  name is taken in the target; otherwise it moves first and renames after, so EEXIST on the
  new name leaves the netdev in the target under its old name. place() checks and undoes.
- RTM_SETLINK and RTM_NEWLINK ignore IFLA_TARGET_NETNSID for an existing device (ENODEV:
  they look it up in the socket's netns); RTM_GETLINK and RTM_DELLINK honour it.
- IFLA_TARGET_NETNSID together with IFLA_NET_NS_FD is EINVAL ("multiple netns identifying
  attributes"), so a netdev cannot be moved home by nsid from init_net.
- Addresses can only be added from a socket in the netdev's netns.
Hence place() and add_macvlan() configure through an in-netns socket, bring_home() sends
its move from a thread inside the netns, and delete() uses the nsid.

Errors: a name already taken (EEXIST on a move/rename/create) is reported as InvalidArgs
naming the netns and the name, since the caller fixes it by choosing another `ifname`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import replace
from typing import TypeVar

from rdmad.core.backend import NetnsTarget, PlacedNetdev, Placement
from rdmad.core.steps import step
from rdmad.errors import InvalidArgs, InvalidNetns, RdmadError
from rdmad.kernel.netlink import NetlinkError, kernel_error
from rdmad.kernel.netns import (
    KernelNetnsResolver,
    candidate_paths,
    move_from_netns,
    rtnl_socket_in,
)
from rdmad.kernel.nlsocket import NlChannel, rtnl_busy
from rdmad.kernel.rtnl_msgs import (
    Link,
    MoveSocket,
    add_address,
    addresses,
    assign_nsid,
    del_address,
    del_altname,
    dellink,
    dump_links,
    getlink,
    ifindex_of,
    link_mac,
    live_nsids,
    move_link_blocking,
    netns_nsid,
    new_macvlan,
    setlink,
)
from rdmad.kernel.rtnl_routing import (
    add_route,
    add_rule,
    del_route,
    del_rule,
    free_table,
    routes,
    rules,
    set_rail_devconf,
)
from rdmad.model import Cidr, HostConfig, Netdev, Route, netns_label
from rdmad.options import parse_cidr

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# udev may add the altname again while we drop it; a few tries cover its one uevent.
_RENAME_ATTEMPTS = 3


def netdev_from_link(link: Link) -> Netdev:
    """A Netdev from an RTM_NEWLINK message (dump or event)."""
    return Netdev(
        ifindex=link.index,
        name=link.ifname,
        mtu=link.mtu,
        up=link.up,
        kind=link.kind,
        carrier=link.carrier,
    )


def _host_cidrs(host: HostConfig) -> list[Cidr]:
    """A HostConfig's addresses as the Cidr values requests take: it keeps them as strings,
    the form the state file saves."""
    return [parse_cidr(a) for a in host.addresses]


@contextlib.contextmanager
def _op(what: str) -> Iterator[None]:
    """Translate a NetlinkError into the named error a caller sees, naming the operation."""
    try:
        yield
    except NetlinkError as e:
        raise kernel_error(e, what) from e


def _is_link_local(iface: Cidr) -> bool:
    # the kernel generates these itself; never flush or re-add them
    return iface.version == 6 and iface.ip.is_link_local


def _placed(mac: str, cidrs: Iterable[Cidr]) -> PlacedNetdev:
    """A placed netdev as its claim shows it, its addresses in PlacedNetdev's order."""
    shown = sorted((c for c in cidrs if not _is_link_local(c)), key=lambda c: (c.version, c))
    return PlacedNetdev(mac, tuple(str(c) for c in shown))


class _Opening:
    """A handle's in-netns rtnetlink channel, on its socket (netns.rtnl_socket_in), which
    closes with the handle."""

    def __init__(self, target: NetnsTarget) -> None:
        self._ns = asyncio.ensure_future(self._wrap(rtnl_socket_in(target)))
        self._where = netns_label(target.inode)

    @staticmethod
    async def _wrap(sock: Awaitable[socket.socket]) -> NlChannel:
        return NlChannel(await sock)

    async def channel(self) -> NlChannel:
        try:
            return await asyncio.shield(self._ns)
        except OSError as e:  # setns() or socket() on the worker
            raise kernel_error(e, f"opening rtnetlink in {self._where}") from e


class RtnlBackend:
    """Implements rdmad.core.backend.NetdevBackend. Build with
    `await RtnlBackend.create(resolver)`."""

    def __init__(self, nl: NlChannel, resolver: KernelNetnsResolver) -> None:
        self._nl = nl
        self._mover = MoveSocket()  # made on the loop's thread: in init_net
        self._resolver = resolver
        # A netns's nsid cannot change while a handle of ours holds the netns: ask once per
        # handle (a claim needs it before and after the move).
        self._nsids: weakref.WeakKeyDictionary[NetnsTarget, int] = weakref.WeakKeyDictionary()
        self._openings: weakref.WeakKeyDictionary[NetnsTarget, _Opening] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    async def create(cls, resolver: KernelNetnsResolver) -> RtnlBackend:
        return cls(NlChannel.open(socket.NETLINK_ROUTE), resolver)

    @property
    def channel(self) -> NlChannel:
        """init_net's rtnetlink channel, which the RDMA backend reads addresses through."""
        return self._nl

    async def close(self) -> None:
        self._nl.close()
        self._mover.close()

    def _in_netns(self, target: NetnsTarget) -> _Opening:
        """`target`'s rtnetlink socket, from its first use until the handle closes."""
        _ = target.fd  # raises once the handle is closed: never its closed socket
        opening = self._openings.get(target)
        if opening is None:
            opening = self._openings[target] = _Opening(target)
        return opening

    # -- reading init_net -----------------------------------------------------------------

    async def list_netdevs(self) -> list[Netdev]:
        with _op("listing netdevs"):
            return [netdev_from_link(m) for m in await dump_links(self._nl)]

    async def _netdev(self, ifindex: int, what: str) -> Netdev:
        with _op(what + f": reading netdev {ifindex}"):
            msg = await getlink(self._nl, ifindex)
        return netdev_from_link(msg)

    async def get_netdev(self, ifindex: int) -> Netdev | None:
        msg = await _if_there(getlink(self._nl, ifindex), ifindex)
        return None if msg is None else netdev_from_link(msg)

    async def has_netdev(self, ifindex: int) -> bool:
        return await _if_there(link_mac(self._nl, ifindex), ifindex) is not None

    async def host_config(self, ifindex: int) -> HostConfig:
        with _op(f"reading netdev {ifindex}"):
            msg = await getlink(self._nl, ifindex)
            addrs = await addresses(self._nl, ifindex)
            dev = netdev_from_link(msg)
        return HostConfig(
            ifindex=ifindex,
            name=dev.name,
            mtu=dev.mtu,
            up=dev.up,
            addresses=tuple(str(a) for a in addrs if not _is_link_local(a)),
        )

    # -- claims ----------------------------------------------------------------------------

    async def place(
        self,
        ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
        host: HostConfig | None = None,
    ) -> Placement:
        host = host or await self.host_config(ifindex)
        where = netns_label(target.inode)
        what = f"moving {host.name} into {where} as {ifname}" + (f" with MTU {mtu}" if mtu else "")
        opening = self._in_netns(target)
        try:
            # One message: the netdev arrives with its name, MTU and admin state.
            await self._move(
                self._resolver.init_fd,
                ifindex,
                net_ns_fd=target.fd,
                ifname=ifname,
                mtu=mtu,
                up=True,
                via=self._mover,
            )
        except OSError as e:  # the kernel's refusal, or setns() on the mover thread
            # Not atomic: the kernel moves first, then sets MTU, name and state (and
            # renames after the move unless the old name is taken in the target), so
            # a failed step leaves the netdev in the target as host.name or ifname.
            if not await self._is_home(ifindex, host.name):
                ns = await opening.channel()
                await self._rollback_place(ns, 0, host.name, host, ifname)
            raise self._name_error(e, what, ifname, where) from e
        step("netdev-moved", host.name)
        ns = await opening.channel()

        async def undo(ns_index: int) -> None:
            await self._rollback_place(ns, ns_index, ifname, host)

        ns_index, netdev = await _configure_placed(ns, ifname, addresses, where, undo)
        nsid = await self.nsid(target)
        return Placement(nsid, ns_index, ifname, netdev)

    async def _rollback_place(
        self, ns: NlChannel, ns_index: int, ifname: str, host: HostConfig, *or_names: str
    ) -> None:
        """Move a placed netdev home and restore `host`; found by ns_index, else by the
        first of its possible names in the netns."""
        try:
            for name in (ifname, *or_names):
                if ns_index:
                    break
                with contextlib.suppress(RdmadError):
                    ns_index = await _found(ifindex_of(ns, name), name, "its netns")
            if not ns_index:
                raise InvalidArgs(f"none of {(ifname, *or_names)} is in the netns")
            await setlink(ns, ns_index, net_ns_fd=self._resolver.init_fd, ifname=host.name)
            home = await self._ifindex_of(host.name)
            await self.restore(home, host)
        except Exception:
            log.exception("rolling back the move of %s failed", host.name)

    async def add_macvlan(
        self,
        parent_ifindex: int,
        target: NetnsTarget,
        ifname: str,
        mtu: int | None,
        addresses: tuple[Cidr, ...],
    ) -> Placement:
        where = netns_label(target.inode)
        what = f"creating macvlan {ifname} of netdev {parent_ifindex} in {where}"
        # The in-netns socket is made (by a worker) while the kernel makes the macvlan, as
        # for a move, instead of after it (docs/performance.md, "Shared claim").
        opening = self._in_netns(target)
        try:
            await new_macvlan(self._nl, parent_ifindex, ifname, net_ns_fd=target.fd, mtu=mtu)
        except NetlinkError as e:
            raise self._name_error(e, what, ifname, where) from e
        step("macvlan-created", ifname)
        ns = await opening.channel()

        async def undo(ns_index: int) -> None:
            with contextlib.suppress(NetlinkError):
                await dellink(ns, ns_index, name=ifname)

        ns_index, netdev = await _configure_placed(ns, ifname, addresses, where, undo)
        nsid = await self.nsid(target)
        return Placement(nsid, ns_index, ifname, netdev)

    async def read_placed(self, placement: Placement) -> PlacedNetdev:
        what = f"reading {placement.ifname} (netns id {placement.nsid})"
        with _op(what):
            _, mac = await link_mac(self._nl, placement.ifindex, target_nsid=placement.nsid)
            cidrs = await addresses(self._nl, placement.ifindex, target_nsid=placement.nsid)
        return _placed(mac, cidrs)

    async def bring_home(
        self, placement: Placement, host: HostConfig, source: NetnsTarget | None = None
    ) -> Netdev:
        """Move a placed netdev home and restore `host`.

        The kernel cannot move a netdev out of a netns by nsid (see module doc), so this
        needs a socket inside the netns: pass `source` if the caller has it open, else the
        netns is found by its nsid among the reachable ones and closed right after.
        """
        what = f"bringing {placement.ifname} home as {host.name}"
        opened = None
        if source is None:
            opened = await self.open_by_nsid(placement.nsid)
            if opened is None:
                raise InvalidNetns(
                    f"{what}: no live netns has nsid {placement.nsid} (it is gone or dying; "
                    "the kernel returns physical netdevs by itself)"
                )
            source = opened
        try:
            # Sent from inside the netns: the host MTU there, then the move, which names
            # it: the netdev arrives home with its name and MTU, and down. Changing a
            # netdev's MTU walks every IPv6 route of its netns (rt6_mtu_change): few in
            # the claim's, thousands in init_net on a large node. Set up only once its
            # addresses are back: coming up starts the kernel's own work under the RTNL
            # lock (linkwatch, another walk), and requests sent meanwhile spin on that
            # lock. (Both costs: docs/performance.md, the modelled node.)
            await self._move(
                source.fd,
                placement.ifindex,
                net_ns_fd=self._resolver.init_fd,
                ifname=host.name,
                mtu_before=host.mtu or None,
            )
        except OSError as e:  # the kernel's refusal, or setns() on the mover thread
            raise self._name_error(e, what, host.name, "init_net") from e
        finally:
            if opened is not None:
                opened.close()
        step("netdev-moved-home", host.name)
        link = await _found(getlink(self._nl, name=host.name), host.name, "init_net")
        cur = netdev_from_link(link)
        if host.mtu and cur.mtu != host.mtu:
            await self.restore(cur.ifindex, host)  # something else changed it meanwhile
            return await self._netdev(cur.ifindex, what)
        # A netdev loses all its addresses when it changes netns: add the host's back.
        await _add_addresses(self._nl, cur.ifindex, _host_cidrs(host), what)
        if host.up:
            await _set_state(self._nl, cur.ifindex, None, True, what)
        return replace(cur, up=host.up)

    async def restore(self, ifindex: int, host: HostConfig) -> None:
        cidrs = _host_cidrs(host)
        cur = await self._netdev(ifindex, "restoring")
        what = f"restoring {cur.name} (ifindex {ifindex}) as {host.name}"
        if cur.name != host.name:
            with _op(what + ": setting it down to rename"):
                await setlink(self._nl, ifindex, up=False)
            await self._rename_home(ifindex, host.name, what)
            step("host-renamed", host.name)
        await _sync_addresses(self._nl, ifindex, cidrs, what)
        mtu = host.mtu if host.mtu and cur.mtu != host.mtu else None
        await _set_state(self._nl, ifindex, mtu, host.up, what)

    async def _rename_home(self, ifindex: int, name: str, what: str) -> None:
        """Rename a returned netdev to its host name. udev gives a netdev that comes back
        under another name its predictable name as an *altname*, and the kernel refuses a
        rename to any name in use, its own altnames included: drop that altname first.
        udev does this asynchronously, so the altname can appear after any read of ours:
        check again after each EEXIST instead of trusting an earlier read."""
        for _ in range(_RENAME_ATTEMPTS):
            step("host-renaming", name)
            try:
                await setlink(self._nl, ifindex, ifname=name)
                return
            except NetlinkError as e:
                if e.errno != errno.EEXIST:
                    raise self._name_error(e, what, name, "init_net") from e
                refused = e
            with _op(what + ": reading its altnames"):
                msg = await getlink(self._nl, ifindex)
            if name not in msg.altnames:
                break  # another netdev holds the name: never take it
            with _op(what + f": dropping its altname {name}"):
                await del_altname(self._nl, ifindex, name)
        raise self._name_error(refused, what, name, "init_net") from refused

    async def delete(self, placement: Placement) -> None:
        """Delete by nsid. Already gone (ENODEV) counts as done: the netns may have died."""
        what = f"deleting {placement.ifname} (nsid {placement.nsid})"
        if not placement.ifindex:
            # A claim interrupted before its ifindex was recorded: find the macvlan by name,
            # and only a macvlan, so a netdev of the container's own is never deleted.
            placement = await self._macvlan_by_name(placement)
            if not placement.ifindex:
                return
        try:
            # Unregistering a netdev waits for RCU inside send(), tens of ms: off the loop.
            with rtnl_busy():
                await dellink(self._nl, placement.ifindex, target_nsid=placement.nsid)
        except NetlinkError as e:
            if e.errno == errno.ENODEV:
                return
            if e.errno == errno.EINVAL and placement.nsid not in await self.live_nsids():
                return  # the netns died and took the netdev with it
            raise kernel_error(e, what) from e

    async def _macvlan_by_name(self, placement: Placement) -> Placement:
        try:
            found = await getlink(self._nl, name=placement.ifname, target_nsid=placement.nsid)
        except NetlinkError:
            return placement  # no such name there (or no such netns): nothing to delete
        if found.kind != "macvlan":
            return placement
        return Placement(placement.nsid, found.index, placement.ifname)

    # -- nsids -------------------------------------------------------------------------------

    # -- policy routing ----------------------------------------------------------------------

    async def free_table(self, target: NetnsTarget, candidates: Iterable[int]) -> int:
        where = netns_label(target.inode)
        opening = self._in_netns(target)
        ns = await opening.channel()
        with _op(f"reading the routing tables and rules of {where}"):
            return await free_table(ns, candidates)

    async def add_policy_routing(
        self,
        target: NetnsTarget,
        ifindex: int,
        table: int,
        addresses: tuple[Cidr, ...],
        extra: tuple[Route, ...],
    ) -> None:
        ns = await self._in_netns(target).channel()
        await _add_policy(ns, ifindex, table, addresses, extra, netns_label(target.inode))

    async def remove_policy_routing(self, target: NetnsTarget, table: int) -> None:
        where = netns_label(target.inode)
        opening = self._in_netns(target)
        await _remove_policy(await opening.channel(), table, where)

    async def nsid(self, target: NetnsTarget) -> int:
        _ = target.fd  # raises once the handle is closed: never answer for a stale one
        known = self._nsids.get(target)
        if known is None:
            known = self._nsids[target] = await self._read_or_assign_nsid(target)
        return known

    async def _read_or_assign_nsid(self, target: NetnsTarget) -> int:
        where = netns_label(target.inode)
        with _op(f"reading the nsid of {where}"):
            got = await self._get_nsid(target.fd)
        if got >= 0:
            return got
        try:
            await assign_nsid(self._nl, target.fd)
        except NetlinkError as e:
            if e.errno != errno.EEXIST:  # raced with another assignment: fine
                raise kernel_error(e, f"assigning an nsid to {where}") from e
        with _op(f"reading the nsid of {where}"):
            return await self._get_nsid(target.fd)

    async def _get_nsid(self, fd: int) -> int:
        nsid = await netns_nsid(self._nl, fd)
        return -1 if nsid is None else nsid

    async def live_nsids(self) -> set[int]:
        with _op("listing nsids"):
            return await live_nsids(self._nl)

    async def open_by_nsid(self, nsid: int) -> NetnsTarget | None:
        """Find and open the live netns init_net calls `nsid`, or None. The caller closes it."""
        if nsid < 0:
            return None
        seen: set[int] = set()
        for path in candidate_paths():
            handle = self._resolver.try_open(path)
            if handle is None:
                continue
            if handle.inode in seen:
                handle.close()
                continue
            seen.add(handle.inode)
            try:
                if await self._get_nsid(handle.fd) == nsid:
                    return handle
            except NetlinkError:
                pass
            handle.close()
        return None

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    async def _move(
        from_fd: int,
        index: int,
        *,
        net_ns_fd: int,
        ifname: str,
        mtu: int | None = None,
        up: bool | None = None,
        mtu_before: int | None = None,
        via: MoveSocket | None = None,
    ) -> None:
        """A netns move, sent from the netns open at `from_fd` by a worker thread, so the
        loop keeps serving (see move_link_blocking); on `via`, made in that netns, if given."""
        move = functools.partial(
            move_link_blocking,
            index,
            net_ns_fd=net_ns_fd,
            ifname=ifname,
            mtu=mtu,
            up=up,
            mtu_before=mtu_before,
            via=via,
        )
        await move_from_netns(from_fd, move)

    async def _is_home(self, ifindex: int, name: str) -> bool:
        try:
            msg = await getlink(self._nl, ifindex)
        except NetlinkError:
            return False
        return msg.ifname == name

    async def _ifindex_of(self, name: str) -> int:
        return await _found(ifindex_of(self._nl, name), name, "init_net")

    @staticmethod
    def _name_error(e: OSError, what: str, name: str, where: str) -> RdmadError:
        if e.errno == errno.EEXIST:
            return InvalidArgs(f"{what}: the name {name} is already taken in {where}")
        return kernel_error(e, what)


async def _add_policy(
    ns: NlChannel,
    ifindex: int,
    table: int,
    addresses: tuple[Cidr, ...],
    extra: tuple[Route, ...],
    where: str,
) -> None:
    """A rail's policy routing in its netns: its devconf, the connected routes of its
    addresses and `extra` in `table`, and a rule from each address to `table`. All or
    nothing: the table was free, so whatever is in it after a failure is ours to remove."""
    connected = list(dict.fromkeys(Route(a.network) for a in addresses))
    try:
        with _op(f"setting arp_ignore, arp_announce and rp_filter of {ifindex} in {where}"):
            await set_rail_devconf(ns, ifindex)
        for r in (*connected, *extra):
            via = f" via {r.via}" if r.via is not None else ""
            with _op(f"adding the route to {r.dst}{via} to table {table} in {where}"):
                await add_route(ns, ifindex, table, r)
        for a in addresses:
            with _op(f"adding the rule from {a.ip} lookup {table} in {where}"):
                await add_rule(ns, a, table)
    except BaseException:
        try:
            await _remove_policy(ns, table, where)
        except RdmadError as exc:
            log.error("rolling back table %d in %s failed: %s", table, where, exc)
        raise


async def _remove_policy(ns: NlChannel, table: int, where: str) -> None:
    """Every rule that looks `table` up and every route in it: a claim's table is its own."""
    with _op(f"removing the rules and routes of table {table} in {where}"):
        for rule in await rules(ns):
            if rule.table == table:
                await del_rule(ns, rule)
        for route in await routes(ns, table):
            await del_route(ns, route)


async def _if_there(read: Awaitable[_T], ifindex: int) -> _T | None:
    """What `read` of netdev `ifindex` in init_net gives; None if there is no such netdev."""
    try:
        return await read
    except NetlinkError as e:
        if e.errno == errno.ENODEV:
            return None
        raise kernel_error(e, f"reading netdev {ifindex}") from e


async def _found(lookup: Awaitable[_T], ifname: str, where: str) -> _T:
    """`lookup`'s answer about netdev `ifname` in `where`; its failure is finding it."""
    with _op(f"finding {ifname} in {where}"):
        return await lookup


async def _configure_placed(
    ns: NlChannel,
    ifname: str,
    cidrs: tuple[Cidr, ...],
    where: str,
    undo: Callable[[int], Awaitable[None]],
) -> tuple[int, PlacedNetdev]:
    """Give a netdev just placed (and brought up) in the netns `ns` talks to its addresses;
    its ifindex there, and what its claim shows of it. It has no other address: the kernel
    drops a netdev's addresses when it leaves a netns, and a new macvlan has none (IPv6
    link-local ones, which it adds itself, are not shown). On any failure,
    `undo(ifindex or 0)` takes the placement back before the error propagates."""
    ns_index = 0
    try:
        ns_index, mac = await _found(link_mac(ns, name=ifname), ifname, where)
        for c in cidrs:
            with _op(f"adding {c} to {ifname} in {where}"):
                await add_address(ns, ns_index, c)
        step("addresses-set", ifname)
    except BaseException:
        await undo(ns_index)
        raise
    return ns_index, _placed(mac, cidrs)


async def _set_state(ch: NlChannel, index: int, mtu: int | None, up: bool, what: str) -> None:
    """The last step of putting a netdev back: MTU and admin state in one message, sent off
    the loop. Coming up on a large node holds the RTNL lock long (linkwatch, a walk of every
    IPv6 route), so it comes after the addresses, and the loop keeps serving meanwhile."""
    with rtnl_busy(), _op(what + ": setting " + ("MTU and " if mtu else "") + "admin state"):
        await setlink(ch, index, mtu=mtu, up=up)


async def _sync_addresses(
    ch: NlChannel,
    index: int,
    wanted: list[Cidr],
    what: str,
) -> None:
    with _op(what + ": reading addresses"):
        current = await addresses(ch, index)
    for c in current:
        if c not in wanted and not _is_link_local(c):
            with _op(what + f": removing {c}"):
                await del_address(ch, index, c)
    await _add_addresses(ch, index, [c for c in wanted if c not in current], what)


async def _add_addresses(ch: NlChannel, index: int, cidrs: list[Cidr], what: str) -> None:
    for c in cidrs:
        with _op(what + f": adding {c}"):
            try:
                await add_address(ch, index, c)
            except NetlinkError as e:
                if e.errno != errno.EEXIST:  # already there: what we want
                    raise
