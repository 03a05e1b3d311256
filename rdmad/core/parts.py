"""What the core's collaborators share, as machined's `Manager` is shared by its machines.

Core makes one `Parts`: the kernel's ports, the inventory and its tracker, the claim
records, the observers, the limits and the counters. Each collaborator (Take, Release,
GiveBack, GiveBackRetry, Startup) is a `Part` of it, and takes in its constructor only
the other collaborators it calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdmad.core.backend import NetdevBackend, NetnsResolver, RdmaBackend
from rdmad.core.inventory import Inventory
from rdmad.core.limits import Limits
from rdmad.core.observer import CoreObserver
from rdmad.core.opstats import OpStats
from rdmad.core.records import Records
from rdmad.core.tracking import InventoryTracker


@dataclass(frozen=True)
class Parts:
    net: NetdevBackend
    rdma: RdmaBackend
    resolver: NetnsResolver
    inventory: Inventory
    records: Records
    tracker: InventoryTracker
    observers: CoreObserver
    limits: Limits
    stats: OpStats


class Part:
    """A collaborator of Core: the shared parts, under the names its methods use."""

    def __init__(self, parts: Parts) -> None:
        self._net = parts.net
        self._rdma = parts.rdma
        self._resolver = parts.resolver
        self._inv = parts.inventory
        self._records = parts.records
        self._book = parts.records.book
        self._tracker = parts.tracker
        self._observers = parts.observers
        self._limits = parts.limits
        self._stats = parts.stats
