"""11. rdmad's own netlink layer against pyroute2, the tests' independent decoder, on real
netdevs: veth pairs (each end with an IPv4 address) in a private netns made for the run.

1. Decoding RTM_NEWLINK messages from their bytes: rdmad's (rtnl_msgs.link_from over
   netlink.split) against pyroute2's full decode (its Marshal), on the messages of one real
   dump of the netns: as the daemon asks for it (IFLA_EXT_MASK skipping stats) and with
   every attribute (as a link event carries it). A sample is one pass over the dump, per
   message.
2. One GETLINK round trip: an NlChannel on the event loop (as the daemon sends it) against
   pyroute2's AsyncIPRoute and its IPRoute (timed on a thread of its own, no hop counted).
   pyroute2 asks with the same IFLA_EXT_MASK, so the kernel does the same work for all.
3. A claim's host-config read: RtnlBackend.host_config (a GETLINK and an address dump the
   kernel filters by index) against the same two requests through AsyncIPRoute, and against
   pyroute2's own `addr("dump", index=...)`, which asks for every address of the netns and
   filters them in Python.
4. Whether one ENOBUFS leaves each socket usable for a next request: each subscribes to link
   events and reads none while a link of the netns changes many times, then reads the way
   its library reads events (rdmad: an NlSubscription), then sends one GETLINK.

Columns run rep by rep in a rotating order. Rows judge wall times and give each column's CPU
time too (of the thread that ran it): on a loaded host, the figure that moves least between
runs. docs/kernel-notes.md ("pyroute2") quotes a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pyroute2 import AsyncIPRoute, IPRoute
from pyroute2.netlink import NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTMGRP_LINK
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from bench.common import BENCH_NET, Params, Results, Row, ip_batch
from bench.stats import RatioCheck, pct, spread
from rdmad.kernel.netlink import HEADER, NLM_F_DUMP, Build, Message, align, attr_u32, encode, split
from rdmad.kernel.netns import KernelNetnsResolver, run_in_netns
from rdmad.kernel.nlsocket import NlChannel, NlSubscription, open_socket
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_msgs import (
    IFLA_EXT_MASK,
    RTEXT_FILTER_SKIP_STATS,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_NEWLINK,
    RTNLGRP_LINK,
    Link,
    getlink,
    link_from,
)
from rdmad.model import HostConfig
from tests.support.net import ip, ip_json, temp_netns, wait_for

N_FULL, N_SMOKE = 64, 4  # veth ends in the netns (lo besides)
MEASURED = "v0a"  # the netdev the requests are about
# The overrun probes: each socket asks for this receive buffer (the kernel doubles it), then
# misses this many link changes, far more than it holds.
RCVBUF = 32768
FLOOD = 256
MARKER_MTU = 1234  # a change after the flood (which sets 1280-1479)
TIMEOUT_S = 5.0
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change


class Took(NamedTuple):
    """One operation's time: wall, and CPU of the thread that ran it (the thread's own work,
    which the host's other load stretches far less than the wall time)."""

    wall: float
    cpu: float


Timed = Callable[[], Awaitable[Took]]  # one operation; returns its own time


def frame(msg: Message) -> bytes:
    """A message's bytes as the kernel sent them (netlink.split keeps only the payload)."""
    size = HEADER.size + len(msg.payload)
    header = HEADER.pack(size, msg.type, msg.flags, msg.seq, msg.pid)
    return header + msg.payload + b"\0" * (align(size) - size)


def link_dump_request(ext_mask: int) -> Build:
    """An RTM_GETLINK dump of every netdev; with `ext_mask`, IFLA_EXT_MASK as rdmad sends it."""
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    if ext_mask:
        body += attr_u32(IFLA_EXT_MASK, ext_mask)
    return lambda seq: encode(RTM_GETLINK, body, seq=seq, flags=NLM_F_DUMP)


async def interleaved(columns: dict[str, Timed], reps: int, warmup: int) -> dict[str, list[Took]]:
    """`warmup` + `reps` rounds of every column, each round in the next rotation of their
    order, so that over the measured rounds each column takes each place equally often (when
    `reps` is a multiple of the columns). Returns the measured rounds' times."""
    names = list(columns)
    out: dict[str, list[Took]] = {name: [] for name in names}
    for i in range(warmup + reps):
        k = (i - warmup) % len(names)
        for name in names[k:] + names[:k]:
            took = await columns[name]()
            if i >= warmup:
                out[name].append(took)
    return out


