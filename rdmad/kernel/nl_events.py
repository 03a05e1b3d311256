"""An event source over one netlink multicast subscription, read by the event loop.

Each message the kernel sends to the joined groups becomes an rdmad event (or nothing)
through the source's `translate`. An overrun (ENOBUFS) means messages were dropped: the
source emits Resync(name), and the re-read it causes covers whatever was lost. The socket
itself keeps working.
"""

from __future__ import annotations

from collections.abc import Callable

from rdmad.core.backend import EventSink
from rdmad.core.events import Event, Resync
from rdmad.kernel.netlink import Message
from rdmad.kernel.nlsocket import NlSubscription, open_socket


class NetlinkEvents:
    """Implements rdmad.core.backend.EventSource; subclasses name the family, groups and
    translation."""

    # Bytes of receive queue, five times the kernel's usual default (net.core.rmem_default):
    # fewer overruns, each of which costs a full re-read.
    RCVBUF = 1 << 20

    def __init__(
        self,
        name: str,
        family: int,
        groups: tuple[int, ...],
        translate: Callable[[Message], Event | None],
        *,
        all_nsid: bool = False,
    ) -> None:
        self._name = name
        self._family = family
        self._groups = groups
        self._translate = translate
        self._all_nsid = all_nsid
        self._sub: NlSubscription | None = None

    async def start(self, sink: EventSink) -> None:
        if self._sub is not None:
            raise RuntimeError(f"{type(self).__name__} already started")

        def on_message(msg: Message) -> None:
            event = self._translate(msg)
            if event is not None:
                sink(event)

        sock = open_socket(self._family, self._groups, rcvbuf=self.RCVBUF, all_nsid=self._all_nsid)
        self._sub = NlSubscription(sock, on_message, lambda: sink(Resync(self._name)))

    async def stop(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
