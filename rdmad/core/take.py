"""The kernel steps of a claim (or a held claim's Attach), and their undo when one fails:
PENDING on disk before the first step, ACTIVE after the last; what a failed claim moved is
moved back before the caller hears of the failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from rdmad.core.backend import (
    NetnsTarget,
    PlacedNetdev,
    Placement,
)
from rdmad.core.giveback import GiveBack, log_not_returned, placement
from rdmad.core.logfields import (
    MESSAGE_CLAIM_FAILED,
    MESSAGE_GIDS_UNREADABLE,
    MESSAGE_NETDEV_UNREADABLE,
    log_claim_event,
)
from rdmad.core.parts import Part, Parts
from rdmad.core.release import Release
from rdmad.core.steps import step
from rdmad.errors import InvalidArgs, RdmadError
from rdmad.model import (
    TABLE_AUTO,
    Attachment,
    Claim,
    ClaimOptions,
    ClaimPhase,
    Gid,
    HostConfig,
    Netdev,
    NetnsMode,
    RdmaDevice,
    netns_label,
)

log = logging.getLogger("rdmad.core.take")


class Take(Part):
    def __init__(
        self, parts: Parts, giveback: GiveBack, release: Release, route_tables: range
    ) -> None:
        super().__init__(parts)
        self._giveback = giveback
        self._release = release
        self._route_tables = route_tables

    async def take(
        self, claim: Claim, dev: RdmaDevice, target: NetnsTarget, parent: int, opts: ClaimOptions
    ) -> None:
        """The kernel steps of `claim`, undone if one fails. `parent`: a shared claim's
        netdev, 0 for a whole one."""
        exclusive = self._tracker.netns_mode == NetnsMode.EXCLUSIVE
        at = claim.attached
        claim.phase = ClaimPhase.PENDING
        try:
            if opts.table is not None:  # booked before the save: the undo finds it
                at.route_table = await self._table_for(claim, target, opts.table)
            if not opts.shared and exclusive:
                at.moved_device = dev
            self._records.save(claim)
            step("pending-written", f"claim {claim.id}")
            if not opts.shared and exclusive:
                await self._rdma.move(dev.index, target)
                at.rdma_moved = True
                step("rdma-moved", f"claim {claim.id}")
            placed = await self._place(claim, target, parent, opts)
            if at.route_table:
                await self._net.add_policy_routing(
                    target, placed.ifindex, at.route_table, opts.addresses, opts.routes
                )
                step("routes-installed", f"claim {claim.id}")
            self._limits.apply(claim)
            claim.chardevs = await self._rdma.chardevs(
                dev, opts.chardevs, target if at.rdma_moved else None
            )
            at.gids = await self.claim_gids(claim, target, placed)
            # As placing it left it, nothing read back; none placed, none shown.
            netdev = placed.netdev or PlacedNetdev("", ())
            at.ns_mac, at.ns_addresses = netdev.mac, netdev.addresses
            claim.phase = ClaimPhase.ACTIVE
            self._records.save(claim)
            step("active-written", f"claim {claim.id}")
        except BaseException as exc:
            await self._undo(claim, target, exc)
            raise

    async def _place(
        self, claim: Claim, target: NetnsTarget, parent: int, opts: ClaimOptions
    ) -> Placement:
        """The claim's netdev into `target`: a shared claim's macvlan child, a whole claim's
        own netdev (if it moves one)."""
        at = claim.attached
        host = at.host
        if opts.shared:
            placed = await self._net.add_macvlan(
                parent, target, claim.ifname, opts.mtu, opts.addresses
            )
            at.netdev_moved = True
        elif host is not None:
            placed = await self._net.place(
                host.ifindex, target, claim.ifname, opts.mtu, opts.addresses, host
            )
            at.netdev_moved = True
        else:
            placed = Placement(at.nsid, 0, "")
        at.nsid, at.ns_ifindex = placed.nsid, placed.ifindex
        self._book.refile(claim)  # under the nsid the kernel reports it placed in
        step("netdev-placed", f"claim {claim.id}")
        return placed

    async def _undo(self, claim: Claim, target: NetnsTarget, exc: BaseException) -> None:
        """Put everything back as it was before a failed claim, then forget the claim."""
        if not isinstance(exc, RdmadError):  # an RdmadError is logged by Core.claim
            log_claim_event(
                log,
                MESSAGE_CLAIM_FAILED,
                claim,
                f"claim {claim.id} of {claim.device} failed unexpectedly: {exc!r}",
                level=logging.ERROR,
            )
        at = claim.attached
        try:
            self._limits.lift(claim)
            if at.route_table:  # free when booked: whatever it holds now is this claim's
                await self._net.remove_policy_routing(target, at.route_table)
            if at.netdev_moved:
                await self._giveback.bring_netdev_home(claim)
            if at.rdma_moved:
                await self._rdma.move_home(claim.device, target)
        except RdmadError as undo_exc:
            # Left PENDING on disk: the next start (or an operator) finishes the undo.
            log_not_returned(claim, undo_exc, "the claim failed; the next start undoes it")
            return
        rest = None
        if claim.hold is not None:
            rest = self._release.leave_netns(claim)  # a failed Attach: still held for the pod
        else:
            self._book.drop(claim)
        with contextlib.suppress(RdmadError):
            self._records.save(claim)
        if rest is not None:
            self._observers.left_netns(claim, rest)
        # Events applied meanwhile re-read the device without its netdev: read it again
        # before the lock goes, or the failed claim would show as a passing "unavailable".
        await self._tracker.reread_device(claim.device)

    async def _table_for(self, claim: Claim, target: NetnsTarget, asked: int) -> int:
        """The routing table `claim` takes in `target`: `asked`, or with TABLE_AUTO the
        lowest of the configured range that no claim of that netns has and that holds no
        route and no rule there. Tables are per netns: other pods' do not count."""
        where = netns_label(target.inode)
        if asked != TABLE_AUTO:
            self._refuse_taken(claim, target, asked)
            free = await self._net.free_table(target, (asked,))
            self._refuse_taken(claim, target, asked)  # booked while the kernel was asked
            if not free:
                raise InvalidArgs(f"routing table {asked} of {where} holds routes or rules already")
            return asked
        while True:
            # Asked again after each await: a claim of this netns booked one meanwhile. The
            # book files a claim in its netns as soon as it has one (refile), an Attach's too.
            taken = self._tables_taken(claim, target)
            free = await self._net.free_table(
                target, (t for t in self._route_tables if t not in taken)
            )
            if not free:
                span = f"{self._route_tables.start}-{self._route_tables.stop - 1}"
                raise InvalidArgs(f"no free routing table in {span} (route_tables) in {where}")
            if free not in self._tables_taken(claim, target):
                return free

    def _tables_taken(self, claim: Claim, target: NetnsTarget) -> dict[int, Claim]:
        """The tables the other claims of `target` have booked, and which claim has each."""
        return {
            c.attached.route_table: c
            for c in self._book.in_netns(target.inode)
            if c.attached.route_table and c is not claim
        }

    def _refuse_taken(self, claim: Claim, target: NetnsTarget, table: int) -> None:
        other = self._tables_taken(claim, target).get(table)
        if other is not None:
            where = netns_label(target.inode)
            raise InvalidArgs(f"routing table {table} of {where} is taken by claim {other.id}")

    async def reread_gids(self, claim: Claim) -> None:
        """The addresses in a claim's netns changed: read its GIDs and its netdev's MAC
        and addresses again, and tell observers (the CDI spec, the bus) when they differ."""
        async with self._records.on_record(claim) as live:
            if not live or claim.phase != ClaimPhase.ACTIVE:
                return
            at = claim.attached
            target = self._resolver.reopen(at.netns_inode, at.netns_path)
            if target is None:
                return  # dying: NetnsGone ends the claim
            placed = placement(claim)
            try:
                gids = await self.claim_gids(claim, target, placed)
            finally:
                target.close()
            netdev = await self._read_placed(claim, placed)
            if (gids, netdev) == (at.gids, (at.ns_mac, at.ns_addresses)):
                return
            at.gids = gids
            at.ns_mac, at.ns_addresses = netdev
            self._records.save(claim)
        self._observers.claim_changed(claim)

    async def _read_placed(self, claim: Claim, placed: Placement) -> tuple[str, tuple[str, ...]]:
        """The MAC and addresses of the claim's netdev in its netns, ("", ()) without one.
        Like its GIDs, a hint: a failed read costs the user the hint, not the device."""
        if not placed.ifindex:
            return "", ()
        try:
            netdev = await self._net.read_placed(placed)
        except RdmadError as exc:
            log_claim_event(
                log,
                MESSAGE_NETDEV_UNREADABLE,
                claim,
                f"claim {claim.id}: cannot read {placed.ifname} in its netns: {exc}",
                level=logging.WARNING,
            )
            return "", ()
        return netdev.mac, netdev.addresses

    async def claim_gids(
        self, claim: Claim, target: NetnsTarget, placed: Placement
    ) -> tuple[Gid, ...]:
        """The GID entries a claim's user picks from: a shared claim's are its child's, a
        whole claim's are the device's. Without them the claim still works: a failed read
        costs the user the hint, not the device."""
        inside = target if claim.shared or claim.attached.rdma_moved else None
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

    async def where(self, moving: Netdev | None, target: NetnsTarget) -> Attachment:
        """What a claim records of `target` before its first step: the netns, its nsid and
        cookie, and the host settings of the netdev it moves there (`moving`), if any."""
        host, nsid, cookie = await asyncio.gather(
            self._host_config(moving), self._net.nsid(target), self._resolver.cookie(target)
        )
        return Attachment(target.inode, target.path, nsid, netns_cookie=cookie, host=host)

    async def _host_config(self, netdev: Netdev | None) -> HostConfig | None:
        """What to restore on release, for a claim that moves the device's netdev."""
        if netdev is None:
            return None
        return replace(await self._net.host_config(netdev.ifindex), kind=netdev.kind)
