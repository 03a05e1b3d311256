"""The state machine: claims, release, reconciliation, the RDMA netns mode.

Imports nothing of rdmad.bus or rdmad.kernel, nor dbus_fast or pyudev: it drives the
protocols in rdmad.core.backend (rdmad.kernel implements them over netlink and udev), leaves
applying the events in rdmad.core.events to an InventoryTracker (rdmad.core.tracking) and
giving back what a claim took to GiveBack (rdmad.core.giveback), persists through a Store, and tells
observers (rdmad.core.observer) what changed.

Crash safety: a claim is written as PENDING before the kernel is touched and as RELEASING
before it is given back, so a daemon killed at any step finds out at start what to undo or
finish; an ended claim stays on file as ENDED until its observers are told (its Released),
so that a kill in between leaves the next start to tell them. A device is always either
free in init_net or held by a claim that is listed: one whose give-back the kernel refuses
at start stays listed, NOT_RETURNED, and the daemon starts anyway (a start that failed on
it would be restarted into it, forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from rdmad.core.backend import (
    NetdevBackend,
    NetnsResolver,
    NetnsTarget,
    Placement,
    RdmaBackend,
)
from rdmad.core.claims import ClaimBook
from rdmad.core.events import (
    AddressChanged,
    Event,
    LinkChanged,
    LinkRemoved,
    RdmaChanged,
    Resync,
)
from rdmad.core.giveback import GiveBack, placement
from rdmad.core.inventory import Inventory
from rdmad.core.logfields import (
    MESSAGE_CLAIM_FAILED,
    MESSAGE_GIDS_UNREADABLE,
    MESSAGE_INTERRUPTED,
    MESSAGE_NOT_RETURNED,
    MESSAGE_NSID_REUSED,
    log_claim_event,
    log_event,
)
from rdmad.core.observer import CoreObserver, Observers
from rdmad.core.opstats import OpStats
from rdmad.core.steps import step
from rdmad.core.store import State, Store
from rdmad.core.tracking import InventoryTracker
from rdmad.core.work import Job, Work
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
    TABLE_AUTO,
    Claim,
    ClaimOptions,
    ClaimPhase,
    Counters,
    CounterScope,
    DeviceView,
    Gid,
    HoldSpec,
    HostConfig,
    Netdev,
    NetnsMode,
    PortCounters,
    RdmaDevice,
    ReleaseReason,
    netns_label,
)
from rdmad.options import check_device_name

log = logging.getLogger("rdmad.core.core")

DEFAULT_SHARED_IFNAME = "net1"
DEFAULT_ROUTE_TABLES = range(1000, 2000)  # rdmad.daemon.config's route_tables
# What start does about a claim a crash interrupted, by the phase it was written in.
_INTERRUPTED = {
    ClaimPhase.PENDING: "made: undoing it",
    ClaimPhase.RELEASING: "released: finishing the release",
}
# Loop turns after a failed retry in which its own steps' events are read (and ignored).
ECHO_TURNS = 3


class Core:
    def __init__(
        self,
        net: NetdevBackend,
        rdma: RdmaBackend,
        resolver: NetnsResolver,
        store: Store,
        *,
        shared_limit: int = 16,
        route_tables: range = DEFAULT_ROUTE_TABLES,
    ) -> None:
        self._net = net
        self._rdma = rdma
        self._resolver = resolver
        self._store = store
        self._shared_limit = shared_limit
        self._route_tables = route_tables
        self._inv = Inventory()
        self._book = ClaimBook()
        self._observers = Observers()
        self._tracker = InventoryTracker(
            self._inv,
            net,
            rdma,
            self._book,
            self._observers,
            end_claim=self.end_claim,
            reread_gids=self.reread_gids,
            retry_restores=self.retry_restores,
            netns_alive=self._netns_alive,
        )
        self._giveback = GiveBack(net, rdma, resolver, self._inv, self._book, self._tracker)
        # Claims ended before the bus is up (start's reconcile, then events until the name
        # is taken), told to the observers by announce_startup: a Released sent earlier
        # would not come from io.rdmad1, and monitors match on that name.
        self._startup_releases: list[tuple[Claim, ReleaseReason]] | None = []
        # Ended claims whose Released is not sent yet: their ENDED files stay until it is.
        self._ending: dict[str, Claim] = {}
        self.startup_notes: list[str] = []
        # NOT_RETURNED claims, by id (kept apart from the book so that an event costs
        # nothing while none is owed), and those whose give-back is being retried.
        self._owed: dict[str, Claim] = {}
        self._retrying: set[str] = set()
        self._work = Work(log)  # the retries
        self.stats = OpStats()

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

    def add_observer(self, observer: CoreObserver) -> None:
        self._observers.add(observer)

    def announce_startup(self) -> None:
        """Once every observer is attached and the bus name taken: tell them of the claims
        ended since start, and of every later one as it ends."""
        ended, self._startup_releases = self._startup_releases or [], None
        for claim, reason in ended:
            self._announce_end(claim, reason)

    # ------------------------------------------------------------------ queries
    def devices(self) -> list[DeviceView]:
        return self._tracker.announced_views()

    def device(self, name: str) -> DeviceView:
        return self._tracker.view(self._rdma_device(name))

    def _rdma_device(self, name: str) -> RdmaDevice:
        dev = self._inv.devices.get(check_device_name(name))
        if dev is None:
            raise NoSuchDevice(f"no RDMA device {name!r}")
        return dev

    def claims(self) -> list[Claim]:
        return sorted(self._book.claims.values(), key=lambda c: c.created_at_us)

    def pod_of(self, claim: Claim) -> list[Claim]:
        """The live claims of `claim`'s netns (its pod), it included while live: what every
        CDI spec of the pod describes (rdmad.daemon.cdi). O(claims in that netns). A claim held for
        a pod whose netns does not exist yet is a pod of its own."""
        if not claim.netns_inode:
            return [claim] if self._book.claims.get(claim.id) is claim else []
        return [c for c in self._book.in_netns_of(claim) if c.phase == ClaimPhase.ACTIVE]

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

    @contextlib.asynccontextmanager
    async def _operating_on(self, device: str) -> AsyncIterator[None]:
        """Hold `device` for one claim or release; then announce whatever its view became."""
        try:
            async with self._book.lock(device):
                yield
        finally:
            self._tracker.schedule_view_sync({device})

    # ------------------------------------------------------------------ counters
    async def device_counters(self, name: str) -> Counters:
        """Every port's counters of a device, read from the kernel now: device-wide."""
        dev = self.device(name).device
        whole = next((c for c in self._book.of(dev.name) if not c.shared), None)
        return Counters(CounterScope.DEVICE, await self._read_counters(dev, whole))

    async def claim_counters(self, claim_id: str) -> Counters:
        """A whole-device claim's counters are its own; a shared claim sees its device's."""
        claim = self.get_claim(claim_id)
        dev = self.device(claim.device).device
        if claim.shared:
            return Counters(CounterScope.DEVICE, await self._read_counters(dev, None))
        return Counters(CounterScope.CLAIM, await self._read_counters(dev, claim))

    async def _read_counters(
        self, dev: RdmaDevice, holder: Claim | None
    ) -> tuple[PortCounters, ...]:
        """Where a whole-device claim took the device, read it in the claim's netns, opened
        for this read only."""
        target = self._resolver.reopen(holder.netns_inode, holder.netns_path) if holder else None
        try:
            return await self._rdma.counters(dev, target)
        finally:
            if target is not None:
                target.close()

    # ------------------------------------------------------------------ start
    async def start(self) -> None:
        """Enumerate, load the state files, reconcile, then start consuming events.

        The caller starts the event sources first: events queue up meanwhile, so nothing
        falls between subscription and enumeration.
        """
        self.netns_mode = await self._rdma.netns_mode()
        for nd in await self._net.list_netdevs():
            self._inv.netdevs[nd.ifindex] = nd
        state = self._store.load()
        if state.set_aside:  # each logged with its reason by the store
            self.startup_notes.append(
                f"state file unreadable: {len(state.set_aside)} set aside in "
                f"{state.set_aside[0].parent} (see the log)"
            )
        ended = [c for c in state.claims if c.phase == ClaimPhase.ENDED]
        self._book.load(
            [c for c in state.claims if c.phase != ClaimPhase.ENDED], state.pending_restores
        )
        for claim in ended:  # the last run saved their end, and was killed before telling it
            self._ending[claim.id] = claim
            self._tell_end(claim, claim.end_reason or ReleaseReason.RECONCILED)
        visible: set[str] | None = None
        if self.netns_mode != NetnsMode.UNAVAILABLE:  # else picked up when ib_core appears
            listed = await self._rdma.list_devices()
            visible = {d.name for d in listed}
        self._assume_pending_moved(visible)
        if visible is not None:
            hidden = [
                c.moved_device
                for c in self._book.claims.values()
                if c.rdma_moved and c.moved_device and c.device not in visible
            ]
            self._inv.replace_devices(listed + hidden, keep=set())
        await self._reconcile()
        self._tracker.start()

    async def quiesce(self) -> None:
        """Wait until the kernel events queued so far are applied and all they set going is
        done, but for what waits for the kernel to report more (a netdev not home yet): at
        shutdown, so that a claim being ended is not cut off half-way."""
        await self._tracker.quiesce()
        while self._retrying:  # a retry's own kernel steps may set the tracker going again
            await self._work.quiesce()
            await self._tracker.quiesce()

    async def close(self) -> None:
        await self._work.close()
        await self._tracker.close()

    def _assume_pending_moved(self, visible: set[str] | None) -> None:
        """A PENDING claim is written once, before the first kernel step, so its moved flags
        say nothing about how far it got: a crash may have come after any step. Assume the
        netdev moved (the undo finds it home if it never left) and that the RDMA device moved
        if init_net no longer sees it (exclusive mode hides moved devices)."""
        for claim in self._book.claims.values():
            if claim.phase != ClaimPhase.PENDING:
                continue
            if claim.shared or claim.host is not None:
                claim.netdev_moved = True
            exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
            if not claim.shared and exclusive and visible is not None:
                claim.rdma_moved = claim.device not in visible

    async def _reconcile(self) -> None:
        live = await self._net.live_nsids()
        for claim in list(self._book.claims.values()):
            if claim.phase == ClaimPhase.HELD:
                continue  # nothing moved: it waits for its pod's Attach or Release
            # The nsid says dead for sure; a live one may have been given to another netns.
            alive = (claim.nsid < 0 or claim.nsid in live) and await self._netns_alive(claim)
            if claim.phase == ClaimPhase.ACTIVE and alive:
                continue
            doing = _INTERRUPTED.get(claim.phase)
            if doing is not None:
                log_claim_event(
                    log,
                    MESSAGE_INTERRUPTED,
                    claim,
                    f"claim {claim.id} of {claim.device} was interrupted while being {doing}",
                    level=logging.WARNING,
                )
            # A claim never made was never announced; any other was, or was on the bus.
            announced = claim.phase != ClaimPhase.PENDING
            try:
                await self._giveback.give_back(claim, netns_alive=alive)
            except Exception as exc:  # one claim must not keep the daemon from starting
                self._keep_not_returned(claim, exc)
                continue
            if claim.hold is not None and claim.phase in (ClaimPhase.PENDING, ClaimPhase.ACTIVE):
                # An interrupted Attach, or the netns of an attached one died: held again, for
                # the pod's next ADD.
                _back_to_held(claim, self._book)
                dev = self._inv.devices.get(claim.device)
                # In init_net now (exclusive mode: uverbs made anew). Unread, they stay stale
                # until the pod's next Attach reads them.
                with contextlib.suppress(RdmadError):
                    if dev is not None:
                        claim.chardevs = await self._rdma.chardevs(dev, claim.hold.chardevs, None)
                continue
            if announced:
                self._end(claim, ReleaseReason.RECONCILED)  # saved by start's full save
                self._tell_end(claim, ReleaseReason.RECONCILED)
            else:
                self._drop(claim)
        # From here on, a change to the device or netns of one of these retries it (`handle`).
        owed = [c for c in self._book.claims.values() if c.phase == ClaimPhase.NOT_RETURNED]
        self._owed = {c.id: c for c in owed}
        if self._owed:
            n = len(self._owed)
            self.startup_notes.append(
                f"could not give back {n} claim{'s' if n > 1 else ''} at start "
                "(listed as not-returned; see the journal)"
            )
        await self._giveback.restore_pending()
        self._save()

    def _keep_not_returned(self, claim: Claim, exc: Exception) -> None:
        """The kernel refused a give-back at start: keep the claim listed, with the reason,
        and try again on the next change to its device or netns (`handle`)."""
        claim.phase = ClaimPhase.NOT_RETURNED
        claim.failure = str(exc) if isinstance(exc, RdmadError) else repr(exc)
        log_claim_event(
            log,
            MESSAGE_NOT_RETURNED,
            claim,
            f"could not give back what claim {claim.id} took of {claim.device}: "
            f"{claim.failure}; it stays listed (not-returned), to be given back on the next "
            "change to its device or netns, on Release, or at the next start",
            error=exc.dbus_name if isinstance(exc, RdmadError) else None,
            level=logging.ERROR,
        )

    async def _netns_alive(self, claim: Claim) -> bool:
        """Whether the claim's netns lives. The netns found by its inode may be a newer one:
        the kernel gives a dead netns's inode and nsid to the next ones made, so its cookie
        decides (a claim saved by an older rdmad has none: the inode has to do)."""
        target = self._resolver.reopen(claim.netns_inode, claim.netns_path)
        if target is None:
            return False
        try:
            cookie = claim.netns_cookie
            return not cookie or await self._resolver.cookie(target) == cookie
        finally:
            target.close()

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
            if self.netns_mode == NetnsMode.UNAVAILABLE:
                raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")
            self._rdma_device(device)
            async with self._operating_on(device):
                # Looked up again: it may have been unplugged while this claim waited.
                return await self._claim_locked(self._rdma_device(device), target, options)
        finally:
            target.close()

    def _check_claim(self, dev: RdmaDevice, inode: int, opts: ClaimOptions) -> None:
        """`inode`: the claimant's netns, 0 for a Hold (no netns yet)."""
        named = [
            c for c in self._book.claims.values() if opts.cdi_name and c.cdi_name == opts.cdi_name
        ]
        if named:
            # Two specs naming one CDI device make runtimes refuse both.
            raise InvalidArgs(f"CDI name {opts.cdi_name!r} is taken by claim {named[0].id}")
        self._check_pod_cdi_name(inode, opts)
        mine = self._book.of(dev.name)
        exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
        if opts.shared:
            if exclusive:
                raise NotSupported(
                    f"{dev.name}: shared claims need the RDMA subsystem in shared mode; "
                    "it is in exclusive mode"
                )
            if any(not c.shared for c in mine):
                raise DeviceBusy(f"{dev.name} is claimed whole by claim {mine[0].id}")
            if inode and any(c.netns_inode == inode for c in mine):
                raise DeviceBusy(f"{dev.name} is already shared with {mine[0].netns}")
            if len(mine) >= self._shared_limit:
                raise DeviceBusy(
                    f"{dev.name} has {len(mine)} shared claims, the limit ({self._shared_limit})"
                )
            if not self._inv.has_netdev(dev):
                raise NotSupported(f"{dev.name} has no netdev to share a macvlan child of")
            return
        if mine:
            raise DeviceBusy(f"{dev.name} is held by claim {mine[0].id} ({mine[0].netns})")
        if not opts.netdev:
            if not exclusive:
                raise NotSupported(
                    f"{dev.name}: moving only the RDMA device needs the RDMA subsystem in "
                    "exclusive netns mode; it is in shared mode (switch it to exclusive first)"
                )
            return
        if dev.virtual:
            raise NotSupported(
                f"{dev.name} is a software RDMA device ({dev.driver}): moving its netdev "
                f"{dev.netdev or '(none)'} would destroy it. Claim it with netdev=false "
                "(exclusive mode) or make a shared claim instead"
            )
        if not self._inv.has_netdev(dev):
            raise NotSupported(f"{dev.name} has no netdev in init_net to move")

    def _check_pod_cdi_name(self, inode: int, opts: ClaimOptions) -> None:
        """A pod CDI name names one spec, of one netns's claims (a netns may have several,
        each listing all of them), and no claim's cdi_name: two specs naming one CDI device
        make runtimes refuse both."""
        for c in self._book.claims.values():
            if opts.cdi_name and c.pod_cdi_name == opts.cdi_name:
                raise InvalidArgs(f"CDI name {opts.cdi_name!r} is the pod CDI name of claim {c.id}")
            if not opts.pod_cdi_name:
                continue
            if c.cdi_name == opts.pod_cdi_name:
                raise InvalidArgs(
                    f"pod CDI name {opts.pod_cdi_name!r} is the CDI name of claim {c.id}"
                )
            if c.pod_cdi_name == opts.pod_cdi_name and c.netns_inode != inode:
                raise InvalidArgs(
                    f"pod CDI name {opts.pod_cdi_name!r} is taken by claim {c.id} in {c.netns}"
                )
        if opts.pod_cdi_name and not inode:
            raise InvalidArgs("option 'pod_cdi_name' needs the pod's netns: give it to Attach")

    async def _claim_locked(
        self, dev: RdmaDevice, target: NetnsTarget, opts: ClaimOptions
    ) -> Claim:
        dev = await self._fresh(dev)
        self._check_claim(dev, target.inode, opts)
        claim_id = secrets.token_hex(8)
        # Read before the first await: events applied meanwhile must not change the parent.
        parent = self._netdev_of(dev).ifindex if opts.shared else 0
        moving = self._netdev_of(dev) if not opts.shared and opts.netdev else None
        host, nsid, cookie = await asyncio.gather(
            self._host_config(moving), self._net.nsid(target), self._resolver.cookie(target)
        )
        default_ifname = DEFAULT_SHARED_IFNAME if opts.shared else (host.name if host else "")
        claim = Claim(
            id=claim_id,
            device=dev.name,
            netns_inode=target.inode,
            netns_path=target.path,
            nsid=nsid,
            netns_cookie=cookie,
            ifname=opts.ifname or default_ifname,
            shared=opts.shared,
            owner=opts.owner,
            claimant=opts.claimant,
            created_at_us=time.time_ns() // 1000,
            host=host,
            cdi_device=f"rdmad.io/rdma={claim_id}",
            phase=ClaimPhase.PENDING,
            cdi_name=opts.cdi_name,
            pod_cdi_name=opts.pod_cdi_name,
        )
        self._book.add(claim)
        await self._take(claim, dev, target, parent, opts)
        self._observers.claimed(claim)
        if not claim.shared:  # a macvlan child changes nothing the device record shows
            await self._tracker.reread_device(dev.name)  # its port's netdev left init_net
        self._tracker.announce(self._tracker.view(self._inv.devices.get(dev.name, dev)))
        return claim

    # ------------------------------------------------------------------ hold, attach
    async def hold(self, device: str, pod_uid: str, options: ClaimOptions) -> Claim:
        """Keep `device` for the pod `pod_uid`, whose netns does not exist yet: a HELD claim
        that moves nothing, that no other claim can take, with its CDI spec written (the
        char devices as init_net shows them), so that the pod's containers can name it."""
        if not pod_uid or len(pod_uid) > 128 or not pod_uid.isprintable():
            raise InvalidArgs(f"invalid pod UID {pod_uid!r}")
        if options.addresses:
            raise InvalidArgs("a Hold takes no addresses: give them to Attach")
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")
        self._rdma_device(device)
        async with self._operating_on(device):
            # Looked up again: it may have been unplugged while this hold waited.
            dev = await self._fresh(self._rdma_device(device))
            self._check_claim(dev, 0, options)
            mine = [c for c in self._book.of(dev.name) if c.hold and c.hold.pod_uid == pod_uid]
            if mine:
                raise DeviceBusy(f"{dev.name} is held for pod {pod_uid} by claim {mine[0].id}")
            moving = self._netdev_of(dev) if not options.shared and options.netdev else None
            default_ifname = self._free_hold_ifname(pod_uid) if options.shared else ""
            claim_id = secrets.token_hex(8)
            claim = Claim(
                id=claim_id,
                device=dev.name,
                netns_inode=0,
                netns_path="",
                nsid=-1,
                ifname=options.ifname or (moving.name if moving else default_ifname),
                shared=options.shared,
                owner=options.owner,
                claimant=options.claimant,
                created_at_us=time.time_ns() // 1000,
                cdi_device=f"rdmad.io/rdma={claim_id}",
                phase=ClaimPhase.HELD,
                cdi_name=options.cdi_name,
                hold=HoldSpec(pod_uid, options.mtu or 0, options.chardevs, options.netdev),
            )
            claim.chardevs = await self._rdma.chardevs(dev, options.chardevs, None)
            self._book.add(claim)
            try:
                self._save(claim)
            except RdmadError:
                self._book.drop(claim)
                raise
        self._observers.claimed(claim)
        return claim

    def _free_hold_ifname(self, pod_uid: str) -> str:
        """A shared hold's default name: the first of net1, net2, ... that none of the pod's
        other holds has, so that a pod's shares, all attached into one netns, never clash."""
        taken = {c.ifname for c in self.held_for(pod_uid)}
        return next(f"net{n}" for n in itertools.count(1) if f"net{n}" not in taken)

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
                    async with self._operating_on(claim.device):
                        await self._attach_locked(claim, target, options)
                attached.append(claim)
            return attached
        finally:
            target.close()

    async def _attach_locked(self, claim: Claim, target: NetnsTarget, opts: ClaimOptions) -> None:
        if self._book.claims.get(claim.id) is not claim:
            raise NoSuchClaim(f"claim {claim.id} ended while waiting")
        if claim.phase != ClaimPhase.HELD:
            raise DeviceBusy(f"claim {claim.id} of {claim.device} is attached to {claim.netns}")
        hold = claim.hold
        assert hold is not None  # held_for chose it
        dev = self._inv.devices.get(claim.device)
        if dev is None:
            raise NoSuchDevice(f"{claim.device}, held by claim {claim.id}, is gone")
        dev = await self._fresh(dev)
        if claim.shared and any(
            c.netns_inode == target.inode for c in self._book.of(dev.name) if c is not claim
        ):
            raise DeviceBusy(f"{dev.name} is already shared with net:[{target.inode}]")
        parent = self._netdev_of(dev).ifindex if claim.shared else 0
        moving = self._netdev_of(dev) if not claim.shared and hold.netdev else None
        claim.host, claim.nsid, claim.netns_cookie = await asyncio.gather(
            self._host_config(moving), self._net.nsid(target), self._resolver.cookie(target)
        )
        claim.netns_inode, claim.netns_path = target.inode, target.path
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
        await self._take(claim, dev, target, parent, taken)
        self._observers.claim_changed(claim)  # the CDI spec: char devices read after the move
        if not claim.shared:
            await self._tracker.reread_device(dev.name)
        self._tracker.announce(self._tracker.view(self._inv.devices.get(dev.name, dev)))

    async def detach(self, claim_id: str) -> None:
        """Bring an attached held claim's devices home and hold it for its pod again: the
        pod's sandbox is going, not the pod (the kubelet makes a new sandbox without a new
        prepare, and its ADD attaches the claim again). One held already is left as it is
        (a retried DEL). Only Release ends a held claim."""
        claim = self.get_claim(claim_id)
        if claim.hold is None:
            raise InvalidArgs(f"claim {claim_id} is not held for a pod: release it")
        async with self._operating_on(claim.device):
            if self._book.claims.get(claim_id) is not claim:
                raise NoSuchClaim(f"claim {claim_id!r} ended while waiting")
            if claim.phase == ClaimPhase.ACTIVE:
                await self._hold_again(claim, netns_alive=await self._netns_alive(claim))

    async def _hold_again(self, claim: Claim, *, netns_alive: bool) -> None:
        """Give back what an attached held claim took and hold it for its pod again, with
        its char devices read in init_net (in exclusive mode the move home made uverbs
        anew). Under the device's lock. Unsaved, the record still says attached: the next
        start, or the netns's death, gives it back and holds it again."""
        hold = claim.hold
        assert hold is not None
        try:
            await self._giveback.give_back(claim, netns_alive=netns_alive)
        except RdmadError as exc:
            log_claim_event(
                log,
                MESSAGE_NOT_RETURNED,
                claim,
                f"claim {claim.id} of {claim.device} could not give everything back from "
                f"{claim.netns}: {exc}",
                level=logging.ERROR,
            )
            if netns_alive:
                raise  # a Detach: the claim stays where it is, for the caller to retry
        log.info("claim %s of %s is held for pod %s again", claim.id, claim.device, hold.pod_uid)
        rest = self._leave_netns(claim)
        dev = self._inv.devices.get(claim.device)
        if dev is not None:
            claim.chardevs = await self._rdma.chardevs(dev, hold.chardevs, None)
        try:
            self._save(claim)
        except RdmadError as exc:
            log.error("claim %s is held again, but that could not be saved: %s", claim.id, exc)
        if netns_alive:  # a dead netns's claims all leave it, each removing its own specs
            self._observers.left_netns(claim, rest)
        self._observers.claim_changed(claim)  # the bus's State and Netns, the CDI spec

    async def _take(
        self, claim: Claim, dev: RdmaDevice, target: NetnsTarget, parent: int, opts: ClaimOptions
    ) -> None:
        """The kernel steps of a claim (or a held claim's Attach), PENDING on disk before
        the first and ACTIVE after the last; undone if one fails. `parent`: a shared
        claim's netdev, 0 for a whole one."""
        exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
        host = claim.host
        claim.phase = ClaimPhase.PENDING
        try:
            if opts.table is not None:  # booked before the save: the undo finds it
                claim.route_table = await self._table_for(claim, target, opts.table)
            if not opts.shared and exclusive:
                claim.moved_device = dev
            self._save(claim)
            step("pending-written", f"claim {claim.id}")
            if not opts.shared and exclusive:
                await self._rdma.move(dev.index, target)
                claim.rdma_moved = True
                step("rdma-moved", f"claim {claim.id}")
            if opts.shared:
                placed = await self._net.add_macvlan(
                    parent,
                    target,
                    claim.ifname,
                    opts.mtu,
                    opts.addresses,
                )
                claim.netdev_moved = True
            elif host is not None:
                placed = await self._net.place(
                    host.ifindex, target, claim.ifname, opts.mtu, opts.addresses, host
                )
                claim.netdev_moved = True
            else:
                placed = Placement(claim.nsid, 0, "")
            claim.nsid, claim.ns_ifindex = placed.nsid, placed.ifindex
            self._book.refile(claim)  # under the nsid the kernel reports it placed in
            step("netdev-placed", f"claim {claim.id}")
            if claim.route_table:
                await self._net.add_policy_routing(
                    target, placed.ifindex, claim.route_table, opts.addresses, opts.routes
                )
                step("routes-installed", f"claim {claim.id}")
            claim.chardevs = await self._rdma.chardevs(
                dev, opts.chardevs, target if claim.rdma_moved else None
            )
            claim.gids = await self._claim_gids(claim, target, placed)
            claim.phase = ClaimPhase.ACTIVE
            self._save(claim)
            step("active-written", f"claim {claim.id}")
        except BaseException as exc:
            await self._undo_failed_claim(claim, target, exc)
            raise

    async def _table_for(self, claim: Claim, target: NetnsTarget, asked: int) -> int:
        """The routing table `claim` takes in `target`: `asked`, or with TABLE_AUTO the
        lowest of the configured range that no claim of that netns has and that holds no
        route and no rule there. Tables are per netns: other pods' do not count."""
        in_kernel = await self._net.tables_in_use(target)
        # Read after the await: a claim of this netns booked meanwhile has its table set.
        # The book files a claim in its netns as soon as it has one (refile), an Attach's too.
        taken = {
            c.route_table: c
            for c in self._book.in_netns(target.inode)
            if c.route_table and c is not claim
        }
        where = netns_label(target.inode)
        if asked != TABLE_AUTO:
            if asked in taken:
                raise InvalidArgs(
                    f"routing table {asked} of {where} is taken by claim {taken[asked].id}"
                )
            if asked in in_kernel:
                raise InvalidArgs(f"routing table {asked} of {where} holds routes or rules already")
            return asked
        free = next((t for t in self._route_tables if t not in taken and t not in in_kernel), 0)
        if not free:
            span = f"{self._route_tables.start}-{self._route_tables.stop - 1}"
            raise InvalidArgs(f"no free routing table in {span} (route_tables) in {where}")
        return free

    async def _claim_gids(
        self, claim: Claim, target: NetnsTarget, placed: Placement
    ) -> tuple[Gid, ...]:
        """The GID entries a claim's user picks from: a shared claim's are its child's, a
        whole claim's are the device's. Without them the claim still works: a failed read
        costs the user the hint, not the device."""
        inside = target if claim.shared or claim.rdma_moved else None
        try:
            return await self._rdma.gids(claim.device, inside, placed if claim.shared else None)
        except RdmadError as exc:
            log_claim_event(
                log,
                MESSAGE_GIDS_UNREADABLE,
                claim,
                f"claim {claim.id}: cannot read the GID table of {claim.device}: {exc}",
                level=logging.WARNING,
            )
            return ()

    async def _host_config(self, netdev: Netdev | None) -> HostConfig | None:
        """What to restore on release, for a claim that moves the device's netdev."""
        if netdev is None:
            return None
        return replace(await self._net.host_config(netdev.ifindex), kind=netdev.kind)

    async def _fresh(self, dev: RdmaDevice) -> RdmaDevice:
        """The inventory is fed by events, which can lag behind our own last kernel step (a
        release answered, its RTM_NEWLINK not yet read, and a claim arrives). Before refusing
        a device for having no netdev, re-read the kernel."""
        if self._inv.has_netdev(dev) or self.netns_mode == NetnsMode.UNAVAILABLE:
            return dev
        await self._tracker.reload_netdevs()
        await self._tracker.refresh()
        return self._inv.devices.get(dev.name, dev)

    async def _undo_failed_claim(
        self, claim: Claim, target: NetnsTarget, exc: BaseException
    ) -> None:
        """Put everything back as it was before a failed claim, then forget the claim."""
        if not isinstance(exc, RdmadError):  # an RdmadError is logged by claim()
            log_claim_event(
                log,
                MESSAGE_CLAIM_FAILED,
                claim,
                f"claim {claim.id} of {claim.device} failed unexpectedly: {exc!r}",
                level=logging.ERROR,
            )
        try:
            if claim.route_table:  # free when booked: whatever it holds now is this claim's
                await self._net.remove_policy_routing(target, claim.route_table)
            if claim.netdev_moved:
                await self._giveback.bring_netdev_home(claim)
            if claim.rdma_moved:
                await self._rdma.move_home(claim.device, target)
        except RdmadError as undo_exc:
            # Leave it PENDING on disk: the next start (or an operator) finishes the undo.
            log_claim_event(
                log,
                MESSAGE_NOT_RETURNED,
                claim,
                f"could not undo the failed claim {claim.id} of {claim.device}: {undo_exc}; "
                "the next start finishes the undo",
                level=logging.ERROR,
            )
            return
        rest = None
        if claim.hold is not None:
            rest = self._leave_netns(claim)  # a failed Attach: still held for the pod
        else:
            self._book.drop(claim)
        with contextlib.suppress(RdmadError):
            self._save(claim)
        if rest is not None:
            self._observers.left_netns(claim, rest)
        # Events applied meanwhile re-read the device without its netdev: read it again
        # before the lock goes, or the failed claim would show as a passing "unavailable".
        await self._tracker.reread_device(claim.device)

    # ------------------------------------------------------------------ release
    async def release(self, claim_id: str) -> None:
        """A release the claim's owner asked for (the kernel ends claims through end_claim)."""
        started = time.monotonic()
        try:
            await self._release(claim_id)
        except RdmadError as e:
            self.stats.failed("release", e.dbus_name)
            raise
        self.stats.release_seconds.observe(time.monotonic() - started)

    async def _release(self, claim_id: str) -> None:
        claim = self.get_claim(claim_id)
        async with self._operating_on(claim.device):
            if self._book.claims.get(claim_id) is not claim:
                raise NoSuchClaim(f"claim {claim_id!r} ended while waiting")
            # By inode and cookie, not nsid: a dead netns's nsid may already name another one.
            # A NOT_RETURNED claim is on record as owed already.
            alive = claim.phase != ClaimPhase.HELD and await self._netns_alive(claim)
            if claim.phase != ClaimPhase.NOT_RETURNED:
                claim.phase = ClaimPhase.RELEASING
                self._save(claim)
                step("releasing-written", f"claim {claim.id}")
            await self._giveback.give_back(claim, netns_alive=alive)
            self._end(claim, ReleaseReason.REQUESTED)
            self._save(claim)
            step("released-written", f"claim {claim.id}")
        self._finish_release(claim, ReleaseReason.REQUESTED)

    def _finish_release(self, claim: Claim, reason: ReleaseReason) -> None:
        self.stats.released(reason)
        self._tell_end(claim, reason)
        dev = self._inv.devices.get(claim.device)
        if dev is not None:
            self._tracker.announce(self._tracker.view(dev))

    def _tell_end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Tell the observers now, or (while starting) once announce_startup is called."""
        if self._startup_releases is not None:
            self._startup_releases.append((claim, reason))
        else:
            self._announce_end(claim, reason)

    def _announce_end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Tell the observers (Released on the bus), then remove the claim's ENDED file."""
        self._observers.released(claim, reason)
        if self._ending.pop(claim.id, None) is None:
            return
        try:
            self._save(claim)
        except RdmadError as exc:
            log.error("claim %s: its end is told, but its file stays: %s", claim.id, exc)

    def _end(self, claim: Claim, reason: ReleaseReason) -> None:
        """Out of the book, ENDED with `reason` until its observers are told (_announce_end):
        the caller saves it so, and a daemon killed in between tells them at its start."""
        self._drop(claim)
        claim.phase, claim.end_reason = ClaimPhase.ENDED, reason
        self._ending[claim.id] = claim

    def _drop(self, claim: Claim) -> None:
        self._book.drop(claim)
        self._owed.pop(claim.id, None)

    # ------------------------------------------------------------------ mode
    async def set_netns_mode(self, mode: NetnsMode) -> None:
        """`mode`: shared or exclusive (rdmad.options.parse_netns_mode)."""
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")
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
        for claim in list(self._owed.values()):
            if claim.id not in self._retrying and self._concerns(claim, event):
                self._retrying.add(claim.id)
                job = Job("giving back a not-returned claim", claim.device, claim.netns, claim.id)
                self._work.spawn(self._retry_give_back(claim), job)

    def _concerns(self, claim: Claim, event: Event) -> bool:
        """Whether `event` reports a change to the claim's RDMA device, its netdev (or a
        shared claim's parent) or its netns. A netns's death ends the claim: end_claim."""
        dev = self._inv.devices.get(claim.device)
        netdevs = {claim.host.ifindex} if claim.host is not None else set()
        if dev is not None and dev.netdev_ifindex:
            netdevs.add(dev.netdev_ifindex)
        if isinstance(event, RdmaChanged):
            named = event.device or self._inv.device_of_chardev(event.chardev)
            return named in ("", claim.device)  # "": it could be any device
        if isinstance(event, LinkChanged):
            return event.netdev.ifindex in netdevs
        if isinstance(event, LinkRemoved):
            return event.ifindex in netdevs
        if isinstance(event, AddressChanged):
            return event.nsid == claim.nsid if event.nsid is not None else event.ifindex in netdevs
        return isinstance(event, Resync)

    async def _retry_give_back(self, claim: Claim) -> None:
        """Try a NOT_RETURNED claim's give-back again; end the claim if it works."""
        try:
            if await self._given_back_again(claim):
                self._finish_release(claim, ReleaseReason.RECONCILED)
                return
            # The events of this attempt's own steps are read in the next turns of the loop:
            # while the claim still counts as retrying, they retry nothing.
            for _ in range(ECHO_TURNS):
                await asyncio.sleep(0)
        finally:
            self._retrying.discard(claim.id)

    async def _given_back_again(self, claim: Claim) -> bool:
        """Whether the give-back worked this time (the claim is then dropped and saved)."""
        async with self._operating_on(claim.device):
            if self._owed.get(claim.id) is not claim:
                return False  # released or ended meanwhile
            if claim.host is not None:  # the change may be its coming home: see it
                await self._tracker.reread_netdev(claim.host.ifindex)
            try:
                await self._giveback.give_back(claim, netns_alive=await self._netns_alive(claim))
            except RdmadError as exc:
                log_claim_event(
                    log,
                    MESSAGE_NOT_RETURNED,
                    claim,
                    f"still could not give back what claim {claim.id} took of "
                    f"{claim.device}: {exc}",
                    error=exc.dbus_name,
                    level=logging.WARNING,
                )
                return False
            self._end(claim, ReleaseReason.RECONCILED)
            self._save_end(claim)
        return True

    # What the tracker finds about claims in the kernel's events: see InventoryTracker.
    async def retry_restores(self) -> None:
        await self._giveback.restore_pending()
        self._save()

    async def end_claim(self, claim: Claim, reason: ReleaseReason) -> None:
        """End a claim the kernel ended for us (netns death, device removal)."""
        async with self._operating_on(claim.device):
            if self._book.claims.get(claim.id) is not claim:
                return  # released meanwhile
            if reason == ReleaseReason.NETNS_GONE and await self._netns_alive(claim):
                # A stale RTM_DELNSID: nsids are reused as soon as a netns dies, so an event
                # still queued about a dead netns can carry the nsid this live one got since.
                log_claim_event(
                    log,
                    MESSAGE_NSID_REUSED,
                    claim,
                    f"claim {claim.id}: nsid {claim.nsid} was dropped but {claim.netns} is "
                    "alive (nsid reused); keeping the claim",
                    level=logging.INFO,
                )
                return
            if reason == ReleaseReason.NETNS_GONE and claim.hold is not None:
                # The pod's sandbox died, not the pod: its next sandbox attaches the claim.
                await self._hold_again(claim, netns_alive=False)
                return
            alive = reason != ReleaseReason.NETNS_GONE
            try:
                claim.phase = ClaimPhase.RELEASING
                # Unsaved (a full disk), nothing is given back: the next start finds the
                # claim as the file has it, its netns or device gone, and gives it back.
                self._save(claim)
                await self._giveback.give_back(claim, netns_alive=alive)
            except RdmadError as exc:
                log_claim_event(
                    log,
                    MESSAGE_NOT_RETURNED,
                    claim,
                    f"claim {claim.id} of {claim.device} ended ({reason.value}) but could not "
                    f"give everything back: {exc}",
                    level=logging.ERROR,
                )
            self._end(claim, reason)
            self._save_end(claim)
        self._finish_release(claim, reason)

    def _save_end(self, claim: Claim) -> None:
        """Save that a claim no caller is waiting on ended. Its kernel side is over, and its
        observers are to be told so, whatever the disk says: unsaved, the next start finds
        the claim's netns or device gone, or what it took home already, and ends it."""
        try:
            self._save(claim)
        except RdmadError as exc:
            log.error("claim %s ended, but its end could not be saved: %s", claim.id, exc)

    async def reread_gids(self, claim: Claim) -> None:
        """The addresses in a claim's netns changed: read its GIDs again, and tell observers
        (the CDI spec, the bus) when they differ."""
        async with self._book.lock(claim.device):
            if self._book.claims.get(claim.id) is not claim or claim.phase != ClaimPhase.ACTIVE:
                return
            target = self._resolver.reopen(claim.netns_inode, claim.netns_path)
            if target is None:
                return  # dying: NetnsGone ends the claim
            try:
                gids = await self._claim_gids(claim, target, placement(claim))
            finally:
                target.close()
            if gids == claim.gids:
                return
            claim.gids = gids
            self._save(claim)
        self._observers.claim_changed(claim)

    def _leave_netns(self, claim: Claim) -> list[Claim]:
        """Hold an attached (or attaching) claim for its pod again, out of its netns: the
        live claims it leaves there, returned, are the pod its observers must rewrite."""
        rest = [c for c in self.pod_of(claim) if c is not claim]
        _back_to_held(claim, self._book)
        return rest

    # ------------------------------------------------------------------ persistence
    def _save(self, changed: Claim | None = None) -> None:
        """Save the state; `changed`: the one claim changed since the last save, if only
        one was (every change to a claim is followed by its save), else all of it."""
        if changed is None:
            claims = [*self._book.claims.values(), *self._ending.values()]
            self._store.save(State(claims, list(self._book.pending_restores)))
        else:
            self._store.save_claim(
                changed,
                live=self._book.claims.get(changed.id) is changed or changed.id in self._ending,
                pending_restores=self._book.pending_restores,
            )


def _back_to_held(claim: Claim, book: ClaimBook) -> None:
    """A held claim whose Attach was undone: as Hold left it, waiting for its pod, and
    filed so in `book`."""
    claim.phase = ClaimPhase.HELD
    claim.netns_inode, claim.netns_path, claim.nsid, claim.ns_ifindex = 0, "", -1, 0
    claim.netns_cookie, claim.route_table, claim.moved_device = 0, 0, None
    claim.host, claim.netdev_moved, claim.rdma_moved, claim.gids = None, False, False, ()
    book.refile(claim)