def timed(op: Callable[[], Awaitable[object]]) -> Timed:
    """An awaited operation's time, ms (nothing else runs on the loop meanwhile)."""

    async def run() -> Took:
        t0, c0 = time.perf_counter(), time.thread_time()
        await op()
        return Took((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3)

    return run


def timed_on(pool: ThreadPoolExecutor, op: Callable[[], object]) -> Timed:
    """A blocking operation's time (ms) on `pool`'s thread, taken there: the hop to the
    thread is not the library's."""

    def run() -> Took:
        t0, c0 = time.perf_counter(), time.thread_time()
        op()
        return Took((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3)

    return lambda: asyncio.get_running_loop().run_in_executor(pool, run)


def per_message_us(decode: Callable[[bytes], Sequence[object]], blob: bytes, count: int) -> Timed:
    """One pass of `decode` over a dump's bytes; its time per message, us."""

    async def run() -> Took:
        t0, c0 = time.perf_counter(), time.thread_time()
        got = decode(blob)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if len(got) != count:
            raise RuntimeError(f"decoded {len(got)} messages of {count}")
        return Took(wall * 1e6 / count, cpu * 1e6 / count)

    return run


def host_config_of(link: Any, addrs: Sequence[Any]) -> HostConfig:
    """A HostConfig from pyroute2's messages: what RtnlBackend.host_config makes of its own
    (the link's name, MTU and admin state; its addresses but IPv6 link-local ones)."""
    index = int(link["index"])
    cidrs = []
    for a in addrs:
        if a["index"] != index:
            continue
        local = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
        cidr = ipaddress.ip_interface(f"{local}/{a['prefixlen']}")
        if not (cidr.version == 6 and cidr.ip.is_link_local):
            cidrs.append(str(cidr))
    return HostConfig(
        ifindex=index,
        name=str(link.get_attr("IFLA_IFNAME")),
        mtu=int(link.get_attr("IFLA_MTU")),
        up=bool(link["flags"] & 1),  # IFF_UP
        addresses=tuple(cidrs),
    )


@dataclass(frozen=True)
class AfterOverrun:
    """What a socket did with the first request after one ENOBUFS."""

    usable: bool
    detail: str

    def cell(self) -> str:
        return ("yes" if self.usable else "no") + f": {self.detail}"


def _answered(link_name: str) -> AfterOverrun:
    return AfterOverrun(link_name == MEASURED, f"the next GETLINK answered ({link_name})")


def _refused(e: BaseException) -> AfterOverrun:
    return AfterOverrun(False, f"the next GETLINK raised {e!r}")


# ---------------------------------------------------------------------- the netns


@dataclass(frozen=True)
class Netns:
    name: str
    fd: int  # open while the scenario runs

    def flood(self) -> None:
        """FLOOD link changes, each an RTM_NEWLINK to every link subscriber."""
        ip_batch(
            [f"link set {MEASURED} mtu {1280 + i % 200}" for i in range(FLOOD)], netns=self.name
        )


@contextlib.contextmanager
def private_netns(n: int) -> Iterator[Netns]:
    """A netns with n/2 veth pairs v{i}a/v{i}b, down, each end with an IPv4 /32."""
    with temp_netns("rbn") as name:
        ends = [f"v{i}{side}" for i in range(n // 2) for side in "ab"]
        ip_batch([f"link add v{i}a type veth peer name v{i}b" for i in range(n // 2)], netns=name)
        ip_batch([f"addr add {BENCH_NET[i]}/32 dev {e}" for i, e in enumerate(ends)], netns=name)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            yield Netns(name, fd)
        finally:
            os.close(fd)


async def rdmad_channel(ns: Netns, **kwargs: Any) -> socket.socket:
    """A socket as nlsocket opens one, in the netns (made by a thread inside it, as the
    daemon makes its in-netns sockets)."""
    return await run_in_netns(ns.fd, functools.partial(open_socket, socket.NETLINK_ROUTE, **kwargs))


@contextlib.asynccontextmanager
async def async_ipr(ns: Netns, **kwargs: Any) -> AsyncIterator[Any]:
    ipr = AsyncIPRoute(netns=ns.name, **kwargs)
    try:
        await ipr.setup_endpoint()
        yield ipr
    finally:
        ipr.close()


# ---------------------------------------------------------------------- 1. decoding


def rdmad_links(blob: bytes) -> list[Link]:
    return [link_from(m) for m in split(blob)]


async def decode_rows(ch: NlChannel, p: Params, res: Results) -> None:
    marshal = MarshalRtnl()

    def pyroute2_links(blob: bytes) -> list[Any]:
        return list(marshal.parse(blob))

    kinds = (
        ("as the daemon dumps them, no stats", RTEXT_FILTER_SKIP_STATS),
        ("with every attribute, as a link event", 0),
    )
    for kind, mask in kinds:
        msgs = await ch.request(link_dump_request(mask))
        blob = b"".join(map(frame, msgs))
        theirs = pyroute2_links(blob)
        # pyroute2 is the oracle: both read the same names and MTUs from the same bytes
        got = [(x.ifname, x.mtu) for x in rdmad_links(blob)]
        want = [(m.get_attr("IFLA_IFNAME"), m.get_attr("IFLA_MTU")) for m in theirs]
        if got != want:
            raise RuntimeError(f"rdmad read {got}, pyroute2 {want}")
        attrs = sum(len(m["attrs"]) for m in theirs) / len(theirs)
        t = await interleaved(
            {
                "rdmad": per_message_us(rdmad_links, blob, len(msgs)),
                "pyroute2": per_message_us(pyroute2_links, blob, len(msgs)),
            },
            p.reps,
            p.warmup,
        )
        name = f"Netlink decode ({kind})"
        _keep(res, name, t)
        res.rows.append(
            _ratio_row(
                f"11. One RTM_NEWLINK decoded, {kind} ({len(msgs)} messages of a dump, "
                f"{len(blob) / len(msgs):.0f} B and {attrs:.0f} top-level attributes each on "
                f"average; {p.reps} passes)",
                t["rdmad"],
                t["pyroute2"],
                "pyroute2",
                "us",
            )
        )


def _keep(res: Results, name: str, t: dict[str, list[Took]]) -> None:
    """Every column's samples into results.json: wall, and CPU apart."""
    for key, took in t.items():
        res.dists[f"{name}: {key}"] = [x.wall for x in took]
        res.dists[f"{name}: {key} (CPU)"] = [x.cpu for x in took]


def _ratio_row(
    scenario: str,
    ours: list[Took],
    theirs: list[Took],
    who: str,
    unit: str = "ms",
    judged: bool = True,
) -> Row:
    """rdmad against one pyroute2 column, wall times: rdmad/theirs (judged: below 1); since
    that ratio shows two decimals, theirs as a multiple of rdmad's at p50; and the p50s of
    the CPU times."""
    a, b = [x.wall for x in ours], [x.wall for x in theirs]
    ca, cb = pct([x.cpu for x in ours], 50), pct([x.cpu for x in theirs], 50)
    digits = 1 if unit == "us" else 3
    check = RatioCheck.of(f"rdmad/{who}", a, b, 1.0, strict=True)
    extra = (
        f"; {who} takes {pct(b, 50) / pct(a, 50):.1f}x rdmad's wall time at p50; CPU p50 "
        f"rdmad {ca:.{digits}f}, {who} {cb:.{digits}f} {unit} ({cb / ca:.1f}x)"
    )
    return Row(
        scenario,
        spread(a, unit),
        f"{spread(b, unit)} ({who})",
        "-",
        check.text() + extra,
        check.target() if judged else "",
        check.met if judged else None,
    )


# ---------------------------------------------------------------------- 2. and 3. requests


async def pyroute2_host_config(ipr: Any, index: int) -> HostConfig:
    """The host-config read through AsyncIPRoute, with rdmad's two requests: a GETLINK
    without stats, and an address dump with the index in its header (on a strict socket the
    kernel filters it)."""
    (link,) = await ipr.link("get", index=index, ext_mask=RTEXT_FILTER_SKIP_STATS)
    req = ifaddrmsg()
    req["index"] = index
    addrs = [a async for a in await ipr.nlm_request(req, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP)]
    return host_config_of(link, addrs)


async def pyroute2_host_config_own(ipr: Any, index: int) -> HostConfig:
    """The same through pyroute2's own API: its address dump asks for every address of the
    netns (index 0 in the header) and keeps the index's in Python."""
    (link,) = await ipr.link("get", index=index, ext_mask=RTEXT_FILTER_SKIP_STATS)
    return host_config_of(link, [a async for a in await ipr.addr("dump", index=index)])


async def getlink_rows(ns: Netns, ch: NlChannel, index: int, p: Params, res: Results) -> None:
    pool = ThreadPoolExecutor(1, thread_name_prefix="bench-iproute")
    loop = asyncio.get_running_loop()
    # IPRoute runs an event loop of its own in the thread that made it: one thread for all
    sync = await loop.run_in_executor(pool, functools.partial(IPRoute, netns=ns.name))
    try:
        async with async_ipr(ns) as aipr:

            def sync_get() -> object:
                return sync.link("get", index=index, ext_mask=RTEXT_FILTER_SKIP_STATS)

            t = await interleaved(
                {
                    "rdmad": timed(lambda: getlink(ch, index)),
                    "AsyncIPRoute": timed(
                        lambda: aipr.link("get", index=index, ext_mask=RTEXT_FILTER_SKIP_STATS)
                    ),
                    "IPRoute": timed_on(pool, sync_get),
                },
                p.reps // 3 * 3,  # whole rotations of the three columns
                p.warmup,
            )
    finally:
        await loop.run_in_executor(pool, sync.close)
        pool.shutdown()
    _keep(res, "Netlink GETLINK", t)
    for who in ("AsyncIPRoute", "IPRoute"):
        res.rows.append(
            _ratio_row(
                f"11. One GETLINK round trip: rdmad's NlChannel on the loop against pyroute2's "
                f"{who}",
                t["rdmad"],
                t[who],
                who,
            )
        )


async def host_config_rows(ns: Netns, ch: NlChannel, index: int, p: Params, res: Results) -> None:
    resolver = KernelNetnsResolver()
    backend = RtnlBackend(ch, resolver)
    try:
        async with async_ipr(ns, strict_check=True) as aipr:
            ours = await backend.host_config(index)
            same = await pyroute2_host_config(aipr, index)
            own = await pyroute2_host_config_own(aipr, index)
            if not ours == same == own or not ours.addresses:
                raise RuntimeError(f"host configs differ: {ours}, {same}, {own}")
            t = await interleaved(
                {
                    "rdmad": timed(lambda: backend.host_config(index)),
                    "same": timed(lambda: pyroute2_host_config(aipr, index)),
                    "own": timed(lambda: pyroute2_host_config_own(aipr, index)),
                },
                p.reps // 3 * 3,  # whole rotations of the three columns
                p.warmup,
            )
    finally:
        resolver.close()
    _keep(res, "Netlink host config", t)
    res.rows.append(
        _ratio_row(
            "11. A claim's host-config read (GETLINK + address dump filtered by the kernel): "
            "RtnlBackend.host_config against the same requests through AsyncIPRoute",
            t["rdmad"],
            t["same"],
            "AsyncIPRoute",
        )
    )
    addrs = sum(len(x.get("addr_info", [])) for x in ip_json("addr", "show", netns=ns.name))
    res.rows.append(
        _ratio_row(
            '11. The host-config read against pyroute2\'s own addr("dump", index=): every '
            f"address of the netns ({addrs}), filtered in Python",
            t["rdmad"],
            t["own"],
            "AsyncIPRoute",
            judged=False,
        )
    )


# ---------------------------------------------------------------------- 4. overrun


async def rdmad_after_overrun(ns: Netns, index: int) -> AfterOverrun:
    """rdmad's socket: read on by an NlSubscription (the daemon's event reader), which must
    report the overrun and then hear the next change; then a GETLINK on the same socket."""
    sock = await rdmad_channel(ns, groups=(RTNLGRP_LINK,), rcvbuf=RCVBUF)
    ns.flood()  # nothing reads meanwhile: the loop is blocked in it
    overrun = asyncio.Event()
    heard: asyncio.Queue[Message] = asyncio.Queue()
    sub = NlSubscription(sock, heard.put_nowait, overrun.set)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await overrun.wait()
        ip("link", "set", MEASURED, "mtu", str(MARKER_MTU), netns=ns.name)
        await wait_for(
            heard,
            lambda m: m.type == RTM_NEWLINK and link_from(m).mtu == MARKER_MTU,
            TIMEOUT_S,
        )
        # The request goes on the subscription's socket, so the loop stops reading it first.
        asyncio.get_running_loop().remove_reader(sock.fileno())
        try:
            async with asyncio.timeout(TIMEOUT_S):
                link = await getlink(NlChannel(sock), index)
        except (OSError, TimeoutError) as e:
            return _refused(e)
        got = _answered(link.ifname)
        return AfterOverrun(got.usable, "read on past it (the next change arrived); " + got.detail)
    finally:
        sub.close()


async def async_ipr_after_overrun(ns: Netns, index: int) -> AfterOverrun:
    async with async_ipr(ns, rcvbuf=RCVBUF) as ipr:
        await ipr.bind(groups=RTMGRP_LINK)
        ns.flood()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                async for _msg in ipr.get():
                    pass
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
        else:
            raise RuntimeError("AsyncIPRoute read no ENOBUFS after the flood")
        try:
            async with asyncio.timeout(TIMEOUT_S):
                (link,) = await ipr.link("get", index=index)
        except (OSError, TimeoutError) as e:
            return _refused(e)
        return _answered(str(link.get_attr("IFLA_IFNAME")))


def sync_ipr_after_overrun(ns: Netns, index: int) -> AfterOverrun:
    """Blocking: run it on a thread without an event loop (IPRoute makes its own)."""
    ipr = IPRoute(netns=ns.name, rcvbuf=RCVBUF)
    try:
        ipr.bind(groups=RTMGRP_LINK)
        ns.flood()
        try:
            for _msg in ipr.get():
                pass
        except OSError as e:
            if e.errno != errno.ENOBUFS:
                raise
        else:
            raise RuntimeError("IPRoute read no ENOBUFS after the flood")
        try:
            (link,) = ipr.link("get", index=index)
        except OSError as e:
            return _refused(e)
        return _answered(str(link.get_attr("IFLA_IFNAME")))
    finally:
        # close() itself raises the stored ENOBUFS before it frees the socket and the loop
        ipr.asyncore._error_event.clear()
        ipr.close()


async def overrun_rows(ns: Netns, index: int, res: Results) -> None:
    ours = await rdmad_after_overrun(ns, index)
    aipr = await async_ipr_after_overrun(ns, index)
    pool = ThreadPoolExecutor(1, thread_name_prefix="bench-iproute")
    try:
        sipr = await asyncio.get_running_loop().run_in_executor(
            pool, sync_ipr_after_overrun, ns, index
        )
    finally:
        pool.shutdown()
    what = "11. Usable for a next request after one ENOBUFS (link events unread, overrun)"
    res.rows.append(
        Row(
            f"{what}: rdmad's socket (nlsocket)",
            ours.cell(),
            target="yes",
            met=ours.usable,
        )
    )
    for who, got in (("AsyncIPRoute", aipr), ("IPRoute", sipr)):
        res.rows.append(Row(f"{what}: pyroute2's {who}", "-", got.cell()))


# ---------------------------------------------------------------------- the scenario


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    n = N_SMOKE if p.smoke else N_FULL
    with private_netns(n) as ns:
        ch = NlChannel(await rdmad_channel(ns))
        try:
            index = (await getlink(ch, name=MEASURED)).index
            await decode_rows(ch, p, res)
            await getlink_rows(ns, ch, index, p, res)
            await host_config_rows(ns, ch, index, p, res)
        finally:
            ch.close()
        await overrun_rows(ns, index, res)
    res.notes.append(
        f"Netlink (11.): {n} veth ends with an IPv4 address each, down, in a private netns; "
        "pyroute2 0.9's requests carry the same IFLA_EXT_MASK as rdmad's; IPRoute is timed on "
        f"its own thread. The overrun probes ask for a {RCVBUF // 1024} KiB receive buffer and "
        f"miss {FLOOD} link changes."
    )
