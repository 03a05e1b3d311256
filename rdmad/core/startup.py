"""A start: enumerate, load the state files, and reconcile what they say with the kernel.

Crash safety: a claim is written as PENDING before the kernel is touched and as RELEASING
before it is given back, so a daemon killed at any step finds out here what to undo or
finish. A device is always either free in init_net or held by a claim that is listed: one
whose give-back the kernel refuses here stays listed, NOT_RETURNED, and the daemon starts
anyway (a start that failed on it would be restarted into it, forever).
"""

from __future__ import annotations

import contextlib
import logging

from rdmad.core.giveback import GiveBack, netns_alive
from rdmad.core.logfields import MESSAGE_INTERRUPTED, log_claim_event
from rdmad.core.parts import Part, Parts
from rdmad.core.records import back_to_held
from rdmad.core.release import Release
from rdmad.core.retry import GiveBackRetry
from rdmad.errors import RdmadError
from rdmad.model import Claim, ClaimPhase, NetnsMode, RdmaDevice, ReleaseReason

log = logging.getLogger("rdmad.core.startup")

# What start does about a claim a crash interrupted, by the phase it was written in.
_INTERRUPTED = {
    ClaimPhase.PENDING: "made: undoing it",
    ClaimPhase.RELEASING: "released: finishing the release",
}


class Startup(Part):
    def __init__(
        self, parts: Parts, giveback: GiveBack, release: Release, retry: GiveBackRetry
    ) -> None:
        super().__init__(parts)
        self._giveback = giveback
        self._release = release
        self._retry = retry
        self.notes: list[str] = []

    async def start(self) -> None:
        """Enumerate, load the state files, reconcile. The caller starts the event sources
        first: events queue up meanwhile, so nothing falls between subscription and
        enumeration."""
        self._tracker.netns_mode = await self._rdma.netns_mode()
        for nd in await self._net.list_netdevs():
            self._inv.netdevs[nd.ifindex] = nd
        state = self._records.load()
        if state.set_aside:  # each logged with its reason by the store
            self.notes.append(
                f"state file unreadable: {len(state.set_aside)} set aside in "
                f"{state.set_aside[0].parent} (see the log)"
            )
        for claim in list(self._records.ending.values()):
            # The last run saved their end, and was killed before telling it.
            self._release.tell_end(claim, claim.end_reason or ReleaseReason.RECONCILED)
        listed: list[RdmaDevice] | None = None
        if self._tracker.netns_mode != NetnsMode.UNAVAILABLE:  # else when ib_core appears
            listed = await self._rdma.list_devices()
        visible = None if listed is None else {d.name for d in listed}
        self._assume_pending_moved(visible)
        if listed is not None and visible is not None:
            hidden = [
                c.attachment.moved_device
                for c in self._book.claims.values()
                if c.attachment
                and c.attachment.rdma_moved
                and c.attachment.moved_device
                and c.device not in visible
            ]
            self._inv.replace_devices(listed + hidden, keep=set())
        await self._reconcile()

    def _assume_pending_moved(self, visible: set[str] | None) -> None:
        """A PENDING claim is written once, before the first kernel step, so its moved flags
        say nothing about how far it got: a crash may have come after any step. Assume the
        netdev moved (the undo finds it home if it never left) and that the RDMA device moved
        if init_net no longer sees it (exclusive mode hides moved devices)."""
        exclusive = self._tracker.netns_mode == NetnsMode.EXCLUSIVE
        for claim in self._book.claims.values():
            if claim.phase != ClaimPhase.PENDING:
                continue
            at = claim.attached
            if claim.shared or at.host is not None:
                at.netdev_moved = True
            if not claim.shared and exclusive and visible is not None:
                at.rdma_moved = claim.device not in visible

    async def _reconcile(self) -> None:
        live = await self._net.live_nsids()
        for claim in list(self._book.claims.values()):
            if claim.phase != ClaimPhase.HELD:  # a held claim moved nothing: it waits
                await self._reconcile_one(claim, live)
        owed = [c for c in self._book.claims.values() if c.phase == ClaimPhase.NOT_RETURNED]
        self._retry.owe(owed)
        if owed:
            n = len(owed)
            self.notes.append(
                f"could not give back {n} claim{'s' if n > 1 else ''} at start "
                "(listed as not-returned; see the journal)"
            )
        await self._giveback.restore_pending()
        self._records.save()

    async def _reconcile_one(self, claim: Claim, live: set[int]) -> None:
        # The nsid says dead for sure; a live one may have been given to another netns. A
        # held claim's release (RELEASING, no attachment) has no netns at all.
        at = claim.attachment
        alive = (
            at is not None
            and (at.nsid < 0 or at.nsid in live)
            and await netns_alive(self._resolver, claim)
        )
        if claim.phase == ClaimPhase.ACTIVE and alive:
            return
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
            self._retry.keep(claim, exc)
            return
        if claim.hold is not None and claim.phase in (ClaimPhase.PENDING, ClaimPhase.ACTIVE):
            # An interrupted Attach, or the netns of an attached one died: held again, for
            # the pod's next ADD.
            await self._held_again(claim)
        elif announced:
            self._records.end(claim, ReleaseReason.RECONCILED)  # saved by start's full save
            self._release.tell_end(claim, ReleaseReason.RECONCILED)
        else:
            self._book.drop(claim)

    async def _held_again(self, claim: Claim) -> None:
        assert claim.hold is not None
        back_to_held(claim, self._book)
        dev = self._inv.devices.get(claim.device)
        # In init_net now (exclusive mode: uverbs made anew). Unread, they stay stale until
        # the pod's next Attach reads them.
        with contextlib.suppress(RdmadError):
            if dev is not None:
                claim.chardevs = await self._rdma.chardevs(dev, claim.hold.chardevs, None)
