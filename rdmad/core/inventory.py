"""What the kernel has: RDMA devices and init_net netdevs, and how a device looks to callers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from rdmad.model import (
    INIT_NETNS,
    Claim,
    DeviceState,
    DeviceView,
    Netdev,
    NetnsMode,
    RdmaDevice,
)


@dataclass
class Diff:
    added: list[RdmaDevice] = field(default_factory=list)
    removed: list[RdmaDevice] = field(default_factory=list)
    changed: list[RdmaDevice] = field(default_factory=list)


class Inventory:
    def __init__(self) -> None:
        self.devices: dict[str, RdmaDevice] = {}
        self.netdevs: dict[int, Netdev] = {}
        # Which netdevs RDMA devices sit on, so that a link event costs a re-read of the
        # devices on that netdev only, and nothing for any other netdev (a busy host has many).
        self._on_ifindex: dict[int, set[str]] = {}
        self._on_name: dict[str, set[str]] = {}
        self.unbound: set[str] = set()  # devices without a netdev in init_net
        self._by_chardev: dict[str, str] = {}  # "uverbs0" -> its device, for uevents

    def device_of_chardev(self, node: str) -> str:
        """The device whose char device node this is ("uverbs0"), "" if none known."""
        return self._by_chardev.get(node, "")

    def devices_on(self, ifindex: int, name: str) -> set[str]:
        """The devices whose netdev has this ifindex or name."""
        return self._on_ifindex.get(ifindex, set()) | self._on_name.get(name, set())

    def put(self, dev: RdmaDevice) -> None:
        """Update one device (O(1): a link event must not cost O(devices))."""
        old = self.devices.get(dev.name)
        if old is not None:
            self._unindex(old)
        self.devices[dev.name] = dev
        self._add_index(dev)

    def netdev_by_name(self, name: str) -> Netdev | None:
        for nd in self.netdevs.values():
            if nd.name == name:
                return nd
        return None

    def replace_devices(self, seen: list[RdmaDevice], keep: set[str]) -> Diff:
        """Take a fresh RDMA listing. Devices in `keep` stay even if the listing lacks them:
        they sit in a claimant's netns (exclusive mode hides them from init_net) or are
        being moved right now."""
        diff = Diff()
        fresh = {d.name: d for d in seen}
        for name, old in list(self.devices.items()):
            if name in fresh:
                if fresh[name] != old:
                    diff.changed.append(fresh[name])
            elif name not in keep:
                diff.removed.append(old)
                del self.devices[name]
        for name, dev in fresh.items():
            if name not in self.devices:
                diff.added.append(dev)
            self.devices[name] = dev
        self._index()
        return diff

    def _index(self) -> None:
        self._on_ifindex, self._on_name, self.unbound, self._by_chardev = {}, {}, set(), {}
        for dev in self.devices.values():
            self._add_index(dev)

    def _add_index(self, dev: RdmaDevice) -> None:
        for path in dev.chardevs:
            self._by_chardev[path.rsplit("/", 1)[-1]] = dev.name
        if not dev.netdev:
            self.unbound.add(dev.name)
            return
        self._on_ifindex.setdefault(dev.netdev_ifindex, set()).add(dev.name)
        self._on_name.setdefault(dev.netdev, set()).add(dev.name)

    def _unindex(self, dev: RdmaDevice) -> None:
        for path in dev.chardevs:
            node = path.rsplit("/", 1)[-1]
            if self._by_chardev.get(node) == dev.name:
                del self._by_chardev[node]
        self.unbound.discard(dev.name)
        self._on_ifindex.get(dev.netdev_ifindex, set()).discard(dev.name)
        self._on_name.get(dev.netdev, set()).discard(dev.name)

    def view(self, dev: RdmaDevice, mine: Sequence[Claim], mode: NetnsMode) -> DeviceView:
        """`mine`: the device's claims."""
        if not mine:  # most devices, on every ListDevices: keep it short
            usable = mode == NetnsMode.EXCLUSIVE or self.has_netdev(dev)
            state = DeviceState.AVAILABLE if usable else DeviceState.UNAVAILABLE
            return DeviceView(dev, state, INIT_NETNS, (), self.carrier(dev))
        whole = [c for c in mine if not c.shared]
        state = DeviceState.CLAIMED if whole else DeviceState.SHARED
        at = whole[0].attachment if whole else None
        netns = whole[0].netns if at and at.rdma_moved else INIT_NETNS
        shown = dev
        if at and at.host is not None and not dev.netdev:
            # While its netdev is in the netns, callers still know the device by the host name.
            shown = replace(dev, netdev=at.host.name)
        return DeviceView(shown, state, netns, tuple(c.id for c in mine), self.carrier(dev))

    def carrier(self, dev: RdmaDevice) -> bool:
        """Whether the device's netdev is in init_net and has carrier."""
        nd = self.netdevs.get(dev.netdev_ifindex) if dev.netdev else None
        return nd is not None and nd.carrier

    def has_netdev(self, dev: RdmaDevice) -> bool:
        if not dev.netdev:
            return False
        nd = self.netdevs.get(dev.netdev_ifindex)
        return nd is not None or self.netdev_by_name(dev.netdev) is not None
