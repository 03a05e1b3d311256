"""NETLINK_RDMA sockets: an asyncio request/response wrapper and a blocking one-shot helper.

A netlink socket keeps the netns it was created in, and the kernel looks RDMA devices up in
the *socket's* netns; it takes the *sending thread's* netns as the source of a device move.
So: `RdmaSocket.open_in(fd)` creates a socket inside a netns (from a setns'd worker thread)
and then serves it from the event loop; `transact()` is for code already running on such a
thread (rdmad.kernel.netns.run_in_netns) that must also *send* from there.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import socket
from collections.abc import Callable

from rdmad.kernel import rdma_nl as nl
from rdmad.kernel.netns import run_in_netns

SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
_RECV_SIZE = 1 << 17  # a dump datagram is at most 32 KiB on current kernels

Build = Callable[[int], bytes]  # seq -> encoded request


def make_socket(groups: tuple[int, ...] = (), *, blocking: bool = False) -> socket.socket:
    """A NETLINK_RDMA socket in the calling thread's netns.

    Raises OSError(EPROTONOSUPPORT) on a kernel without the RDMA subsystem.
    """
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nl.NETLINK_RDMA)
    try:
        sock.bind((0, 0))
        # Errors echo only the request header, plus the kernel's text when it has one.
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        for group in groups:
            sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        sock.setblocking(blocking)
    except BaseException:
        sock.close()
        raise
    return sock


def transact(sock: socket.socket, build: Build, seq: int = 1) -> list[nl.Message]:
    """Send one request on a blocking socket and collect its reply (raises NetlinkError)."""
    sock.sendall(build(seq))
    reply = nl.Reply(seq)
    while True:
        for msg in nl.split(sock.recv(_RECV_SIZE)):
            if msg.seq == seq and reply.feed(msg):
                return reply.messages


class RdmaSocket:
    """One NETLINK_RDMA socket served by the event loop (loop.add_reader).

    Requests are sent one at a time: the kernel runs at most one dump per netlink socket
    and answers a second one with EBUSY while the first is in progress (netlink_dump_start),
    so concurrent callers (a claim reading char devices while an event re-reads the
    inventory) queue on a lock. Replies are matched by sequence number. Messages with no
    pending request (multicast notifications, seq 0) go to `on_notify`; a receive-queue
    overrun (ENOBUFS) goes to `on_overrun`.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_notify: Callable[[nl.Message], None] | None = None,
        on_overrun: Callable[[], None] | None = None,
    ) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._seq = itertools.count(1)
        self._pending: dict[int, tuple[nl.Reply, asyncio.Future[list[nl.Message]]]] = {}
        self._one_at_a_time = asyncio.Lock()
        self._on_notify = on_notify
        self._on_overrun = on_overrun
        self._loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    def open(
        cls,
        groups: tuple[int, ...] = (),
        *,
        on_notify: Callable[[nl.Message], None] | None = None,
        on_overrun: Callable[[], None] | None = None,
    ) -> RdmaSocket:
        """A socket in the daemon's own netns (init_net)."""
        return cls(make_socket(groups), on_notify=on_notify, on_overrun=on_overrun)

    @classmethod
    async def open_in(cls, netns_fd: int) -> RdmaSocket:
        """A socket bound for good to the netns open at `netns_fd`."""
        return cls(await run_in_netns(netns_fd, make_socket))

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    async def request(self, build: Build) -> list[nl.Message]:
        """Send a request and return its data messages (raises NetlinkError)."""
        async with self._one_at_a_time:
            seq = next(self._seq)
            fut: asyncio.Future[list[nl.Message]] = self._loop.create_future()
            self._pending[seq] = (nl.Reply(seq), fut)
            try:
                self._sock.send(build(seq))
                return await fut
            finally:
                self._pending.pop(seq, None)

    def close(self) -> None:
        if self.closed:
            return
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._fail_all(OSError(errno.EBADF, "RDMA netlink socket closed"))

    def _readable(self) -> None:
        while True:
            try:
                data = self._sock.recv(_RECV_SIZE)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    if self._on_overrun:
                        self._on_overrun()
                    continue
                self._fail_all(e)
                return
            for msg in nl.split(data):
                self._dispatch(msg)

    def _dispatch(self, msg: nl.Message) -> None:
        entry = self._pending.get(msg.seq) if msg.seq else None
        if entry is None:
            if self._on_notify:
                self._on_notify(msg)
            return
        reply, fut = entry
        try:
            complete = reply.feed(msg)
        except nl.NetlinkError as e:
            self._pending.pop(msg.seq, None)
            if not fut.done():
                fut.set_exception(e)
            return
        if complete:
            self._pending.pop(msg.seq, None)
            if not fut.done():
                fut.set_result(reply.messages)

    def _fail_all(self, exc: OSError) -> None:
        pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
