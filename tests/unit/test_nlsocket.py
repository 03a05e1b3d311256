"""NlChannel against a fake kernel on a socketpair: requests go out one at a time.

The kernel runs one dump per netlink socket and answers a second, concurrent one with EBUSY
(seen in the guest: a claim's char-device lookup racing an inventory refresh).
"""

from __future__ import annotations

import asyncio
import socket
import struct

from rdmad.kernel import rdma_nl as nl
from rdmad.kernel.netlink import NLMSG_DONE
from rdmad.kernel.nlsocket import NlChannel


def done(seq: int) -> bytes:
    return struct.pack("=IHHII", 20, NLMSG_DONE, 2, seq, 0) + struct.pack("=i", 0)


def seq_of(request: bytes) -> int:
    return int(struct.unpack_from("=IHHII", request)[3])


async def test_a_second_request_waits_for_the_first_reply() -> None:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    kernel.setblocking(False)
    rs = NlChannel(ours)
    try:
        first = asyncio.ensure_future(rs.request(nl.get_dev))
        second = asyncio.ensure_future(rs.request(nl.get_dev))
        loop = asyncio.get_running_loop()
        seq1 = seq_of(await loop.sock_recv(kernel, 4096))
        await asyncio.sleep(0)  # give the second request every chance to be sent
        try:
            kernel.recv(4096)
            raise AssertionError("a second request was sent while the first was in progress")
        except BlockingIOError:
            pass
        kernel.send(done(seq1))
        assert await first == []
        seq2 = seq_of(await loop.sock_recv(kernel, 4096))
        assert seq2 != seq1
        kernel.send(done(seq2))
        assert await second == []
    finally:
        rs.close()
        kernel.close()
