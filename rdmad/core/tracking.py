"""Keeping the inventory in step with the kernel, and telling observers how devices look.

Imports nothing of rdmad.bus or rdmad.kernel: the kernel reaches it through the protocols in
rdmad.core.backend and the events in rdmad.core.events. The InventoryTracker applies those events to
the Inventory, in order, re-reading the kernel where an event is not enough, keeps the RDMA
netns mode, and announces each device's view when it changes. It reads the claims in the
ClaimBook (rdmad.core.claims) and writes none: what it finds about a claim (the kernel ended it,
its GIDs are stale, a netdev to restore came home) it hands to the core's callbacks, each
run as a job of its own. Its background work (rdmad.core.work) is batched and logged there, and
`quiesce` waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import Any, TypeVar

from rdmad.core.backend import NetdevBackend, RdmaBackend
from rdmad.core.claims import ClaimBook
from rdmad.core.events import (
    AddressChanged,
    Event,
    LinkChanged,
    LinkRemoved,
    NetnsGone,
    RdmaChanged,
    Resync,
)
from rdmad.core.inventory import Inventory
from rdmad.core.logfields import MESSAGE_RESYNC, log_event
from rdmad.core.observer import CoreObserver
from rdmad.core.work import Batch, Job, Work
from rdmad.errors import RdmadError
from rdmad.model import (
    Claim,
    ClaimPhase,
    DeviceView,
    Netdev,
    NetnsMode,
    RdmaDevice,
    ReleaseReason,
    gid_of,
)

log = logging.getLogger("rdmad.core.tracking")

_Key = TypeVar("_Key", int, str)


_Step = Coroutine[Any, Any, None]


def _about(what: str, claim: Claim) -> Job:
    return Job(what, claim.device, claim.netns, claim.id)


class InventoryTracker:
    def __init__(
        self,
        inventory: Inventory,
        net: NetdevBackend,
        rdma: RdmaBackend,
        book: ClaimBook,
        observers: CoreObserver,
        *,
        end_claim: Callable[[Claim, ReleaseReason], _Step],
        reread_gids: Callable[[Claim], _Step],
        retry_restores: Callable[[], _Step],
        netns_alive: Callable[[Claim], Coroutine[Any, Any, bool]],
    ) -> None:
        """The last four are the core's, for what the tracker finds about claims: the
        kernel ended one (netns death, device removal), an address a claim's GIDs follow
        came or went, a netdev still to be restored may be home; and whether a claim's
        netns still lives."""
        self._inv = inventory
        self._net = net
        self._rdma = rdma
        self._book = book
        self._observers = observers
        self._end_claim = end_claim
        self._reread_gids_of = reread_gids
        self._retry_restores = retry_restores
        self._netns_alive = netns_alive
        self.netns_mode = NetnsMode.UNAVAILABLE
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._work = Work(log)
        self._link_waiters: dict[int, asyncio.Future[None]] = {}
        self._device_waiters: dict[str, asyncio.Future[None]] = {}
        self._refresh_lock = asyncio.Lock()
        self._touched_links: set[int] | None = None  # set while a netdev dump runs
        self._reload_lock = asyncio.Lock()
        self._announced: dict[str, DeviceView] = {}  # what observers were last told
        # Each burst of events costs one pass of each: over the devices whose view may
        # differ from the announced one, the devices to re-read, the claims whose GIDs to
        # re-read. Naming them keeps a burst's cost to what it touched, not to every device.
        self._view_sync = Batch[str](
            self._work, Job("announcing the device views that changed"), self._sync_views
        )
        self._rdma_reread = Batch[str](
            self._work, Job("re-reading the RDMA inventory"), self._reread_rdma
        )
        self._gids_reread = Batch[str](
            self._work, Job("asking for the GIDs of claims to be read again"), self._reread_gids
        )

    def start(self) -> None:
        """Take the current views as announced, then start applying the queued events."""
        self._announced = {view.device.name: view for view in self.views()}
        self._work.spawn(self._consume_events(), Job("applying kernel events"))

    async def quiesce(self) -> None:
        """Wait until every event queued so far is applied and all it set going is done, but
        for what waits for the kernel to report something more (a netdev coming home)."""
        await self._work.quiesce()

    async def close(self) -> None:
        """Stop: what is still under way is cancelled (crash-safe: the next start finishes it)."""
        await self._work.close()

    # ------------------------------------------------------------------ views
    def views(self, names: Collection[str] | None = None) -> list[DeviceView]:
        """The views of every device, or of those in `names` still known, by index."""
        devices = self._inv.devices
        chosen = devices.values() if names is None else [devices[n] for n in names if n in devices]
        # Each device's own claims: the view sync after a claim looks at its device's, not
        # at every claim on the node.
        return [self.view(d) for d in sorted(chosen, key=lambda d: d.index)]

    def announced_views(self) -> list[DeviceView]:
        """Every device as observers were last told, by index: a listing that agrees with
        the devices' bus properties, and builds no view per call (ListDevices at 1024
        devices spent half its time building them)."""
        return sorted(self._announced.values(), key=lambda v: v.device.index)

    def view(self, dev: RdmaDevice) -> DeviceView:
        return self._inv.view(dev, self._book.of(dev.name), self.netns_mode)

    def adopt_mode(self, mode: NetnsMode) -> None:
        """The RDMA subsystem turned up, or its mode changed: every device may look different."""
        if mode != self.netns_mode:
            self.netns_mode = mode
            self._observers.mode_changed(mode)
            for view in self.views():
                self.announce(view)

    def announce(self, view: DeviceView) -> None:
        self._announced[view.device.name] = view
        self._observers.device_changed(view)

    def _announce_unless_busy(self, dev: RdmaDevice) -> None:
        # A claim or release in flight announces the device when it is done.
        if not self._book.busy(dev.name):
            self.announce(self.view(dev))

    def schedule_view_sync(self, devices: Iterable[str] | None = None) -> None:
        """A device's state follows from its record, its netdev's presence and the claims,
        which change through different paths: after each burst, announce each view that may
        have changed (those of `devices`; every one when None) and differs from what was last
        announced, so observers never keep a stale state."""
        self._view_sync.add(devices)

    async def _sync_views(self, stale: set[str] | None) -> None:
        for view in self.views(stale):
            # A device mid-claim or mid-release would show its own netdev's trip between
            # netns as a passing state ("unavailable"): its operation announces the outcome,
            # and Records.operating_on names it again when it ends.
            if self._book.busy(view.device.name):
                continue
            if self._announced.get(view.device.name) != view:
                self.announce(view)

    # ------------------------------------------------------------------ waiting
    async def wait_for_link(self, ifindex: int, timeout: float) -> bool:
        """Wait for a netdev to appear in init_net (by event); False if it did not in time."""
        return await self._wait(self._link_waiters, ifindex, timeout)

    async def wait_for_device(self, name: str, timeout: float) -> bool:
        """Wait for a re-read to list an RDMA device in init_net; False if none did in time."""
        return await self._wait(self._device_waiters, name, timeout)

    async def _wait(
        self, waiters: dict[_Key, asyncio.Future[None]], key: _Key, timeout: float
    ) -> bool:
        waiter = waiters.setdefault(key, asyncio.get_running_loop().create_future())
        try:
            with self._work.parked(waiter.done):
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            return False
        finally:
            waiters.pop(key, None)
        return True

    @staticmethod
    def _wake(waiters: dict[_Key, asyncio.Future[None]], key: _Key) -> None:
        waiter = waiters.get(key)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ events
    def handle(self, event: Event) -> None:
        """Queue a kernel event; the pump applies them in order."""
        self._events.put_nowait(event)

    async def _consume_events(self) -> None:
        def queued() -> bool:
            return not self._events.empty()

        while True:
            with self._work.parked(queued):
                event = await self._events.get()
            touched: set[str] | None = None
            try:
                touched = await self._apply(event)
            except Exception:
                log.exception("handling %r failed", event)
            self.schedule_view_sync(touched)

    async def _apply(self, event: Event) -> set[str] | None:
        """Apply one event; return the devices whose view it may have changed (None: any).
        What it leaves to a re-read or a claim's end is named again by those."""
        if isinstance(event, LinkChanged | LinkRemoved):
            return await self._apply_link(event)
        if isinstance(event, NetnsGone):
            for claim in self._book.in_nsid(event.nsid):
                self._end(claim, ReleaseReason.NETNS_GONE)
        elif isinstance(event, AddressChanged):
            for claim in self._gids_concerned(event):
                if (
                    claim.phase == ClaimPhase.ACTIVE
                    and self._gids_follow(claim, event)
                    and not (_gids_show(claim, event) and _netdev_shows(claim, event))
                ):
                    self._gids_reread.add({claim.id})
        elif isinstance(event, RdmaChanged):
            name = event.device or self._inv.device_of_chardev(event.chardev)
            self.schedule_refresh({name} if name in self._inv.devices else None)
        elif isinstance(event, Resync):
            log_event(
                log,
                MESSAGE_RESYNC,
                f"{event.source} events were lost (socket overrun): resynchronising",
                level=logging.WARNING,
            )
            self._work.spawn(
                self._resync(), Job(f"resynchronising after {event.source} events were lost")
            )
        return set()

    def _gids_concerned(self, event: AddressChanged) -> list[Claim]:
        """The claims whose GIDs an address change may touch, found by index (a node's
        other claims cost nothing): at home, those of the devices on that netdev; in a
        netns, the claim whose interface it is on, if any (its device's GID table holds it,
        no other's: without this, each address event of a pod's rail re-read every
        whole-device rail's table), else every claim there, as an interface of no claim may
        be an upper device of a whole-device claim's."""
        if event.nsid is None:  # an address event names no netdev: by ifindex alone
            devices = self._inv.devices_on(event.ifindex, "")
            return [c for device in devices for c in self._book.of(device)]
        in_netns = self._book.in_nsid(event.nsid)
        owner = [c for c in in_netns if c.attachment and c.attachment.ns_ifindex == event.ifindex]
        return owner or in_netns

    def _gids_follow(self, claim: Claim, event: AddressChanged) -> bool:
        """Whether an address change may touch a claim's GIDs: one on a netdev in the
        claim's netns (a shared claim's child only), or, for a device moved without its
        netdev, one on that netdev in init_net. `claim`: an active one."""
        at = claim.attached
        if event.nsid is None:
            dev = self._inv.devices.get(claim.device)
            home = at.rdma_moved and not at.netdev_moved
            return home and dev is not None and dev.netdev_ifindex == event.ifindex
        return at.nsid == event.nsid and (not claim.shared or at.ns_ifindex == event.ifindex)

    async def _reread_gids(self, claim_ids: set[str] | None) -> None:
        """A burst of address events costs one re-read per claim; an event from now on asks
        for one more."""
        assert claim_ids is not None  # asked for by claim, never for all
        for claim_id in claim_ids:
            claim = self._book.claims.get(claim_id)
            if claim is not None:
                job = _about(f"re-reading the GIDs of claim {claim.id}", claim)
                self._work.spawn(self._reread_gids_of(claim), job)

    def _end(self, claim: Claim, reason: ReleaseReason) -> None:
        job = _about(f"ending claim {claim.id} ({reason.value})", claim)
        self._work.spawn(self._end_claim(claim, reason), job)

    async def _resync(self) -> None:
        await self.reload_netdevs()
        live = await self._net.live_nsids()
        for claim in list(self._book.claims.values()):
            if claim.phase != ClaimPhase.ACTIVE:
                continue
            # A live nsid may have been given to a newer netns since: the netns decides.
            nsid = claim.attached.nsid
            if (nsid >= 0 and nsid not in live) or not await self._netns_alive(claim):
                self._end(claim, ReleaseReason.NETNS_GONE)
        await self._retry_restores()
        await self.refresh()

    # ------------------------------------------------------------------ netdevs
    async def _apply_link(self, event: LinkChanged | LinkRemoved) -> set[str] | None:
        if isinstance(event, LinkChanged):
            ifindex, name = event.netdev.ifindex, event.netdev.name
        else:
            ifindex, name = event.ifindex, event.name
        if self._touched_links is not None:
            self._touched_links.add(ifindex)
        concerned = self._devices_on(ifindex, name)
        before = self._inv.netdevs.get(ifindex)
        if concerned is not None and before is not None and before.name != name:
            # renamed: a device may know its netdev by the old name only
            also = self._devices_on(ifindex, before.name)
            concerned = None if also is None else concerned | also
        if isinstance(event, LinkChanged):
            nd = event.netdev
            self._inv.netdevs[nd.ifindex] = nd
            self._wake(self._link_waiters, nd.ifindex)
            if self._book.restore_waits_for(nd.ifindex):
                job = Job(f"restoring the host settings of {nd.name} (ifindex {nd.ifindex})")
                self._work.spawn(self._retry_restores(), job)
            self.schedule_refresh(concerned)
        else:
            # The event can be older than what we know: a claim re-read the kernel since, or
            # a release brought the netdev home before this RTM_DELLINK was read. Forgetting
            # an RDMA device's netdev on a stale event would leave it "unavailable" until its
            # next event, so ask the kernel first.
            if concerned == set() or not await self._netdev_home(ifindex):
                self._inv.netdevs.pop(ifindex, None)
            self.schedule_refresh(concerned)
        return concerned

    async def _netdev_home(self, ifindex: int) -> bool:
        try:
            return await self._net.has_netdev(ifindex)
        except RdmadError:
            return False

    def _devices_on(self, ifindex: int, name: str) -> set[str] | None:
        """The RDMA devices a change to this netdev can concern; None if it could be any
        (a device without a netdev may be about to get this one)."""
        hit = self._inv.devices_on(ifindex, name)
        hit.update(c.device for c in self._book.on_host_netdev(ifindex, name))
        # A device whose claim took its netdev is without one on purpose.
        if not hit and any(not self._book.took_netdev(d) for d in self._inv.unbound):
            return None
        return hit

    def netdev_is(self, nd: Netdev) -> None:
        """Record what our own kernel step just did, ahead of its queued events: the release
        announces the device's view right away, and must not announce it without a netdev."""
        self._inv.netdevs[nd.ifindex] = nd
        if self._touched_links is not None:  # a dump in flight asks for it again
            self._touched_links.add(nd.ifindex)

    async def reread_netdev(self, ifindex: int) -> None:
        nd = await self._net.get_netdev(ifindex)
        if nd is not None:
            self.netdev_is(nd)

    async def reload_netdevs(self) -> None:
        """Replace the netdev table with a dump. Events applied while it runs may be newer or
        older than the dump, so every netdev they touch is asked for once more, until no
        event came in meanwhile; only then is the table swapped (no await in between)."""
        async with self._reload_lock:  # one at a time: each tracks the events it overlaps
            touched: set[int] = set()
            self._touched_links = touched
            try:
                table = {nd.ifindex: nd for nd in await self._net.list_netdevs()}
                while touched:
                    ifindex = touched.pop()
                    nd = await self._net.get_netdev(ifindex)  # an event meanwhile re-adds it
                    if nd is None:
                        table.pop(ifindex, None)
                    else:
                        table[ifindex] = nd
                self._inv.netdevs = table
            finally:
                self._touched_links = None
        self.schedule_view_sync()  # any device's netdev may have come or gone

    # ------------------------------------------------------------------ RDMA devices
    async def reread_device(self, name: str) -> None:
        """Re-read a device our own step changed, before announcing it (its events lag)."""
        try:
            if await self._refresh_devices({name}):
                return
        except Exception as exc:  # the claim or release itself is done: never fail it here
            log.warning("re-reading %s failed (%s): re-reading everything", name, exc)
        self.schedule_refresh()

    def schedule_refresh(self, devices: set[str] | None = None) -> None:
        """Coalesce bursts of events into one re-read: of the named devices, or of the whole
        RDMA inventory when `devices` is None."""
        self._rdma_reread.add(devices)

    async def _reread_rdma(self, names: set[str] | None) -> None:
        try:
            if names is None or not await self._refresh_devices(names):
                names = None
                await self.refresh()
        except Exception:
            self.schedule_view_sync()  # whatever it got to may have changed any device
            raise
        self.schedule_view_sync(names)

    async def _refresh_devices(self, names: set[str]) -> bool:
        """Re-read a few devices. False when that is not enough (one left init_net, or the
        subsystem is not there): the caller re-reads everything."""
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            return False
        async with self._refresh_lock:
            for name in names:
                old = self._inv.devices.get(name)
                if old is None:
                    return False
                fresh = await self._rdma.get_device(old.index)
                if fresh is None or fresh.name != name:
                    if name in self._book.moved_devices() or self._book.busy(name):
                        continue  # in a claimant's netns, or moving right now
                    return False
                self._wake(self._device_waiters, name)  # e.g. home from a dead netns
                if fresh != old:
                    self._inv.put(fresh)
                    self._announce_unless_busy(fresh)
        return True

    async def refresh(self) -> None:
        """Re-read the whole RDMA inventory (and the mode, while there is no subsystem)."""
        # One at a time: two overlapping re-reads could apply the older listing last.
        async with self._refresh_lock:
            await self._refresh_locked()

    async def _refresh_locked(self) -> None:
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            mode = await self._rdma.netns_mode()
            if mode == NetnsMode.UNAVAILABLE:
                return
            self.adopt_mode(mode)
        busy = {name for name in self._inv.devices if self._book.busy(name)}
        listed = await self._rdma.list_devices()
        for dev in listed:
            self._wake(self._device_waiters, dev.name)
        diff = self._inv.replace_devices(listed, keep=self._book.moved_devices() | busy)
        for dev in diff.removed:
            self._announced.pop(dev.name, None)
            self._observers.device_removed(self.view(dev))
            for claim in [c for c in self._book.claims.values() if c.device == dev.name]:
                self._end(claim, ReleaseReason.DEVICE_REMOVED)
        for dev in diff.added:
            view = self.view(dev)
            self._announced[dev.name] = view
            self._observers.device_added(view)
        for dev in diff.changed:
            self._announce_unless_busy(dev)


def _gids_show(claim: Claim, event: AddressChanged) -> bool:
    """Whether a claim's GIDs already show an address change: its own addresses' events
    arrive after the claim read their entries, and reading again would find the same."""
    if event.address is None:
        return False
    return (gid_of(event.address) in {g.gid for g in claim.gids}) != event.removed


def _netdev_shows(claim: Claim, event: AddressChanged) -> bool:
    """Whether the addresses read of a claim's netdev already show an address change: one
    on another netdev, or a link-local IPv6 one (never listed), counts as shown."""
    at = claim.attached
    if event.address is None or (event.nsid, event.ifindex) != (at.nsid, at.ns_ifindex):
        return True
    if event.address.version == 6 and event.address.is_link_local:
        return True
    listed = {cidr.split("/")[0] for cidr in at.ns_addresses}
    return (str(event.address) in listed) != event.removed
