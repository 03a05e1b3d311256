"""Address changes in claimants' netns and in init_net, as rdmad.core.events.AddressChanged.

A claim's GIDs follow its netdev's addresses: in the claim's netns, or in init_net for a
device moved without its netdev. One NETLINK_ROUTE subscription (rdmad.kernel.nl_events)
in init_net with NETLINK_LISTEN_ALL_NSID receives the IPv4/IPv6 address notifications of
init_net (no nsid) and of every netns that init_net has an nsid for (every netns rdmad
placed a netdev in), each tagged with that nsid. It holds no netns: a socket created inside
one would keep it alive. An overrun is reported as Resync("addr").
"""

from __future__ import annotations

import socket

from rdmad.core.backend import EventSink
from rdmad.core.events import AddressChanged, Event
from rdmad.kernel.netlink import Message, kernel_error
from rdmad.kernel.nl_events import NetlinkEvents
from rdmad.kernel.rtnl_msgs import RTM_DELADDR, RTM_NEWADDR, addr_local

# include/uapi/linux/rtnetlink.h
RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR = 5, 9


def event_from_msg(msg: Message) -> Event | None:
    """The address change a message means (nsid None: init_net's), or None for anything else."""
    if msg.type not in (RTM_NEWADDR, RTM_DELADDR):
        return None
    index, address = addr_local(msg)
    return AddressChanged(msg.nsid, index, address, removed=msg.type == RTM_DELADDR)


class AddrEventSource(NetlinkEvents):
    """Implements rdmad.core.backend.EventSource."""

    def __init__(self) -> None:
        groups = (RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR)
        super().__init__("addr", socket.NETLINK_ROUTE, groups, event_from_msg, all_nsid=True)

    async def start(self, sink: EventSink) -> None:
        try:
            await super().start(sink)
        except OSError as e:
            # EPERM without CAP_NET_BROADCAST: claims keep the GIDs read when made.
            what = "listening to address changes in every netns (NETLINK_LISTEN_ALL_NSID)"
            raise kernel_error(e, what) from e
