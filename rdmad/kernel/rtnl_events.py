"""rtnetlink events: link changes in init_net and nsid deletions, as rdmad.core.events.

A subscription (rdmad.kernel.nl_events) to RTNLGRP_LINK and RTNLGRP_NSID; an overrun is
reported as Resync("rtnl").
"""

from __future__ import annotations

import socket

from rdmad.core.events import Event, LinkChanged, LinkRemoved, NetnsGone
from rdmad.kernel.netlink import Message
from rdmad.kernel.nl_events import NetlinkEvents
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


class RtnlEventSource(NetlinkEvents):
    """Implements rdmad.core.backend.EventSource."""

    def __init__(self) -> None:
        groups = (RTNLGRP_LINK, RTNLGRP_NSID)
        super().__init__("rtnl", socket.NETLINK_ROUTE, groups, event_from_msg)
