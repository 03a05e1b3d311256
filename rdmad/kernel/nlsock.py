"""An rtnetlink request channel on a plain socket, driven by the asyncio loop.

Why not AsyncIPRoute for requests: the kernel answers an rtnetlink request inside the
send() itself, so the reply is already queued when send() returns, yet pyroute2 spends
0.1-0.3 ms a request on its machinery (a future per request, a reader callback, a marshal
that looks each message up). A claim makes five or six requests while its caller waits;
here each one is a send(), a recv() that does not wait, and a decode.

The API is AsyncIPRoute's `nlm_request`, so rdmad.kernel.rtnl_msgs takes either.
pyroute2 stays for what its high-level API builds (macvlan links, nsid assignment).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any, Protocol

from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, nlmsg, nlmsgerr
from pyroute2.netlink.exceptions import NetlinkError

# include/uapi/linux/netlink.h
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11  # errors carry the kernel's text (NLMSGERR_ATTR_MSG)
NETLINK_GET_STRICT_CHK = 12  # dumps are filtered by the request's fields (ifindex)
NLMSG_ERROR = 2
NLMSG_DONE = 3
_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_I32 = struct.Struct("=i")
# A dump chunk fits in the buffer the reader offers (netlink_dump sizes it so); 64 KiB
# keeps a 1024-netdev dump to a few dozen recv() calls.
RECV_SIZE = 65536


class Requester(Protocol):
    """What rdmad.kernel.rtnl_msgs sends through: NlSocket, or an AsyncIPRoute."""

    async def nlm_request(self, msg: Any, msg_type: int, msg_flags: int) -> AsyncIterator[Any]: ...


async def _each(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


class NlSocket:
    """One NETLINK_ROUTE socket, one request at a time. Replies are decoded with the class
    `decoders` gives for their type (pyroute2's message classes)."""

    def __init__(self, sock: socket.socket, decoders: dict[int, type[Any]]) -> None:
        sock.setblocking(False)
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        self._sock = sock
        self._decoders = decoders
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()  # the kernel runs one dump per socket at a time
        # Set when a request's replies were not all read (its caller was cancelled):
        # they are read and dropped before the next request goes out.
        self._dirty = False

    def close(self) -> None:
        self._sock.close()

    async def nlm_request(self, msg: Any, msg_type: int, msg_flags: int) -> AsyncIterator[Any]:
        return _each(await self.request(msg, msg_type, msg_flags))

    async def request(self, msg: Any, msg_type: int, msg_flags: int) -> list[Any]:
        """The decoded replies to `msg`; NetlinkError if the kernel refused it."""
        seq = next(self._seq)
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = msg_flags
        msg["header"]["sequence_number"] = seq
        msg["header"]["pid"] = 0
        msg.encode()
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._dirty:
                self._drain()
            await loop.sock_sendall(self._sock, msg.data)
            try:
                return await self._read(seq, msg_flags)
            except NetlinkError:
                raise  # the kernel's answer: nothing of this request is left
            except BaseException:
                self._dirty = True
                raise

    def _drain(self) -> None:
        # Each recv() also makes the kernel produce a dump's next part, so this reads an
        # unfinished dump to its end without waiting.
        while True:
            try:
                self._sock.recv(RECV_SIZE)
            except BlockingIOError:
                break
        self._dirty = False

    async def _read(self, seq: int, flags: int) -> list[Any]:
        loop = asyncio.get_running_loop()
        out: list[Any] = []
        while True:
            data = await loop.sock_recv(self._sock, RECV_SIZE)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _flags, got, _pid = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break  # malformed: nothing after it can be framed
                at, offset = offset, offset + ((length + 3) & ~3)
                if got != seq:
                    continue  # left over from a request given up on
                if kind == NLMSG_ERROR:
                    self._raise_if_error(data, at)
                    return out  # the ack
                if kind == NLMSG_DONE:
                    code = _I32.unpack_from(data, at + _HEADER.size)[0]
                    if code < 0:
                        raise NetlinkError(-code)
                    return out
                decoded = self._decoders.get(kind, nlmsg)(data, offset=at)
                decoded.decode()
                out.append(decoded)
                if not flags & (NLM_F_DUMP | NLM_F_ACK):
                    return out  # a get: its one reply

    @staticmethod
    def _raise_if_error(data: bytes, at: int) -> None:
        err = nlmsgerr(data, offset=at)
        err.decode()
        if err["error"]:
            raise NetlinkError(abs(err["error"]), err.get_attr("NLMSGERR_ATTR_MSG"))


def rtnl_socket() -> socket.socket:
    """A NETLINK_ROUTE socket in the calling thread's netns."""
    return socket.socket(
        socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
    )
