"""Netlink sockets for every family rdmad speaks: requests on the event loop, requests from a
worker thread, and multicast subscriptions. Replies are checked by rdmad.kernel.netlink.Reply.

A netlink socket keeps the netns it was created in, and the kernel looks devices up in the
*socket's* netns; it takes the *sending thread's* netns as the source of a netns move. So a
socket for another netns is created by a worker thread inside it (rdmad.kernel.netns), and
a request that must also be *sent* from there goes through `transact` on that thread.

Why requests are not read by a reader callback: the kernel answers a request inside the
send() itself, so the reply is already queued when send() returns. Each request here is a
send(), a recv() that does not wait, and a decode, with no future or loop round trip between.

That send() also waits for whatever the kernel's handler waits for: for most rtnetlink
requests the RTNL lock, which a netns move or a netdev's deletion holds for tens of ms while
it waits for RCU. While one of those is in flight from rdmad (`rtnl_busy`), it and every
request made meanwhile are sent from a worker thread, so that the event loop keeps serving;
otherwise requests are sent inline, with no thread hop: a macvlan's creation, say, is short,
and sending it off the loop too gained nothing measurable. The figures are in
docs/performance.md only, where each is dated by its run: here they would go stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import socket
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from rdmad.kernel.netlink import Build, Message, Reply, split

log = logging.getLogger(__name__)

# include/uapi/linux/netlink.h
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NETLINK_LISTEN_ALL_NSID = 8  # also hear the netns init_net has an nsid for, tagged with it
NETLINK_CAP_ACK = 10  # errors echo only the request's header
NETLINK_EXT_ACK = 11  # errors carry the kernel's text (NLMSGERR_ATTR_MSG)
NETLINK_GET_STRICT_CHK = 12  # rtnetlink dumps are filtered by the request's fields (ifindex)
# A dump part is at most 32 KiB (netlink_recvmsg caps max_recvmsg_len there); a 64 KiB read
# takes a whole one, and keeps a 1024-netdev dump to a few dozen recv() calls.
RECV_SIZE = 65536
_NSID = struct.Struct("=i")

# Senders of requests made while a slow one holds the RTNL lock (see the module doc).
_senders = ThreadPoolExecutor(4, thread_name_prefix="rdmad-nl")
_slow_in_flight = 0  # changed and read on the event loop thread only


@contextlib.contextmanager
def rtnl_busy() -> Iterator[None]:
    """Around a request that holds the RTNL lock long (a netns move, a netdev's deletion):
    it and the requests made meanwhile are sent off the event loop."""
    global _slow_in_flight
    _slow_in_flight += 1
    try:
        yield
    finally:
        _slow_in_flight -= 1


def open_socket(
    family: int,
    groups: tuple[int, ...] = (),
    *,
    blocking: bool = False,
    rcvbuf: int | None = None,
    all_nsid: bool = False,
) -> socket.socket:
    """A netlink socket of `family` (NETLINK_ROUTE, NETLINK_RDMA) in the calling thread's
    netns, joined to the multicast `groups` (group numbers, not masks); with `all_nsid`,
    their messages from every netns with an nsid too (Message.nsid says which).

    Raises OSError(EPROTONOSUPPORT) for a family the kernel lacks (no ib_core: no RDMA).
    """
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, family)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, 0))
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        for group in groups:
            sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        if all_nsid:
            sock.setsockopt(SOL_NETLINK, NETLINK_LISTEN_ALL_NSID, 1)
        sock.setblocking(blocking)
    except BaseException:
        sock.close()
        raise
    return sock


def _feed(reply: Reply, data: bytes) -> bool:
    """Feed `reply` the messages of one datagram that answer it (others are left over from a
    request given up on); True once it is complete. NetlinkError if the kernel refused."""
    return any(msg.seq == reply.seq and reply.feed(msg) for msg in split(data))


def transact(sock: socket.socket, build: Build, seq: int = 1) -> list[Message]:
    """Send one request on a blocking socket, from the calling (worker) thread, and return
    its data messages. NetlinkError if the kernel refused it."""
    sock.sendall(build(seq))
    reply = Reply(seq)
    while not _feed(reply, sock.recv(RECV_SIZE)):
        pass
    return reply.messages


class NlChannel:
    """Requests on one non-blocking netlink socket, served by the event loop, one at a time:
    the kernel runs one dump per socket and answers a second with EBUSY while the first is in
    progress (netlink_dump_start), so concurrent callers queue on a lock."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._seq = itertools.count(1)
        self._one_at_a_time = asyncio.Lock()
        # Set when a request's replies were not all read (its caller was cancelled):
        # they are read and dropped before the next request goes out.
        self._dirty = False

    @classmethod
    def open(cls, family: int) -> NlChannel:
        """A channel in the calling thread's netns (the daemon's: init_net)."""
        return cls(open_socket(family))

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    def close(self) -> None:
        self._sock.close()

    async def request(self, build: Build) -> list[Message]:
        """Send a request and return its data messages; NetlinkError if the kernel refused."""
        loop = asyncio.get_running_loop()
        async with self._one_at_a_time:
            if self._dirty:
                self._drain()
            reply = Reply(next(self._seq))
            if _slow_in_flight:
                await loop.run_in_executor(_senders, self._sock.sendall, build(reply.seq))
            else:
                await loop.sock_sendall(self._sock, build(reply.seq))
            try:
                while not _feed(reply, await loop.sock_recv(self._sock, RECV_SIZE)):
                    pass
            except BaseException:
                # The kernel's refusal ends its answer; anything else may leave parts unread.
                self._dirty = not reply.done
                raise
            return reply.messages

    def _drain(self) -> None:
        # Each recv() also makes the kernel produce a dump's next part, so this reads an
        # unfinished dump to its end without waiting.
        while True:
            try:
                self._sock.recv(RECV_SIZE)
            except BlockingIOError:
                break
        self._dirty = False


class NlSubscription:
    """A netlink socket joined to multicast groups, read by the event loop (loop.add_reader):
    each message goes to `on_message`, a receive-queue overrun (ENOBUFS: messages were
    dropped) to `on_overrun`. The socket keeps working after an overrun."""

    def __init__(
        self,
        sock: socket.socket,
        on_message: Callable[[Message], None],
        on_overrun: Callable[[], None],
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._on_message = on_message
        self._on_overrun = on_overrun
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    def _readable(self) -> None:
        while True:
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(
                    RECV_SIZE, socket.CMSG_SPACE(_NSID.size)
                )
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    log.error("netlink subscription: recv failed: %s", e)
                    return
                self._on_overrun()
                continue
            for msg in split(data, _nsid_of(ancillary)):
                try:
                    self._on_message(msg)
                except Exception:  # a faulty handler must not stop the stream
                    log.exception("netlink subscription: handling %r failed", msg)


def _nsid_of(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The nsid a NETLINK_LISTEN_ALL_NSID socket tags a datagram from another netns with."""
    for level, kind, data in ancillary:
        if level == SOL_NETLINK and kind == NETLINK_LISTEN_ALL_NSID and len(data) >= _NSID.size:
            return int(_NSID.unpack_from(data)[0])
    return None
