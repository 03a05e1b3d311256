"""rtnetlink events: link changes in init_net and nsid deletions, as rdmad.events.

An NlSubscription (the event loop reads it) joined to RTNLGRP_LINK and RTNLGRP_NSID. An
overrun (ENOBUFS) means messages were dropped: the source emits Resync("rtnl"), and the
re-read it causes covers whatever was lost. The socket itself keeps working.
"""

from __future__ import annotations

import logging
import socket

from rdmad.backend import EventSink
from rdmad.events import Event, LinkChanged, LinkRemoved, NetnsGone, Resync
from rdmad.kernel.netlink import Message
from rdmad.kernel.nlsocket import NlSubscription, open_socket
from rdmad.kernel.rtnl import netdev_from_link
from rdmad.kernel.rtnl_msgs import (
    RTM_DELLINK,
    RTM_DELNSID,
    RTM_NEWLINK,
    RTNLGRP_LINK,
    RTNLGRP_NSID,
    link_from,
    nsid_from,
)

log = logging.getLogger(__name__)

DEFAULT_RCVBUF = 1 << 20


def event_from_msg(msg: Message) -> Event | None:
    """The rdmad event an rtnetlink message means, or None for anything else."""
    if msg.type == RTM_NEWLINK:
        return LinkChanged(netdev_from_link(link_from(msg)))
    if msg.type == RTM_DELLINK:
        link = link_from(msg)
        return LinkRemoved(ifindex=link.index, name=link.ifname)
    if msg.type == RTM_DELNSID:
        nsid = nsid_from(msg)
        return None if nsid is None else NetnsGone(nsid=nsid)
    return None


class RtnlEventSource:
    """Implements rdmad.backend.EventSource. `rcvbuf` can be made tiny to provoke overruns."""

    def __init__(self, rcvbuf: int = DEFAULT_RCVBUF) -> None:
        self._rcvbuf = rcvbuf
        self._sub: NlSubscription | None = None

    async def start(self, sink: EventSink) -> None:
        if self._sub is not None:
            raise RuntimeError("RtnlEventSource already started")

        def on_message(msg: Message) -> None:
            event = event_from_msg(msg)
            if event is not None:
                sink(event)

        def on_overrun() -> None:
            log.warning("rtnetlink event socket overran; re-reading")
            sink(Resync("rtnl"))

        sock = open_socket(socket.NETLINK_ROUTE, (RTNLGRP_LINK, RTNLGRP_NSID), rcvbuf=self._rcvbuf)
        self._sub = NlSubscription(sock, on_message, on_overrun)

    async def stop(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
