"""Address changes in claimants' netns and in init_net, as rdmad.events.AddressChanged.

A claim's GIDs follow its netdev's addresses: in the claim's netns, or in init_net for a
device moved without its netdev. One NETLINK_ROUTE subscription in init_net with
NETLINK_LISTEN_ALL_NSID receives the IPv4/IPv6 address notifications of init_net (no nsid)
and of every netns that init_net has an nsid for (every netns rdmad placed a netdev in),
each tagged with that nsid. It holds no netns: a socket created inside one would keep it
alive. An overrun (ENOBUFS) is reported as Resync("addr").
"""

from __future__ import annotations

import logging
import socket

from rdmad.backend import EventSink
from rdmad.events import AddressChanged, Event, Resync
from rdmad.kernel.netlink import Message, kernel_error
from rdmad.kernel.nlsocket import NlSubscription, open_socket
from rdmad.kernel.rtnl_msgs import RTM_DELADDR, RTM_NEWADDR, addr_index

log = logging.getLogger(__name__)

# include/uapi/linux/rtnetlink.h
RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR = 5, 9
DEFAULT_RCVBUF = 1 << 20


def event_from_msg(msg: Message) -> Event | None:
    """The address change a message means (nsid None: init_net's), or None for anything else."""
    if msg.type not in (RTM_NEWADDR, RTM_DELADDR):
        return None
    return AddressChanged(nsid=msg.nsid, ifindex=addr_index(msg))


class AddrEventSource:
    """Implements rdmad.backend.EventSource."""

    def __init__(self, rcvbuf: int = DEFAULT_RCVBUF) -> None:
        self._rcvbuf = rcvbuf
        self._sub: NlSubscription | None = None

    async def start(self, sink: EventSink) -> None:
        if self._sub is not None:
            raise RuntimeError("AddrEventSource already started")

        def on_message(msg: Message) -> None:
            event = event_from_msg(msg)
            if event is not None:
                sink(event)

        def on_overrun() -> None:
            log.warning("address event socket overran; events were lost")
            sink(Resync("addr"))

        groups = (RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR)
        try:
            sock = open_socket(socket.NETLINK_ROUTE, groups, rcvbuf=self._rcvbuf, all_nsid=True)
        except OSError as e:
            # EPERM without CAP_NET_BROADCAST: claims keep the GIDs read when made.
            what = "listening to address changes in every netns (NETLINK_LISTEN_ALL_NSID)"
            raise kernel_error(e, what) from e
        self._sub = NlSubscription(sock, on_message, on_overrun)

    async def stop(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
