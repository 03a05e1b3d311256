"""The state machine: claims, holds and their Attach, release, the RDMA netns mode.

Imports nothing of rdmad.bus or rdmad.kernel, nor dbus_fast or pyudev: it drives the
protocols in rdmad.core.backend (rdmad.kernel implements them over netlink and udev), and
hands its named collaborators the rest: Startup (rdmad.core.startup) enumerates and
reconciles, Take (rdmad.core.take) runs a claim's kernel steps and their undo, Release
(rdmad.core.release) ends claims and tells of it, GiveBackRetry (rdmad.core.retry) retries
the claims not returned, GiveBack (rdmad.core.giveback) gives back what a claim took, an
InventoryTracker (rdmad.core.tracking) applies the events in rdmad.core.events, and Records
(rdmad.core.records) keeps the claims on record and on disk. Observers
(rdmad.core.observer) are told what changed.

Crash safety: a claim is written as PENDING before the kernel is touched and as RELEASING
before it is given back, so a daemon killed at any step finds out at start what to undo or
finish; an ended claim stays on file as ENDED until its observers are told (its Released),
so that a kill in between leaves the next start to tell them.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from dataclasses import replace

from rdmad.core.admission import check_claim, free_hold_ifname
from rdmad.core.backend import (
    CgroupBackend,
    NetdevBackend,
    NetnsResolver,
    NetnsTarget,
    RdmaBackend,
)
from rdmad.core.claims import ClaimBook
from rdmad.core.events import Event
from rdmad.core.giveback import GiveBack, netns_alive, read_counters
from rdmad.core.inventory import Inventory
from rdmad.core.limits import Limits
from rdmad.core.logfields import MESSAGE_CLAIM_FAILED, log_event
from rdmad.core.observer import CoreObserver, Observers
from rdmad.core.opstats import OpStats
from rdmad.core.parts import Parts
from rdmad.core.records import Records
from rdmad.core.release import Release
from rdmad.core.retry import GiveBackRetry
from rdmad.core.startup import Startup
from rdmad.core.store import Store
from rdmad.core.take import Take
from rdmad.core.tracking import InventoryTracker
from rdmad.errors import (
    DeviceBusy,
    InvalidArgs,
    NoSuchClaim,
    NoSuchDevice,
    NotSupported,
    RdmadError,
    Unavailable,
)
from rdmad.model import (
    Claim,
    ClaimOptions,
    ClaimPhase,
    Counters,
    CounterScope,
    DeviceView,
    HoldSpec,
    Netdev,
    NetnsMode,
    RdmaDevice,
    RdmaUsage,
    ReleaseReason,
    netns_label,
)
from rdmad.options import check_device_name

log = logging.getLogger("rdmad.core.core")

DEFAULT_SHARED_IFNAME = "net1"
DEFAULT_ROUTE_TABLES = range(1000, 2000)  # rdmad.daemon.config's route_tables


class Core:
    def __init__(
        self,
        net: NetdevBackend,
        rdma: RdmaBackend,
        resolver: NetnsResolver,
        store: Store,
        *,
        cgroups: CgroupBackend,
        shared_limit: int = 16,
        route_tables: range = DEFAULT_ROUTE_TABLES,
    ) -> None:
        self._net = net
        self._rdma = rdma
        self._resolver = resolver
        self._shared_limit = shared_limit
        self._inv = inv = Inventory()
        self._book = book = ClaimBook()
        self._observers = observers = Observers()
        self.stats = OpStats()
        self._tracker = tracker = InventoryTracker(
            inv,
            net,
            rdma,
            book,
            observers,
            end_claim=self.end_claim,
            reread_gids=self.reread_gids,
            retry_restores=self.retry_restores,
            netns_alive=functools.partial(netns_alive, resolver),
        )
        self._records = records = Records(book, store, tracker)
        self.limits = limits = Limits(cgroups)
        parts = Parts(net, rdma, resolver, inv, records, tracker, observers, limits, self.stats)
        self._giveback = giveback = GiveBack(parts)
        self._release = release = Release(parts, giveback)
        self._retry = retry = GiveBackRetry(parts, giveback, release)
        self._take = Take(parts, giveback, release, route_tables)
        self._startup = Startup(parts, giveback, release, retry)

    # ------------------------------------------------------------------ mode, observers
    @property
    def netns_mode(self) -> NetnsMode:
        return self._tracker.netns_mode

    @netns_mode.setter
    def netns_mode(self, mode: NetnsMode) -> None:
        self._tracker.netns_mode = mode

    @property
    def shared_limit(self) -> int:
        """Shared claims a device may have (Manager.SharedLimit: rdmad-dra offers as many)."""
        return self._shared_limit

    @property
    def startup_notes(self) -> list[str]:
        """What start found that the operator should know (systemd's status line)."""
        return self._startup.notes

    def add_observer(self, observer: CoreObserver) -> None:
        self._observers.add(observer)

    def announce_startup(self) -> None:
        """Once every observer is attached and the bus name taken: tell them of the claims
        ended since start, and of every later one as it ends."""
        self._release.announce_startup()

    # ------------------------------------------------------------------ queries
    def devices(self) -> list[DeviceView]:
        return self._tracker.announced_views()

    def device(self, name: str) -> DeviceView:
        return self._tracker.view(self._rdma_device(name))

    def _need_rdma(self) -> None:
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")

    def _rdma_device(self, name: str) -> RdmaDevice:
        dev = self._inv.devices.get(check_device_name(name))
        if dev is None:
            raise NoSuchDevice(f"no RDMA device {name!r}")
        return dev

    def claims(self) -> list[Claim]:
        return sorted(self._book.claims.values(), key=lambda c: c.created_at_us)

    def pod_of(self, claim: Claim) -> list[Claim]:
        """The live claims of `claim`'s netns (its pod), it included while live: what every
        CDI spec of the pod describes (rdmad.daemon.cdi)."""
        return self._records.pod_of(claim)

    def get_claim(self, claim_id: str) -> Claim:
        claim = self._book.claims.get(claim_id)
        if claim is None:
            raise NoSuchClaim(f"no claim {claim_id!r}")
        return claim

    def _netdev_of(self, dev: RdmaDevice) -> Netdev:
        nd = self._inv.netdevs.get(dev.netdev_ifindex) or self._inv.netdev_by_name(dev.netdev)
        if nd is None:
            raise NotSupported(f"{dev.name} has no netdev in init_net")
        return nd

    def _check(self, dev: RdmaDevice, inode: int, options: ClaimOptions) -> None:
        has_netdev = self._inv.has_netdev(dev)
        mode, limit = self.netns_mode, self._shared_limit
        check_claim(self._book, dev, has_netdev, mode, limit, inode, options)

    # ------------------------------------------------------------------ counters
    async def device_counters(self, name: str) -> Counters:
        """Every port's counters of a device, read from the kernel now: device-wide."""
        dev = self.device(name).device
        whole = next((c for c in self._book.of(dev.name) if not c.shared), None)
        return await read_counters(self._rdma, self._resolver, dev, whole, CounterScope.DEVICE)

    async def claim_counters(self, claim_id: str) -> Counters:
        """A whole-device claim's counters are its own; a shared claim sees its device's."""
        claim = self.get_claim(claim_id)
        dev = self.device(claim.device).device
        holder, scope = (None, CounterScope.DEVICE) if claim.shared else (claim, CounterScope.CLAIM)
        return await read_counters(self._rdma, self._resolver, dev, holder, scope)

    def rdma_usage(self, claim_id: str) -> RdmaUsage | None:
        """The claim's device in its cgroup (rdma.current, rdma.max); None without one."""
        return self.limits.usage(self.get_claim(claim_id))

    # ------------------------------------------------------------------ start, stop
    async def start(self) -> None:
        """Enumerate, load the state files, reconcile (Startup), then start consuming
        events. The caller starts the event sources first: events queue up meanwhile."""
        await self._startup.start()
        self._tracker.start()

    async def quiesce(self) -> None:
        """Wait until the kernel events queued so far are applied and all they set going is
        done, but for what waits for the kernel to report more (a netdev not home yet): at
        shutdown, so that a claim being ended is not cut off half-way."""
        await self._tracker.quiesce()
        while self._retry.busy:  # a retry's own kernel steps may set the tracker going again
            await self._retry.quiesce()
            await self._tracker.quiesce()

    async def close(self) -> None:
        await self._retry.close()
        await self._tracker.close()

    # ------------------------------------------------------------------ claim
    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim:
        """Claim `device` for `target`; `target` is closed before this returns."""
        started = time.monotonic()
        try:
            claim = await self._claim(device, target, options)
        except RdmadError as e:
            self.stats.failed("claim", e.dbus_name)
            netns = netns_label(target.inode)
            log_event(
                log,
                MESSAGE_CLAIM_FAILED,
                f"claim of {device} into {netns} failed: {e}",
                device=device,
                netns=netns,
                error=e.dbus_name,
                level=logging.WARNING,
            )
            raise
        self.stats.claimed(time.monotonic() - started)
        return claim

    async def _claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim:
        try:
            self._need_rdma()
            self._rdma_device(device)
            async with self._records.operating_on(device):
                # Looked up again: it may have been unplugged while this claim waited.
                return await self._claim_locked(self._rdma_device(device), target, options)
        finally:
            target.close()

    async def _claim_locked(
        self, dev: RdmaDevice, target: NetnsTarget, opts: ClaimOptions
    ) -> Claim:
        dev = await self._fresh(dev)
        self._check(dev, target.inode, opts)
        cgroup = self.limits.check(opts)
        claim_id = secrets.token_hex(8)
        # Read before the first await: events applied meanwhile must not change the parent.
        parent = self._netdev_of(dev).ifindex if opts.shared else 0
        moving = self._netdev_of(dev) if not opts.shared and opts.netdev else None
        at = await self._take.where(moving, target)
        default_ifname = DEFAULT_SHARED_IFNAME if opts.shared else (at.host.name if at.host else "")
        claim = Claim(
            id=claim_id,
            device=dev.name,
            attachment=at,
            ifname=opts.ifname or default_ifname,
            shared=opts.shared,
            owner=opts.owner,
            claimant=opts.claimant,
            created_at_us=time.time_ns() // 1000,
            cdi_device=f"rdmad.io/rdma={claim_id}",
            phase=ClaimPhase.PENDING,
            cdi_name=opts.cdi_name,
            pod_cdi_name=opts.pod_cdi_name,
            cgroup=cgroup,
            limit=opts.limit,
        )
        self._book.add(claim)
        await self._take.take(claim, dev, target, parent, opts)
        self._observers.claimed(claim)
        await self._announce_taken(claim, dev)
        return claim

    async def _announce_taken(self, claim: Claim, dev: RdmaDevice) -> None:
        """Announce the device a claim (or an Attach) just took."""
        if not claim.shared:  # a macvlan child changes nothing the device record shows
            await self._tracker.reread_device(dev.name)  # its port's netdev left init_net
        self._tracker.announce(self._tracker.view(self._inv.devices.get(dev.name, dev)))

    async def _fresh(self, dev: RdmaDevice) -> RdmaDevice:
        """The inventory is fed by events, which can lag behind our own last kernel step (a
        release answered, its RTM_NEWLINK not yet read, and a claim arrives). Before refusing
        a device for having no netdev, re-read the kernel."""
        if self._inv.has_netdev(dev) or self.netns_mode == NetnsMode.UNAVAILABLE:
            return dev
        await self._tracker.reload_netdevs()
        await self._tracker.refresh()
        return self._inv.devices.get(dev.name, dev)

    # ------------------------------------------------------------------ hold, attach
    async def hold(self, device: str, pod_uid: str, options: ClaimOptions) -> Claim:
        """Keep `device` for the pod `pod_uid`, whose netns does not exist yet: a HELD claim
        that moves nothing, that no other claim can take, with its CDI spec written (the
        char devices as init_net shows them), so that the pod's containers can name it."""
        if not pod_uid or len(pod_uid) > 128 or not pod_uid.isprintable():
            raise InvalidArgs(f"invalid pod UID {pod_uid!r}")
        if options.addresses:
            raise InvalidArgs("a Hold takes no addresses: give them to Attach")
        self._need_rdma()
        self._rdma_device(device)
        async with self._records.operating_on(device):
            # Looked up again: it may have been unplugged while this hold waited.
            dev = await self._fresh(self._rdma_device(device))
            self._check(dev, 0, options)
            cgroup = self.limits.check(options)
            mine = [c for c in self._book.of(dev.name) if c.hold and c.hold.pod_uid == pod_uid]
            if mine:
                raise DeviceBusy(f"{dev.name} is held for pod {pod_uid} by claim {mine[0].id}")
            moving = self._netdev_of(dev) if not options.shared and options.netdev else None
            default_ifname = free_hold_ifname(self._book, pod_uid) if options.shared else ""
            claim_id = secrets.token_hex(8)
            claim = Claim(
                id=claim_id,
                device=dev.name,
                attachment=None,
                ifname=options.ifname or (moving.name if moving else default_ifname),
                shared=options.shared,
                owner=options.owner,
                claimant=options.claimant,
                created_at_us=time.time_ns() // 1000,
                cdi_device=f"rdmad.io/rdma={claim_id}",
                phase=ClaimPhase.HELD,
                cdi_name=options.cdi_name,
                hold=HoldSpec(pod_uid, options.mtu or 0, options.chardevs, options.netdev),
                cgroup=cgroup,
                limit=options.limit,
            )
            claim.chardevs = await self._rdma.chardevs(dev, options.chardevs, None)
            self._book.add(claim)
            try:
                self._records.save(claim)
            except RdmadError:
                self._book.drop(claim)
                raise
        self._observers.claimed(claim)
        return claim

    def held_for(self, pod_uid: str) -> list[Claim]:
        """The claims held for a pod, attached or not."""
        return self._book.held_for(pod_uid)

    async def attach(
        self, pod_uid: str, target: NetnsTarget, ifname: str, options: ClaimOptions
    ) -> list[Claim]:
        """Put the devices held for `pod_uid` (only the one named `ifname`, if given) into
        `target`, as a claim would; from then on they are claims of that netns, ended by its
        death. One attached to `target` already is returned as it is (a retried ADD).
        `options`: the addresses to give the netdev. `target` is closed before this
        returns."""
        try:
            chosen = [c for c in self.held_for(pod_uid) if not ifname or c.ifname == ifname]
            if ifname and not chosen:
                raise NoSuchClaim(f"pod {pod_uid} holds no device named {ifname!r}")
            attached: list[Claim] = []
            for claim in chosen:
                if claim.phase == ClaimPhase.HELD or claim.netns_inode != target.inode:
                    async with self._records.locked(claim):
                        await self._attach_locked(claim, target, options)
                attached.append(claim)
            return attached
        finally:
            target.close()

    async def _attach_locked(self, claim: Claim, target: NetnsTarget, opts: ClaimOptions) -> None:
        if claim.phase != ClaimPhase.HELD:
            raise DeviceBusy(f"claim {claim.id} of {claim.device} is attached to {claim.netns}")
        hold = claim.hold
        assert hold is not None  # held_for chose it
        dev = self._inv.devices.get(claim.device)
        if dev is None:
            raise NoSuchDevice(f"{claim.device}, held by claim {claim.id}, is gone")
        dev = await self._fresh(dev)
        if opts.cgroup:  # the pod's cgroup, known now: it replaces the Hold's
            claim.cgroup, claim.limit = self.limits.check(opts), opts.limit
        if claim.shared and any(
            c.netns_inode == target.inode for c in self._book.of(dev.name) if c is not claim
        ):
            raise DeviceBusy(f"{dev.name} is already shared with net:[{target.inode}]")
        parent = self._netdev_of(dev).ifindex if claim.shared else 0
        moving = self._netdev_of(dev) if not claim.shared and hold.netdev else None
        claim.attachment = await self._take.where(moving, target)
        # Filed in `target` now: another claim's table choice there must see it from here on.
        self._book.refile(claim)
        taken = replace(
            opts,
            ifname=claim.ifname,
            mtu=hold.mtu or None,
            shared=claim.shared,
            chardevs=hold.chardevs,
            netdev=hold.netdev,
        )
        await self._take.take(claim, dev, target, parent, taken)
        self._observers.claim_changed(claim)  # the CDI spec: char devices read after the move
        await self._announce_taken(claim, dev)

    async def detach(self, claim_id: str) -> None:
        """Bring an attached held claim's devices home and hold it for its pod again: the
        pod's sandbox is going, not the pod (the kubelet makes a new sandbox without a new
        prepare, and its ADD attaches the claim again). One held already is left as it is
        (a retried DEL). Only Release ends a held claim."""
        claim = self.get_claim(claim_id)
        if claim.hold is None:
            raise InvalidArgs(f"claim {claim_id} is not held for a pod: release it")
        async with self._records.locked(claim):
            if claim.phase == ClaimPhase.ACTIVE:
                alive = await netns_alive(self._resolver, claim)
                await self._release.hold_again(claim, netns_alive=alive)

    # ------------------------------------------------------------------ release
    async def release(self, claim_id: str) -> None:
        """A release the claim's owner asked for (the kernel ends claims through end_claim)."""
        started = time.monotonic()
        try:
            await self._release.release(self.get_claim(claim_id))
        except RdmadError as e:
            self.stats.failed("release", e.dbus_name)
            raise
        self.stats.release_seconds.observe(time.monotonic() - started)

    # ------------------------------------------------------------------ mode
    async def set_netns_mode(self, mode: NetnsMode) -> None:
        """`mode`: shared or exclusive (rdmad.options.parse_netns_mode)."""
        self._need_rdma()
        if mode == self.netns_mode:
            return
        if self._book.claims:
            raise DeviceBusy(
                f"{len(self._book.claims)} claims are live; release them before changing the mode"
            )
        await self._rdma.set_netns_mode(mode)
        self._tracker.adopt_mode(mode)

    # ------------------------------------------------------------------ events
    def handle(self, event: Event) -> None:
        """Queue a kernel event; the tracker applies them in order. A change it reports to
        the device or netns of a claim not returned at start retries that claim's give-back."""
        self._tracker.handle(event)
        self._retry.handle(event)

    # What the tracker finds about claims in the kernel's events: see InventoryTracker.
    async def end_claim(self, claim: Claim, reason: ReleaseReason) -> None:
        """End a claim the kernel ended for us (netns death, device removal)."""
        await self._release.end_claim(claim, reason)

    async def retry_restores(self) -> None:
        await self._giveback.restore_pending()
        self._records.save()

    async def reread_gids(self, claim: Claim) -> None:
        await self._take.reread_gids(claim)
