"""A netlink request channel whose socket notes the thread of every send: the event loop's
own, or a worker's."""

from __future__ import annotations

import socket
import threading
from typing import Any

from rdmad.kernel.nlsocket import NlChannel, open_socket


class SendingThreads(socket.socket):
    """A netlink socket that notes which thread sends on it."""

    senders: list[int]

    def send(self, data: Any, *args: Any) -> int:
        self.senders.append(threading.get_ident())
        return super().send(data, *args)

    def sendall(self, data: Any, *args: Any) -> None:
        self.senders.append(threading.get_ident())
        super().sendall(data, *args)


def watched_channel(family: int = socket.NETLINK_ROUTE) -> tuple[NlChannel, SendingThreads]:
    """A channel in the calling thread's netns, as the daemon opens it, and its socket."""
    plain = open_socket(family)
    sock = SendingThreads(fileno=plain.detach())
    sock.senders = []
    return NlChannel(sock), sock
