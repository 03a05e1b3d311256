"""The state machine: inventory, claims, release, reconciliation, kernel events.

Imports no D-Bus, pyroute2 or pyudev. It drives the protocols in rdmad.backend, is fed the
events in rdmad.events, persists through a Store, and tells observers what changed.

Crash safety: a claim is written as PENDING before the kernel is touched and as RELEASING
before it is given back, so a daemon killed at any step finds out at start what to undo or
finish. A device is always either free in init_net or held by a claim that is listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from rdmad.backend import NetdevBackend, NetnsResolver, NetnsTarget, Placement, RdmaBackend
from rdmad.errors import (
    DeviceBusy,
    InvalidArgs,
    NoSuchClaim,
    NoSuchDevice,
    NotSupported,
    RdmadError,
    Unavailable,
)
from rdmad.events import Event, LinkChanged, LinkRemoved, NetnsGone, RdmaChanged, Resync
from rdmad.inventory import Inventory
from rdmad.model import (
    Claim,
    ClaimOptions,
    ClaimPhase,
    DeviceView,
    HostConfig,
    Netdev,
    NetnsMode,
    RdmaDevice,
    ReleaseReason,
)
from rdmad.options import check_device_name
from rdmad.store import CorruptState, State, Store

log = logging.getLogger("rdmad.core")

DEFAULT_SHARED_IFNAME = "net1"
# How long a physical netdev may take to come home after its netns died (measured: tens of ms).
RETURN_TIMEOUT_S = 5.0


class CoreObserver(Protocol):
    """Told after each change has been applied and persisted. Must not raise or block."""

    def device_added(self, view: DeviceView) -> None: ...

    def device_removed(self, view: DeviceView) -> None: ...

    def device_changed(self, view: DeviceView) -> None: ...

    def claimed(self, claim: Claim) -> None: ...

    def released(self, claim: Claim, reason: ReleaseReason) -> None: ...

    def mode_changed(self, mode: NetnsMode) -> None: ...


# Test seam for crash-point injection: called with a step name after each kernel step.
StepHook = Callable[[str], None]


class Core:
    def __init__(
        self,
        net: NetdevBackend,
        rdma: RdmaBackend,
        resolver: NetnsResolver,
        store: Store,
        *,
        shared_limit: int = 16,
        step_hook: StepHook | None = None,
    ) -> None:
        self._net = net
        self._rdma = rdma
        self._resolver = resolver
        self._store = store
        self._shared_limit = shared_limit
        self._step = step_hook or (lambda _step: None)
        self.netns_mode = NetnsMode.UNAVAILABLE
        self._inv = Inventory()
        self._claims: dict[str, Claim] = {}
        self._pending_restores: list[HostConfig] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._observers: list[CoreObserver] = []
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._link_waiters: dict[int, asyncio.Future[None]] = {}
        self._device_waiters: dict[str, asyncio.Future[None]] = {}
        self._refresh_all = False
        self._refresh_some: set[str] = set()
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()
        self._touched_links: set[int] | None = None  # set while a netdev dump runs
        self._reload_lock = asyncio.Lock()
        self._announced: dict[str, DeviceView] = {}  # what observers were last told
        self._sync_task: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        # Released(reconciled) found at start, announced once observers are attached.
        self._startup_releases: list[Claim] = []
        self.startup_notes: list[str] = []

    # ------------------------------------------------------------------ observers
    def add_observer(self, observer: CoreObserver) -> None:
        self._observers.append(observer)

    def _notify(self, event: str, *args: object) -> None:
        """Call observer method `event` on each observer."""
        for obs in self._observers:
            try:
                getattr(obs, event)(*args)
            except Exception:  # an observer bug must not break the state machine
                log.exception("observer %r failed", obs)

    def _changed(self, view: DeviceView) -> None:
        self._announced[view.device.name] = view
        self._notify("device_changed", view)

    def _changed_unless_busy(self, dev: RdmaDevice) -> None:
        # A claim or release in flight announces the device when it is done.
        if not self._lock(dev.name).locked():
            self._changed(self._view(dev))

    def _schedule_view_sync(self) -> None:
        """A device's state follows from its record, its netdev's presence and the claims,
        which change through different paths: after each burst, announce every view that
        differs from what was last announced, so observers never keep a stale state."""
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.ensure_future(self._sync_views())

    async def _sync_views(self) -> None:
        await asyncio.sleep(0)  # after the rest of the burst
        for view in self.devices():
            # A device mid-claim or mid-release would show its own netdev's trip between
            # netns as a passing state ("unavailable"): its operation announces the outcome,
            # and _operating_on syncs again when it ends.
            if self._lock(view.device.name).locked():
                continue
            if self._announced.get(view.device.name) != view:
                self._changed(view)

    def announce_startup(self) -> None:
        """Emit the Released(reconciled) of claims ended during start."""
        for claim in self._startup_releases:
            self._notify("released", claim, ReleaseReason.RECONCILED)
        self._startup_releases.clear()

    # ------------------------------------------------------------------ queries
    def devices(self) -> list[DeviceView]:
        by_device: dict[str, list[Claim]] = {}
        for claim in self._claims.values():
            by_device.setdefault(claim.device, []).append(claim)
        return [
            self._inv.view(d, by_device.get(d.name, []), self.netns_mode)
            for d in sorted(self._inv.devices.values(), key=lambda d: d.index)
        ]

    def device(self, name: str) -> DeviceView:
        dev = self._inv.devices.get(check_device_name(name))
        if dev is None:
            raise NoSuchDevice(f"no RDMA device {name!r}")
        return self._view(dev)

    def claims(self) -> list[Claim]:
        return sorted(self._claims.values(), key=lambda c: c.created_at_us)

    def get_claim(self, claim_id: str) -> Claim:
        claim = self._claims.get(claim_id)
        if claim is None:
            raise NoSuchClaim(f"no claim {claim_id!r}")
        return claim

    def _view(self, dev: RdmaDevice) -> DeviceView:
        mine = [c for c in self._claims.values() if c.device == dev.name]
        return self._inv.view(dev, mine, self.netns_mode)

    def _netdev_of(self, dev: RdmaDevice) -> Netdev:
        nd = self._inv.netdevs.get(dev.netdev_ifindex) or self._inv.netdev_by_name(dev.netdev)
        if nd is None:
            raise NotSupported(f"{dev.name} has no netdev in init_net")
        return nd

    def _lock(self, device: str) -> asyncio.Lock:
        return self._locks.setdefault(device, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def _operating_on(self, device: str) -> AsyncIterator[None]:
        """Hold `device` for one claim or release; then announce whatever its view became."""
        try:
            async with self._lock(device):
                yield
        finally:
            self._schedule_view_sync()

    # ------------------------------------------------------------------ start
    async def start(self) -> None:
        """Enumerate, load the state file, reconcile, then start consuming events.

        The caller starts the event sources first: events queue up meanwhile, so nothing
        falls between subscription and enumeration.
        """
        self.netns_mode = await self._rdma.netns_mode()
        for nd in await self._net.list_netdevs():
            self._inv.netdevs[nd.ifindex] = nd
        try:
            state = self._store.load()
        except CorruptState as exc:
            aside = self._store.move_aside()
            note = f"state file unreadable ({exc}); kept as {aside}, rebuilding from the kernel"
            log.error(note)
            self.startup_notes.append(note)
            state = State()
        self._claims = {c.id: c for c in state.claims}
        self._pending_restores = list(state.pending_restores)
        visible: set[str] | None = None
        if self.netns_mode != NetnsMode.UNAVAILABLE:  # else picked up when ib_core appears
            listed = await self._rdma.list_devices()
            visible = {d.name for d in listed}
        self._assume_pending_moved(visible)
        if visible is not None:
            self._inv.replace_devices(listed, keep=self._moved_devices())
        await self._reconcile()
        self._announced = {view.device.name: view for view in self.devices()}
        self._pump = asyncio.create_task(self._consume_events(), name="rdmad-events")

    async def close(self) -> None:
        pending = (self._pump, self._refresh_task, self._sync_task, *self._tasks)
        tasks = [t for t in pending if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _assume_pending_moved(self, visible: set[str] | None) -> None:
        """A PENDING claim is written once, before the first kernel step, so its moved flags
        say nothing about how far it got: a crash may have come after any step. Assume the
        netdev moved (the undo finds it home if it never left) and that the RDMA device moved
        if init_net no longer sees it (exclusive mode hides moved devices)."""
        for claim in self._claims.values():
            if claim.phase != ClaimPhase.PENDING:
                continue
            if claim.shared or claim.host is not None:
                claim.netdev_moved = True
            exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
            if not claim.shared and exclusive and visible is not None:
                claim.rdma_moved = claim.device not in visible

    async def _reconcile(self) -> None:
        live = await self._net.live_nsids()
        for claim in list(self._claims.values()):
            # The nsid says dead for sure; a live nsid may have been reused by another netns.
            alive = (claim.nsid < 0 or claim.nsid in live) and self._netns_reachable(claim)
            if claim.phase == ClaimPhase.PENDING:
                log.warning("claim %s was interrupted while being made: undoing it", claim.id)
                await self._give_back(claim, netns_alive=alive)
                self._drop(claim)
            elif claim.phase == ClaimPhase.RELEASING:
                log.warning("claim %s was interrupted while being released: finishing", claim.id)
                await self._give_back(claim, netns_alive=alive)
                self._drop(claim)
                self._startup_releases.append(claim)
            elif not alive:
                await self._give_back(claim, netns_alive=False)
                self._drop(claim)
                self._startup_releases.append(claim)
        await self._restore_pending()
        self._save()

    def _netns_reachable(self, claim: Claim) -> bool:
        target = self._resolver.reopen(claim.netns_inode, claim.netns_path)
        if target is None:
            return False
        target.close()
        return True

    def _moved_devices(self) -> set[str]:
        return {c.device for c in self._claims.values() if c.rdma_moved}

    # ------------------------------------------------------------------ claim
    async def claim(self, device: str, target: NetnsTarget, options: ClaimOptions) -> Claim:
        """Claim `device` for `target`; `target` is closed before this returns."""
        try:
            if self.netns_mode == NetnsMode.UNAVAILABLE:
                raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")
            if check_device_name(device) not in self._inv.devices:
                raise NoSuchDevice(f"no RDMA device {device!r}")
            async with self._operating_on(device):
                return await self._claim_locked(self._inv.devices[device], target, options)
        finally:
            target.close()

    def _check_claim(self, dev: RdmaDevice, target: NetnsTarget, opts: ClaimOptions) -> None:
        mine = [c for c in self._claims.values() if c.device == dev.name]
        exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
        if opts.shared:
            if exclusive:
                raise NotSupported(
                    f"{dev.name}: shared claims need the RDMA subsystem in shared mode; "
                    "it is in exclusive mode"
                )
            if any(not c.shared for c in mine):
                raise DeviceBusy(f"{dev.name} is claimed whole by claim {mine[0].id}")
            if any(c.netns_inode == target.inode for c in mine):
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
                    f"{dev.name}: moving only the RDMA device needs exclusive netns mode; "
                    "the subsystem is in shared mode (SetNetnsMode('exclusive'))"
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

    async def _claim_locked(
        self, dev: RdmaDevice, target: NetnsTarget, opts: ClaimOptions
    ) -> Claim:
        dev = await self._fresh(dev)
        self._check_claim(dev, target, opts)
        exclusive = self.netns_mode == NetnsMode.EXCLUSIVE
        claim_id = secrets.token_hex(8)
        # Read before the first await: events applied meanwhile must not change the parent.
        parent = self._netdev_of(dev).ifindex if opts.shared else 0
        moving = self._netdev_of(dev) if not opts.shared and opts.netdev else None
        host, nsid = await asyncio.gather(self._host_config(moving), self._net.nsid(target))
        default_ifname = DEFAULT_SHARED_IFNAME if opts.shared else (host.name if host else "")
        claim = Claim(
            id=claim_id,
            device=dev.name,
            netns_inode=target.inode,
            netns_path=target.path,
            nsid=nsid,
            ifname=opts.ifname or default_ifname,
            shared=opts.shared,
            owner=opts.owner,
            created_at_us=time.time_ns() // 1000,
            host=host,
            cdi_device=f"rdmad.io/rdma={claim_id}",
            chardev_kinds=opts.chardevs,
            phase=ClaimPhase.PENDING,
        )
        self._claims[claim_id] = claim
        try:
            self._save()
            self._step("pending-written")
            if not opts.shared and exclusive:
                await self._rdma.move(dev.index, target)
                claim.rdma_moved = True
                self._step("rdma-moved")
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
            self._step("netdev-placed")
            claim.chardevs = await self._rdma.chardevs(
                dev, opts.chardevs, target if claim.rdma_moved else None
            )
            claim.phase = ClaimPhase.ACTIVE
            self._save()
            self._step("active-written")
        except BaseException as exc:
            await self._undo_failed_claim(claim, target, exc)
            raise
        log.info("claimed %s into %s as claim %s", dev.name, claim.netns, claim.id)
        self._notify("claimed", claim)
        await self._reread_device(dev.name)  # its port's netdev left init_net
        self._changed(self._view(self._inv.devices.get(dev.name, dev)))
        return claim

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
        await self._reload_netdevs()
        await self._refresh()
        return self._inv.devices.get(dev.name, dev)

    async def _undo_failed_claim(
        self, claim: Claim, target: NetnsTarget, exc: BaseException
    ) -> None:
        """Put everything back as it was before a failed claim, then forget the claim."""
        if not isinstance(exc, RdmadError):
            log.error("claim of %s failed unexpectedly: %r", claim.device, exc)
        try:
            if claim.netdev_moved:
                await self._bring_netdev_home(claim)
            if claim.rdma_moved:
                await self._rdma.move_home(claim.device, target)
        except RdmadError as undo_exc:
            # Leave it PENDING on disk: the next start (or an operator) finishes the undo.
            log.error("could not undo claim %s: %s", claim.id, undo_exc)
            return
        self._claims.pop(claim.id, None)
        with contextlib.suppress(RdmadError):
            self._save()

    # ------------------------------------------------------------------ release
    async def release(self, claim_id: str, reason: ReleaseReason = ReleaseReason.REQUESTED) -> None:
        claim = self.get_claim(claim_id)
        async with self._operating_on(claim.device):
            if self._claims.get(claim_id) is not claim:
                raise NoSuchClaim(f"claim {claim_id!r} ended while waiting")
            claim.phase = ClaimPhase.RELEASING
            self._save()
            self._step("releasing-written")
            # By inode, not nsid: a dead netns's nsid may already name another one.
            await self._give_back(claim, netns_alive=self._netns_reachable(claim))
            self._drop(claim)
            self._save()
            self._step("released-written")
        self._finish_release(claim, reason)

    def _finish_release(self, claim: Claim, reason: ReleaseReason) -> None:
        log.info("released claim %s (%s): %s", claim.id, claim.device, reason.value)
        self._notify("released", claim, reason)
        dev = self._inv.devices.get(claim.device)
        if dev is not None:
            self._changed(self._view(dev))

    def _drop(self, claim: Claim) -> None:
        self._claims.pop(claim.id, None)

    async def _give_back(self, claim: Claim, *, netns_alive: bool) -> None:
        """Return what a claim took, wherever it is now. Idempotent: parts already home are
        just restored."""
        if claim.netdev_moved:
            if claim.shared:
                if netns_alive:
                    with contextlib.suppress(RdmadError):  # already gone with its parent
                        await self._net.delete(self._placement(claim))
            elif netns_alive:
                await self._bring_netdev_home(claim)
            else:
                await self._restore_returned(claim)
            self._step("netdev-returned")
        if claim.rdma_moved and netns_alive and not await self._rdma_home(claim.device):
            source = self._resolver.reopen(claim.netns_inode, claim.netns_path)
            if source is not None:
                try:
                    await self._rdma.move_home(claim.device, source)
                finally:
                    source.close()
        elif claim.rdma_moved:
            await self._await_rdma_return(claim)
        await self._reread_device(claim.device)

    async def _reread_device(self, name: str) -> None:
        """Re-read a device our own step changed, before announcing it (its events lag)."""
        try:
            if await self._refresh_devices({name}):
                return
        except Exception as exc:  # the claim or release itself is done: never fail it here
            log.warning("re-reading %s failed (%s): re-reading everything", name, exc)
        self._schedule_refresh()

    async def _await_rdma_return(self, claim: Claim) -> None:
        """The netns is dead: the kernel's rdma_dev_exit_net brings the device home by itself,
        shortly after RTM_DELNSID. Wait for it (the claim's lock keeps it in the inventory
        meanwhile), so the claim ends with the device available, not briefly "removed"."""
        if await self._rdma_home(claim.device):
            return
        waiter = self._device_waiters.setdefault(
            claim.device, asyncio.get_running_loop().create_future()
        )
        try:
            await asyncio.wait_for(asyncio.shield(waiter), RETURN_TIMEOUT_S)
        except TimeoutError:
            log.warning("%s has not come back from %s yet", claim.device, claim.netns)
        finally:
            self._device_waiters.pop(claim.device, None)

    async def _rdma_home(self, device: str) -> bool:
        """Whether init_net sees `device` (a release killed after its move home finishes)."""
        return device in {d.name for d in await self._rdma.list_devices()}

    async def _bring_netdev_home(self, claim: Claim) -> None:
        assert claim.host is not None or claim.shared
        if claim.shared:
            await self._net.delete(self._placement(claim))
            return
        assert claim.host is not None
        home = self._inv.netdevs.get(claim.host.ifindex)
        if home is not None:  # never left, or already back
            try:
                await self._net.restore(home.ifindex, claim.host)
                await self._reread_netdev(home.ifindex)
                return
            except RdmadError as exc:
                # The inventory lags: the RTM_DELLINK of our own move may still be queued.
                log.debug("%s is not home after all (%s): bringing it home", claim.host.name, exc)
        placement = Placement(claim.nsid, claim.ns_ifindex or claim.host.ifindex, claim.ifname)
        source = self._resolver.reopen(claim.netns_inode, claim.netns_path)
        try:
            self._netdev_is(await self._net.bring_home(placement, claim.host, source))
        finally:
            if source is not None:
                source.close()

    def _netdev_is(self, nd: Netdev) -> None:
        """Record what our own kernel step just did, ahead of its queued events: the release
        announces the device's view right away, and must not announce it without a netdev."""
        self._inv.netdevs[nd.ifindex] = nd
        if self._touched_links is not None:  # a dump in flight asks for it again
            self._touched_links.add(nd.ifindex)

    async def _reread_netdev(self, ifindex: int) -> None:
        nd = await self._net.get_netdev(ifindex)
        if nd is not None:
            self._netdev_is(nd)

    @staticmethod
    def _placement(claim: Claim) -> Placement:
        return Placement(claim.nsid, claim.ns_ifindex, claim.ifname)

    async def _restore_returned(self, claim: Claim) -> None:
        """The netns is dead: a physical netdev comes back by itself; wait, then restore it."""
        host = claim.host
        if host is None or host.kind:
            return  # virtual netdevs are destroyed with their netns
        if host.ifindex not in self._inv.netdevs:
            waiter = self._link_waiters.setdefault(
                host.ifindex, asyncio.get_running_loop().create_future()
            )
            try:
                await asyncio.wait_for(asyncio.shield(waiter), RETURN_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "%s (ifindex %d) has not come back from %s yet; will restore it when it does",
                    host.name,
                    host.ifindex,
                    claim.netns,
                )
                self._pending_restores.append(host)
                return
            finally:
                self._link_waiters.pop(host.ifindex, None)
        await self._net.restore(host.ifindex, host)
        await self._reread_netdev(host.ifindex)

    async def _restore_pending(self) -> None:
        for host in list(self._pending_restores):
            if host.ifindex in self._inv.netdevs:
                try:
                    await self._net.restore(host.ifindex, host)
                except RdmadError as exc:
                    log.error("could not restore %s: %s", host.name, exc)
                self._pending_restores.remove(host)

    # ------------------------------------------------------------------ mode
    async def set_netns_mode(self, mode: NetnsMode) -> None:
        if mode not in (NetnsMode.SHARED, NetnsMode.EXCLUSIVE):
            raise InvalidArgs(f"netns mode must be 'shared' or 'exclusive', not {mode.value!r}")
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            raise Unavailable("no RDMA subsystem is present (is ib_core loaded?)")
        if mode == self.netns_mode:
            return
        if self._claims:
            raise DeviceBusy(
                f"{len(self._claims)} claims are live; release them before changing the mode"
            )
        await self._rdma.set_netns_mode(mode)
        self._set_mode(mode)

    def _set_mode(self, mode: NetnsMode) -> None:
        if mode != self.netns_mode:
            self.netns_mode = mode
            log.info("RDMA netns mode is %s", mode.value)
            self._notify("mode_changed", mode)
            for view in self.devices():
                self._changed(view)

    # ------------------------------------------------------------------ events
    def handle(self, event: Event) -> None:
        """Queue a kernel event; the pump applies them in order."""
        self._events.put_nowait(event)

    async def _consume_events(self) -> None:
        while True:
            event = await self._events.get()
            try:
                await self._apply(event)
            except Exception:
                log.exception("handling %r failed", event)
            self._schedule_view_sync()

    async def _apply(self, event: Event) -> None:
        if isinstance(event, LinkChanged | LinkRemoved):
            await self._apply_link(event)
        elif isinstance(event, NetnsGone):
            for claim in [c for c in self._claims.values() if c.nsid == event.nsid]:
                self._spawn(self._end_claim(claim, ReleaseReason.NETNS_GONE))
        elif isinstance(event, RdmaChanged):
            self._schedule_refresh()
        elif isinstance(event, Resync):
            log.warning("%s events were lost (socket overrun): resynchronising", event.source)
            self._spawn(self._resync())

    async def _netdev_home(self, ifindex: int) -> bool:
        try:
            return await self._net.get_netdev(ifindex) is not None
        except RdmadError:
            return False

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restore_pending_and_save(self) -> None:
        await self._restore_pending()
        self._save()

    async def _end_claim(self, claim: Claim, reason: ReleaseReason) -> None:
        """End a claim the kernel ended for us (netns death, device removal)."""
        async with self._operating_on(claim.device):
            if self._claims.get(claim.id) is not claim:
                return  # released meanwhile
            if reason == ReleaseReason.NETNS_GONE and self._netns_reachable(claim):
                # A stale RTM_DELNSID: nsids are reused as soon as a netns dies, so an event
                # still queued about a dead netns can carry the nsid this live one got since.
                log.info(
                    "claim %s: nsid %d was dropped but %s is alive (nsid reused); "
                    "keeping the claim",
                    claim.id,
                    claim.nsid,
                    claim.netns,
                )
                return
            claim.phase = ClaimPhase.RELEASING
            self._save()
            alive = reason != ReleaseReason.NETNS_GONE
            try:
                await self._give_back(claim, netns_alive=alive)
            except RdmadError as exc:
                log.error("claim %s: could not give everything back: %s", claim.id, exc)
            self._drop(claim)
            self._save()
        self._finish_release(claim, reason)

    async def _reload_netdevs(self) -> None:
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

    async def _resync(self) -> None:
        await self._reload_netdevs()
        live = await self._net.live_nsids()
        for claim in list(self._claims.values()):
            if claim.phase == ClaimPhase.ACTIVE and claim.nsid >= 0 and claim.nsid not in live:
                self._spawn(self._end_claim(claim, ReleaseReason.NETNS_GONE))
        await self._restore_pending_and_save()
        await self._refresh()

    # ------------------------------------------------------------------ RDMA inventory
    async def _apply_link(self, event: LinkChanged | LinkRemoved) -> None:
        if isinstance(event, LinkChanged):
            ifindex, name = event.netdev.ifindex, event.netdev.name
        else:
            ifindex, name = event.ifindex, event.name
        if self._touched_links is not None:
            self._touched_links.add(ifindex)
        if isinstance(event, LinkChanged):
            nd = event.netdev
            self._inv.netdevs[nd.ifindex] = nd
            waiter = self._link_waiters.get(nd.ifindex)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if any(h.ifindex == nd.ifindex for h in self._pending_restores):
                self._spawn(self._restore_pending_and_save())
            self._schedule_refresh(self._devices_on(ifindex, name))
        else:
            concerned = self._devices_on(ifindex, name)
            # The event can be older than what we know: a claim re-read the kernel since, or
            # a release brought the netdev home before this RTM_DELLINK was read. Forgetting
            # an RDMA device's netdev on a stale event would leave it "unavailable" until its
            # next event, so ask the kernel first.
            if concerned == set() or not await self._netdev_home(ifindex):
                self._inv.netdevs.pop(ifindex, None)
            self._schedule_refresh(concerned)

    def _devices_on(self, ifindex: int, name: str) -> set[str] | None:
        """The RDMA devices a change to this netdev can concern; None if it could be any
        (a device without a netdev may be about to get this one)."""
        hit = self._inv.devices_on(ifindex, name)
        held = set()
        for claim in self._claims.values():
            if claim.host is not None:
                held.add(claim.device)  # its netdev is away on purpose
                if claim.host.ifindex == ifindex or claim.host.name == name:
                    hit.add(claim.device)
        if not hit and self._inv.unbound - held:
            return None
        return hit

    def _schedule_refresh(self, devices: set[str] | None = None) -> None:
        """Coalesce bursts of events into one re-read: of the named devices, or of the whole
        RDMA inventory when `devices` is None."""
        if devices is None:
            self._refresh_all = True
        elif not devices:
            return
        else:
            self._refresh_some |= devices
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.ensure_future(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while self._refresh_all or self._refresh_some:
            await asyncio.sleep(0)  # let the rest of a burst queue up first
            whole, some = self._refresh_all, self._refresh_some
            self._refresh_all, self._refresh_some = False, set()
            try:
                if whole or not await self._refresh_devices(some):
                    await self._refresh()
            except Exception:
                log.exception("re-reading the RDMA inventory failed")
            self._schedule_view_sync()

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
                    if name in self._moved_devices() or self._lock(name).locked():
                        continue  # in a claimant's netns, or moving right now
                    return False
                if fresh != old:
                    self._inv.put(fresh)
                    self._changed_unless_busy(fresh)
        return True

    async def _refresh(self) -> None:
        # One at a time: two overlapping re-reads could apply the older listing last.
        async with self._refresh_lock:
            await self._refresh_locked()

    async def _refresh_locked(self) -> None:
        if self.netns_mode == NetnsMode.UNAVAILABLE:
            mode = await self._rdma.netns_mode()
            if mode == NetnsMode.UNAVAILABLE:
                return
            self._set_mode(mode)
        busy = {name for name, lock in self._locks.items() if lock.locked()}
        listed = await self._rdma.list_devices()
        for dev in listed:
            waiter = self._device_waiters.get(dev.name)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        diff = self._inv.replace_devices(listed, keep=self._moved_devices() | busy)
        for dev in diff.removed:
            self._announced.pop(dev.name, None)
            self._notify("device_removed", self._view(dev))
            for claim in [c for c in self._claims.values() if c.device == dev.name]:
                self._spawn(self._end_claim(claim, ReleaseReason.DEVICE_REMOVED))
        for dev in diff.added:
            view = self._view(dev)
            self._announced[dev.name] = view
            self._notify("device_added", view)
        for dev in diff.changed:
            self._changed_unless_busy(dev)

    # ------------------------------------------------------------------ persistence
    def _save(self) -> None:
        self._store.save(State(list(self._claims.values()), list(self._pending_restores)))
