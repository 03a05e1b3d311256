"""What the kernel adapters tell the core. Each event says what happened, not how it arrived."""

from __future__ import annotations

from dataclasses import dataclass

from rdmad.model import IPAddress, Netdev


@dataclass(frozen=True)
class LinkChanged:
    """A netdev appeared in init_net or changed (RTM_NEWLINK), including one returning
    from a dead netns under its in-netns name or devN."""

    netdev: Netdev


@dataclass(frozen=True)
class LinkRemoved:
    """A netdev left init_net: deleted, or moved into another netns (RTM_DELLINK)."""

    ifindex: int
    name: str


@dataclass(frozen=True)
class NetnsGone:
    """init_net dropped its id for a netns (RTM_DELNSID): that netns is dead."""

    nsid: int


@dataclass(frozen=True)
class AddressChanged:
    """An address came or went on netdev `ifindex` (RTM_NEWADDR/RTM_DELADDR) inside the
    netns init_net knows as `nsid`, or in init_net itself (None): the GIDs of a claim there,
    or of a device moved without that netdev, may follow."""

    nsid: int | None
    ifindex: int
    address: IPAddress | None  # None: the message carried none (never seen)
    removed: bool  # RTM_DELADDR


@dataclass(frozen=True)
class RdmaChanged:
    """Something in the RDMA subsystem changed (udev infiniband/verbs/mad events, RDMA
    netlink monitor): the core re-reads the RDMA inventory."""

    hint: str = ""
    # The one device it concerns, by name (or by one of its char device nodes, "uverbs0"),
    # when the event says so: re-reading that device is enough while rdmad knows it under
    # that name and it is still there, or away in a claimant's netns. Anything else (a new
    # device, one gone for good, a name rdmad does not know) costs a re-read of them all.
    device: str = ""
    chardev: str = ""


@dataclass(frozen=True)
class Resync:
    """An event socket overran (ENOBUFS): events were lost, re-read everything."""

    source: str


Event = LinkChanged | LinkRemoved | NetnsGone | AddressChanged | RdmaChanged | Resync
